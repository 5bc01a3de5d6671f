"""What the broker watchers share: their client check, message bodies, dedup keys, secrets.

Each broker watcher imports its client library (redis, nats-py, aio-pika, paho-mqtt) only inside
``run()``, so ``import watchkeeper.watchers`` works without any extra installed; constructing a
watcher whose extra is missing fails at once with :func:`require_client`'s error, which names
the extra to install.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from watchkeeper.triggerer import BaseEventTrigger, TriggererError

from ._sql import redact_dsn

__all__ = [
    "BrokerSourceError",
    "Retries",
    "content_hash",
    "decode_body",
    "make_dedup_key",
    "receive_batch",
    "reconnect_delay",
    "redact_url",
    "require_client",
    "retry_delay",
    "scrub",
    "url_secrets",
]

_MAX_PART = 200
"""Message identities longer than this (in UTF-8 bytes) are hashed in the dedup key."""
_UNSAFE = re.compile("[\x00-\x1f\x7f]")


class BrokerSourceError(TriggererError, ConnectionError):
    """Raised when a broker watcher cannot reach its broker, or the broker refuses it.

    The message names the watcher, what it was doing and the client's error, with any password
    of its URL replaced by ``***``; the client's own exception is chained as ``__cause__``.
    """

    def __init__(self, owner: str, action: str, cause: BaseException, secrets: Iterable[str]):
        super().__init__(
            f"{owner}: {action} failed: {type(cause).__name__}: {scrub(str(cause), secrets)}"
        )
        self.owner = owner
        self.action = action


def require_client(owner: str, module: str, extra: str) -> None:
    """Raise an ``ImportError`` naming the extra to install when ``module`` is missing."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"{owner} needs the {module!r} package: install the {extra!r} extra "
            f"(pip install 'watchkeeper-watchers[{extra}]')"
        )


def redact_url(url: str) -> str:
    """``url`` without secrets, by the one rule of every URL watchkeeper prints (see
    :func:`~watchkeeper.store.protocols.redact_dsn`): a password, a bare NATS token
    (``nats://TOKEN@host``) and credential query parameters become ``***``."""
    return redact_dsn(url)


def url_secrets(*urls: str) -> list[str]:
    """The secrets in ``urls`` (passwords, bare tokens, credential query parameters), to
    :func:`scrub` from a client's error texts, which may quote them decoded."""
    found: list[str] = []
    for url in urls:
        try:
            parts = urlsplit(url)
        except ValueError:
            continue
        if parts.password:
            found += [parts.password, unquote(parts.password)]
        elif parts.username and redact_dsn(url) != url:
            found += [parts.username, unquote(parts.username)]
        masked = dict(parse_qsl(urlsplit(redact_dsn(url)).query, keep_blank_values=True))
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if value and masked.get(name) != value:
                found.append(value)
    return found


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_body(data: bytes) -> Any:
    """A message body as JSON: the value it encodes when it is UTF-8 JSON, else its UTF-8 text,
    else ``{"base64": "<the bytes in base64>"}``. NaN and Infinity count as text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        import base64

        return {"base64": base64.b64encode(data).decode("ascii")}
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return text


def make_dedup_key(watcher_name: str, *parts: str) -> str:
    """``<watcher name>:<part>:<part>…``: the key of one source item, for this watcher only.

    The watcher's name comes first, so two watchers of one asset never suppress each other's
    events. A part that is long or holds control characters (a publisher's message id can be
    anything) is replaced by ``sha256:<hex>`` of it.
    """
    safe = []
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > _MAX_PART or _UNSAFE.search(part):
            digest = hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()
            part = f"sha256:{digest}"
        safe.append(part)
    name = watcher_name
    if len(name.encode("utf-8", "surrogatepass")) > _MAX_PART:
        name = "sha256:" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return ":".join([name, *safe])


def content_hash(*chunks: bytes) -> str:
    """``sha256:<hex>`` over ``chunks``, each length-prefixed so their boundaries count."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(len(chunk).to_bytes(8, "big"))
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def reconnect_delay(attempt: int, initial: float = 0.5, cap: float = 10.0) -> float:
    """The delay before reconnect ``attempt`` (1-based): doubling from ``initial`` up to
    ``cap``, give or take a quarter, so watchers of one broker do not reconnect in step."""
    base = min(cap, initial * 2.0 ** min(max(attempt - 1, 0), 32))
    return base * random.uniform(0.75, 1.25)


class _Warns(Protocol):
    def warning(self, event: str, /, **fields: Any) -> Any: ...


def retry_delay(
    trigger: BaseEventTrigger,
    log: _Warns,
    event: str,
    reason: str,
    attempt: int,
    /,
    *,
    cap: float = 10.0,
    **fields: Any,
) -> float:
    """Say that the source of watcher ``trigger`` failed and will be tried again, and return
    how long to wait first (:func:`reconnect_delay` of ``attempt``, up to ``cap``).

    ``reason`` becomes the watcher's source trouble (its status ``backing_off``) and is logged
    as ``event`` on the watcher's own ``log`` with ``attempt``, ``delay`` and ``fields``: one
    wording for every watcher that reconnects, on the page and in the log. The caller sleeps,
    once it has closed what the failed attempt opened.
    """
    delay = reconnect_delay(attempt, cap=cap)
    trigger.report_source(reason)
    log.warning(event, **fields, reason=reason, attempt=attempt, delay=round(delay, 3))
    return delay


class Retries:
    """The failures in a row of a watcher that retries its source for as long as it takes:
    each one reported and waited out (:func:`retry_delay`), the trouble cleared once the
    source answers again."""

    def __init__(
        self, trigger: BaseEventTrigger, log: _Warns, event: str, *, cap: float, **fields: Any
    ) -> None:
        self.trigger, self.log, self.event = trigger, log, event
        self.cap, self.fields = cap, fields
        self.failures = 0

    async def failed(self, reason: str) -> None:
        """Count a failure, report and log it, and sleep before the next attempt."""
        self.failures += 1
        delay = retry_delay(
            self.trigger, self.log, self.event, reason, self.failures, cap=self.cap, **self.fields
        )
        await anyio.sleep(delay)

    def answered(self) -> None:
        """The source answered: after failures, its trouble is cleared and the count restarts."""
        if self.failures:
            self.failures = 0
            self.trigger.report_source(None)


T = TypeVar("T")


async def receive_batch(receive: MemoryObjectReceiveStream[T], size: int, linger: float) -> list[T]:
    """Up to ``size`` items of ``receive``: the first one awaited, then those already waiting,
    then those arriving within ``linger`` seconds of the first.

    Raises ``EndOfStream`` only when no item came at all; a stream closed after the first item
    ends the batch (the next call raises it).
    """
    items = [await receive.receive()]
    deadline = anyio.current_time() + linger
    while len(items) < size:
        try:
            items.append(receive.receive_nowait())
            continue
        except anyio.WouldBlock:
            pass
        except anyio.EndOfStream:
            break
        remaining = deadline - anyio.current_time()
        if remaining <= 0:
            break
        with anyio.move_on_after(remaining):
            try:
                items.append(await receive.receive())
            except anyio.EndOfStream:
                break
            continue
        break
    return items
