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
from pydantic import Field, ValidationInfo, field_validator, model_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggererError, TriggerEvent, TriggerEventBatch

from ._common import import_off_loop, sleep_jittered, sleep_spread
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
from ._params import (
    Count,
    ReadyMadeWatcher,
    Seconds,
    SecondsOrZero,
    Text,
    WatcherParams,
    owner,
)
from ._sql import redact_dsn

__all__ = ["HttpPollParams", "HttpPollWatcher", "HttpSourceError", "JsonPath", "retry_after"]

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


class HttpPollParams(WatcherParams):
    """The parameters of :class:`HttpPollWatcher`."""

    url: Text
    """The endpoint (``http://`` or ``https://``); a ``user:password@`` in it is sent as basic
    auth and never shown."""
    items: str | None = None
    """A JSON path to the list of items in each response (``""``: the response is the list);
    ``None``: each changed response is one event."""
    item_key: str | None = None
    """A JSON path inside an item to its identity: its ``dedup_key`` is ``<name>:<value>``, so
    an item read twice is committed once. Needs ``items``."""
    cursor: str | None = None
    """A JSON path to the next cursor in each response; a module-level function
    ``next_cursor(body, headers)`` may be given instead (kept as its ``cursor_function``)."""
    cursor_function: str | None = None
    """The import path ``"package.module:function"`` of the function that finds the next
    cursor; not with ``cursor``."""
    cursor_param: Text = "cursor"
    """The query parameter the cursor is sent as (a cursor that is a URL is requested as
    it is)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Headers sent with every request (their values never shown)."""
    env_headers: dict[str, str] = Field(default_factory=dict)
    """Header names mapped to environment variables read when ``run()`` starts, so a token
    stays out of ``serialize()``."""
    poll_interval: Seconds = 60.0
    """Seconds between two polls once caught up, with jitter."""
    timeout: Seconds = 10.0
    """Seconds that connecting and each read or write of a request may take."""
    backoff: SecondsOrZero = 1.0
    """The first wait after a transient failure (429, 408, 5xx, a timeout), doubling."""
    max_backoff: SecondsOrZero = 300.0
    """The longest wait between retries, ``Retry-After`` included."""
    retries: Count | None = None
    """Transient failures in a row after which the run fails; ``None``: never."""

    @model_validator(mode="before")
    @classmethod
    def _one_cursor(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        cursor, function = data.get("cursor"), data.get("cursor_function")
        if cursor is not None and function is not None:
            raise ValueError("give cursor or cursor_function, not both")
        if callable(cursor):
            return {**data, "cursor": None, "cursor_function": function_path(owner(info), cursor)}
        return data

    @field_validator("items", "item_key", "cursor", mode="before")
    @classmethod
    def _json_path(cls, value: object, info: ValidationInfo) -> object:
        json_path(owner(info), str(info.field_name), value)
        return value

    @field_validator("cursor_function", mode="before")
    @classmethod
    def _importable(cls, value: object, info: ValidationInfo) -> object:
        if value is not None:
            import_function(owner(info), value)
        return value

    @field_validator("headers", "env_headers", mode="before")
    @classmethod
    def _headers(cls, value: object, info: ValidationInfo) -> object:
        return check_headers(owner(info), str(info.field_name), value)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {redact_dsn(value)!r}")
        return value

    @model_validator(mode="after")
    def _key_needs_items(self) -> HttpPollParams:
        if self.item_key is not None and self.items is None:
            raise ValueError("item_key needs items (the list whose elements it keys)")
        return self


class HttpPollWatcher(ReadyMadeWatcher[HttpPollParams]):
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

    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, a JSON path or import path that does not
        parse or import, or ``cursor`` with ``cursor_function``, naming it.
    """

    params_model = HttpPollParams
    positional = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p, who = self.params, type(self).__name__
        # The credentials of the URL travel as the client's auth, never in a URL (or a local
        # variable a logged traceback would show): requests go to the URL without them.
        parts = urlsplit(p.url)
        self._credentials = (unquote(parts.username or ""), unquote(parts.password or ""))
        self._public_url = without_credentials(p.url)
        self._items = json_path(who, "items", p.items)
        self._item_key = json_path(who, "item_key", p.item_key)
        self._cursor_path = json_path(who, "cursor", p.cursor)
        self._cursor_function: CursorFunction | None = None
        if p.cursor_function is not None:
            self._cursor_function = import_function(who, p.cursor_function)

    def __repr__(self) -> str:
        cursor = self.params.cursor_function or (
            self._cursor_path.text if self._cursor_path else None
        )
        return (
            f"<{type(self).__name__} url={redact_dsn(self.params.url)!r} "
            f"headers={sorted({*self.params.headers, *self.params.env_headers})!r} cursor={cursor!r}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        await import_off_loop("httpx")
        import httpx

        key = f"{self.watcher_name}.cursor"
        cursor, seen = await self._load(key)
        await sleep_spread(self.params.poll_interval)
        # Header values and credentials go straight into the client: no local of this frame
        # holds a secret for a traceback (rendered with locals) to show. The client is made in
        # a worker thread: making the first one reads the CA bundle and imports the transport.
        client = await anyio.to_thread.run_sync(
            functools.partial(
                httpx.AsyncClient,
                headers=self._request_headers(),
                auth=httpx.BasicAuth(*self._credentials) if any(self._credentials) else None,
                timeout=self.params.timeout,
                follow_redirects=True,
            )
        )
        async with client:
            while True:
                body, got, reply_headers = await self._get(client, cursor, seen)
                if body is MISSING:  # 304, or the same body again
                    await sleep_jittered(self.params.poll_interval)
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
                    await sleep_jittered(self.params.poll_interval)

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
        for header, variable in self.params.env_headers.items():
            if variable not in os.environ:
                raise HttpSourceError(
                    redact_dsn(self.params.url),
                    f"header {header!r} comes from the environment variable {variable!r}, "
                    "which is not set",
                )
        return {
            "Accept": "application/json",
            **self.params.headers,
            **{
                header: os.environ[variable] for header, variable in self.params.env_headers.items()
            },
        }

    def _request_url(self, cursor: Any) -> str:
        """The URL to GET: ``url`` (its own query kept), with the cursor added or followed."""
        import httpx

        if cursor is None:
            return self._public_url
        base = httpx.URL(self._public_url)
        if isinstance(cursor, str) and cursor.startswith(("http://", "https://", "/")):
            return without_credentials(str(base.join(cursor)))  # ours go as the client's auth
        return str(base.copy_merge_params({self.params.cursor_param: str(cursor)}))

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
                problem = f"no answer within {self.params.timeout} s ({type(exc).__name__})"
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
            if self.params.retries is not None and failures > self.params.retries:
                raise HttpSourceError(shown, f"{problem}, {failures} times in a row")
            delay = self.params.backoff * 2 ** min(failures - 1, 32)
            if wait is not None:
                delay = max(delay, wait)
            delay = min(delay, self.params.max_backoff)
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
                redact_dsn(self.params.url),
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
                    redact_dsn(self.params.url),
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
                redact_dsn(self.params.url),
                f"the next cursor must be text or a number, got {following!r}",
            )
        return following
