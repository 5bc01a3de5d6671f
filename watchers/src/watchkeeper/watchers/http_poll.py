"""``HttpPollWatcher``: the items of a JSON endpoint, polled politely, each emitted once.

Each poll is one GET (httpx, the ``http`` extra). The watcher is polite to the server and to
itself:

- **Conditional requests.** The ``ETag`` (strong or weak, ``W/"…"``, sent back as it came) and
  ``Last-Modified`` of the last response go out as ``If-None-Match``/``If-Modified-Since``; a
  ``304 Not Modified`` is "nothing new". A server that ignores them answers ``200`` with the
  same body: the SHA-256 of the body, kept with them, recognises it (and covers a
  ``Last-Modified`` that only has second resolution).
- **Backoff.** ``429``, ``408``, ``5xx``, timeouts and refused connections are retried after
  ``backoff`` seconds, doubling up to ``max_backoff``, or after what ``Retry-After`` asks (in
  seconds or as an HTTP date; at most ``max_backoff``). Past ``retries`` failures in a row
  (``None``: never) the run fails with :class:`HttpSourceError`. Any other status (``401``,
  ``404``, …) fails it at once.
- **Cursors.** For pagination and incremental reads the next cursor is taken from each response
  (a JSON path, or a function) and sent as the query parameter ``cursor_param``; a cursor that
  is a URL (``https://…`` or ``/path?…``) is requested as it is. Pages follow each other at
  once while they bring items; a response without a cursor keeps the last one.

Each response's items are committed as one :class:`~watchkeeper.triggerer.TriggerEventBatch`
with the position after them, so the watcher resumes exactly there after a crash.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import anyio
import anyio.to_thread
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggererError, TriggerEvent, TriggerEventBatch

from ._common import (
    SerializedEquality,
    check_non_negative,
    check_positive,
    check_positive_int,
    check_str,
    import_off_loop,
    sleep_jittered,
    sleep_spread,
)
from ._http_parts import (
    MISSING,
    CursorFunction,
    JsonPath,
    check_headers,
    function_path,
    import_function,
    json_path,
    retry_after,
    without_credentials,
)
from ._sql import redact_dsn

__all__ = ["HttpPollWatcher", "HttpSourceError", "JsonPath", "retry_after"]

log = get_logger(__name__)

_RETRIED: Final = frozenset({408, 425, 429})  # and every 5xx
_VALIDATORS: Final = ("etag", "last_modified", "sha256")


class HttpSourceError(TriggererError, RuntimeError):
    """Raised when the endpoint cannot be read: a status that is not retried (a 401, a 404),
    a body that is not JSON or lacks what the watcher's paths name, or more transient failures
    in a row than ``retries``. The URL in the message has its password hidden."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f"{url}: {problem}")
        self.url = url


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class HttpPollWatcher(SerializedEquality):
    """Polls ``url`` for JSON and yields its new items, each once, as events.

    What an event is: with ``items`` (a JSON path to a list in the response, ``""`` for a
    response that is a list), one event per element, its payload the element; without it, one
    event per changed response, its payload the whole body. ``item_key`` (a JSON path inside
    an element) gives each item an identity: its ``dedup_key`` is ``<name>:<value>``, so an item
    read twice (a last page polled again, a snapshot re-read) is committed once.

    Where to read next: ``cursor`` is a JSON path to the next cursor in each response, or a
    module-level function ``next_cursor(body, headers)`` (``cursor_function`` is its import
    path, ``"package.module:function"``, which is what ``serialize()`` keeps). The cursor is
    sent as the query parameter ``cursor_param``, or requested itself when it is a URL. The
    first request carries no cursor.

    ``headers`` are sent with every request; ``env_headers`` maps header names to environment
    variables read when ``run()`` starts, so a token stays out of ``serialize()``. ``repr()``,
    logs and errors show neither header values nor a password in the URL. ``poll_interval``
    seconds (jittered) separate polls once caught up; ``timeout`` bounds connecting and each
    read or write of a request, so a server that goes silent fails the request like a timeout;
    see the module docstring for ``backoff``, ``max_backoff`` and ``retries``. While requests
    fail and are retried the watcher's status is ``backing_off``, the URL (secrets masked) and
    the failure as its reason; the next answer makes it ``running`` again.

    State key (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name), written
    with every batch of events:

    - ``<name>.cursor``: ``{"cursor", "etag", "last_modified", "sha256"}``: the cursor the
      next request sends (``null``: none yet) and, for its conditional request, the
      validators and body hash of the last response read at that cursor (``null`` once the
      cursor moved on).

    How to rewind it: stop the watcher, set ``<name>.cursor`` to ``{"cursor": C}`` (``C`` the
    cursor to read from again, ``null`` for the start) or delete it, start it again. Items
    read again are emitted again, unless ``item_key`` recognises them (for as long as their
    events are kept, ``[events] dedup_retention_days``).
    """

    def __init__(
        self,
        url: str,
        *,
        items: str | None = None,
        item_key: str | None = None,
        cursor: str | CursorFunction | None = None,
        cursor_function: str | None = None,
        cursor_param: str = "cursor",
        headers: Mapping[str, str] | None = None,
        env_headers: Mapping[str, str] | None = None,
        poll_interval: float = 60.0,
        timeout: float = 10.0,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        retries: int | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.url = check_str(owner, "url", url)
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"{owner}: url must start with http:// or https://, got {redact_dsn(url)!r}"
            )
        # The credentials of the URL travel as the client's auth, never in a URL (or a local
        # variable a logged traceback would show): requests go to the URL without them.
        parts = urlsplit(url)
        self._credentials = (unquote(parts.username or ""), unquote(parts.password or ""))
        self._public_url = without_credentials(url)
        self._items = json_path(owner, "items", items)
        self._item_key = json_path(owner, "item_key", item_key)
        if self._item_key is not None and self._items is None:
            raise ValueError(f"{owner}: item_key needs items (the list whose elements it keys)")
        self._cursor_path: JsonPath | None = None
        self._cursor_function: CursorFunction | None = None
        self.cursor_function: str | None = None
        if callable(cursor):
            if cursor_function is not None:
                raise ValueError(f"{owner}: give cursor or cursor_function, not both")
            self.cursor_function = function_path(owner, cursor)
            self._cursor_function = cursor
        elif cursor_function is not None:
            if cursor is not None:
                raise ValueError(f"{owner}: give cursor or cursor_function, not both")
            self._cursor_function = import_function(owner, cursor_function)
            self.cursor_function = cursor_function
        else:
            self._cursor_path = json_path(owner, "cursor", cursor)
        self.cursor_param = check_str(owner, "cursor_param", cursor_param)
        self.headers = check_headers(owner, "headers", headers)
        self.env_headers = check_headers(owner, "env_headers", env_headers)
        check_positive(owner, "poll_interval", poll_interval)
        check_positive(owner, "timeout", timeout)
        check_non_negative(owner, "backoff", backoff)
        check_non_negative(owner, "max_backoff", max_backoff)
        if retries is not None:
            check_positive_int(owner, "retries", retries)
        self.poll_interval, self.timeout = poll_interval, timeout
        self.backoff, self.max_backoff, self.retries = backoff, max_backoff, retries

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "url": self.url,
            "items": None if self._items is None else self._items.text,
            "item_key": None if self._item_key is None else self._item_key.text,
            "cursor": None if self._cursor_path is None else self._cursor_path.text,
            "cursor_function": self.cursor_function,
            "cursor_param": self.cursor_param,
            "headers": dict(self.headers),
            "env_headers": dict(self.env_headers),
            "poll_interval": self.poll_interval,
            "timeout": self.timeout,
            "backoff": self.backoff,
            "max_backoff": self.max_backoff,
            "retries": self.retries,
        }

    def __repr__(self) -> str:
        cursor = self.cursor_function or (self._cursor_path.text if self._cursor_path else None)
        return (
            f"<{type(self).__name__} url={redact_dsn(self.url)!r} "
            f"headers={sorted({*self.headers, *self.env_headers})!r} cursor={cursor!r}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        await import_off_loop("httpx")
        import httpx

        key = f"{self.watcher_name}.cursor"
        cursor, seen = await self._load(key)
        await sleep_spread(self.poll_interval)
        # Header values and credentials go straight into the client: no local of this frame
        # holds a secret for a traceback (rendered with locals) to show. The client is made in
        # a worker thread: making the first one reads the CA bundle and imports the transport.
        client = await anyio.to_thread.run_sync(
            functools.partial(
                httpx.AsyncClient,
                headers=self._request_headers(),
                auth=httpx.BasicAuth(*self._credentials) if any(self._credentials) else None,
                timeout=self.timeout,
                follow_redirects=True,
            )
        )
        async with client:
            while True:
                body, got, reply_headers = await self._get(client, cursor, seen)
                if body is MISSING:  # 304, or the same body again
                    await sleep_jittered(self.poll_interval)
                    continue
                events = self._events(body)
                following = self._next_cursor(body, reply_headers)
                moved = following is not None and following != cursor
                if moved:
                    cursor, seen = following, None  # validators belong to the old request
                else:
                    seen = got
                if events:
                    position = {"cursor": cursor, **(seen or dict.fromkeys(_VALIDATORS))}
                    yield TriggerEventBatch(events, state={key: position})
                if not (moved and events):
                    await sleep_jittered(self.poll_interval)

    async def _load(self, key: str) -> tuple[Any, dict[str, Any] | None]:
        """The committed cursor and response validators (of the first asset that has them)."""
        store = self.asset_state_store
        for asset in store:
            position = await store[asset].aget(key)
            if position is None:
                continue
            if not isinstance(position, dict):
                raise TypeError(
                    f"{type(self).__name__}: the asset state {key!r} is not a position "
                    f'({position!r}); set it to {{"cursor": ...}} or delete it'
                )
            seen = {name: position.get(name) for name in _VALIDATORS}
            return position.get("cursor"), (seen if any(seen.values()) else None)
        return None, None

    def _request_headers(self) -> dict[str, str]:
        """``Accept``, ``headers`` and ``env_headers`` (their variables read now)."""
        for header, variable in self.env_headers.items():
            if variable not in os.environ:
                raise HttpSourceError(
                    redact_dsn(self.url),
                    f"header {header!r} comes from the environment variable {variable!r}, "
                    "which is not set",
                )
        return {
            "Accept": "application/json",
            **self.headers,
            **{header: os.environ[variable] for header, variable in self.env_headers.items()},
        }

    def _request_url(self, cursor: Any) -> str:
        """The URL to GET: ``url`` (its own query kept), with the cursor added or followed."""
        import httpx

        if cursor is None:
            return self._public_url
        base = httpx.URL(self._public_url)
        if isinstance(cursor, str) and cursor.startswith(("http://", "https://", "/")):
            return without_credentials(str(base.join(cursor)))  # ours go as the client's auth
        return str(base.copy_merge_params({self.cursor_param: str(cursor)}))

    async def _get(
        self, client: Any, cursor: Any, seen: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any], Mapping[str, str]]:
        """One GET, retried while transient: ``(body, validators, headers)``; the body is
        ``MISSING`` when nothing changed."""
        import httpx

        url = self._request_url(cursor)
        shown = redact_dsn(url)
        conditional: dict[str, str] = {}
        if seen:
            if seen.get("etag"):
                conditional["If-None-Match"] = seen["etag"]
            if seen.get("last_modified"):
                conditional["If-Modified-Since"] = seen["last_modified"]
        failures = 0
        while True:
            wait: float | None = None
            try:
                response = await client.get(url, headers=conditional)
            except httpx.TimeoutException as exc:
                problem = f"no answer within {self.timeout} s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status == 304 or 200 <= status < 300:
                    self.report_source(None)  # it answers
                if status == 304:
                    return MISSING, dict(seen or {}), response.headers
                if 200 <= status < 300:
                    return self._read(response, shown, seen)
                if status not in _RETRIED and status < 500:
                    raise HttpSourceError(shown, f"HTTP {status} {response.reason_phrase}")
                problem = f"HTTP {status} {response.reason_phrase}"
                wait = retry_after(response.headers.get("Retry-After"))
            failures += 1
            self.report_source(f"{shown}: {problem}, {failures} times in a row")
            if self.retries is not None and failures > self.retries:
                raise HttpSourceError(shown, f"{problem}, {failures} times in a row")
            delay = self.backoff * 2 ** min(failures - 1, 32)
            if wait is not None:
                delay = max(delay, wait)
            delay = min(delay, self.max_backoff)
            log.warning("http_retry", url=shown, problem=problem, failures=failures, delay=delay)
            await anyio.sleep(delay)

    def _read(
        self, response: Any, shown: str, seen: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any], Mapping[str, str]]:
        content: bytes = response.content
        digest = hashlib.sha256(content).hexdigest()
        got = {
            "etag": response.headers.get("ETag"),
            "last_modified": response.headers.get("Last-Modified"),
            "sha256": digest,
        }
        if seen is not None and seen.get("sha256") == digest:
            return MISSING, got, response.headers  # the server ignored the conditional request
        try:
            body = json.loads(content, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise HttpSourceError(shown, f"the response is not JSON: {exc}") from exc
        return body, got, response.headers

    def _events(self, body: Any) -> list[TriggerEvent]:
        if self._items is None:
            return [TriggerEvent(body)]
        found = self._items.find(body)
        if found is MISSING or found is None:
            return []
        if not isinstance(found, list):
            raise HttpSourceError(
                redact_dsn(self.url),
                f"items {self._items.text!r} is a {type(found).__name__}, not a list",
            )
        key_path = self._item_key
        if key_path is None:
            return [TriggerEvent(item) for item in found]
        events: list[TriggerEvent] = []
        for item in found:
            key = key_path.find(item)
            if key is MISSING or key is None or isinstance(key, dict | list):
                raise HttpSourceError(
                    redact_dsn(self.url),
                    f"an item has no value at item_key {key_path.text!r}: {str(item)[:80]}",
                )
            events.append(TriggerEvent(item, dedup_key=f"{self.watcher_name}:{key}"))
        return events

    def _next_cursor(self, body: Any, headers: Mapping[str, str]) -> Any:
        if self._cursor_function is not None:
            following = self._cursor_function(body, headers)
        elif self._cursor_path is not None:
            following = self._cursor_path.find(body)
            if following is MISSING:
                following = None
        else:
            return None
        if following is not None and (
            isinstance(following, bool)
            or not isinstance(following, str | int | float)
            or (isinstance(following, float) and not math.isfinite(following))
        ):
            raise HttpSourceError(
                redact_dsn(self.url), f"the next cursor must be text or a number, got {following!r}"
            )
        return following
