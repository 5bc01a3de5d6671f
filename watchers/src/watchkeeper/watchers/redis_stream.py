"""``RedisStreamWatcher``: one event per entry of a Redis stream, exactly once.

A stream is replayable: every entry keeps its id (``<ms>-<seq>``, strictly increasing), so the
id of the last entry emitted is the watermark, committed with each event, and a restarted
watcher reads on after it. No acknowledgement is needed for correctness; with ``group`` set the
watcher reads through a consumer group instead and acknowledges (``XACK``) each entry after its
event committed, so the group's pending list shows what is in flight.

Trimming (``MAXLEN``/``MINID``) can delete entries before they are read. Each read is one
``MULTI`` of ``XREAD`` and ``XINFO STREAM``, so the watcher knows how many entries the stream
ever had (``entries-added``) and where it starts now (``first-entry``): it counts the entries it
has read in the same way (``entries_read`` in its state) and, when the stream's first entry lies
past the entries it has read, logs ``redis_stream_gap`` with the number of entries it lost
(deleted with ``XDEL`` or trimmed before being read) and reads on. Redis 7 or newer reports
``entries-added``; on older servers the gap check is off.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
from pydantic import field_validator, model_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import (
    BrokerSourceError,
    decode_body,
    redact_url,
    retry_delay,
    url_secrets,
)
from ._common import close_bounded, import_off_loop
from ._params import (
    Count,
    OptionalText,
    ReadyMadeWatcher,
    Seconds,
    SecondsOrZero,
    Text,
    WatcherParams,
)
from ._redis_position import Position, format_id, parse_id, stored_watermark

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["RedisStreamParams", "RedisStreamWatcher", "parse_id"]

log = get_logger(__name__)

_CLIENT_MODULES = ("redis.asyncio", "redis.asyncio.retry", "redis.backoff", "redis.exceptions")
_CONNECT_TIMEOUT = 5.0
_SILENCE_MARGIN = 10.0
"""Seconds a command may go unanswered beyond the ``block`` time of a blocking read."""


def _text(value: bytes) -> Any:
    """A field name or value: its UTF-8 text, else ``{"base64": ...}``."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return decode_body(value)


class RedisStreamParams(WatcherParams):
    """The parameters of :class:`RedisStreamWatcher`."""

    stream: Text
    """The key of the stream."""
    url: Text = "redis://127.0.0.1:6379/0"
    """The server: ``redis://``, ``rediss://`` (TLS) or ``unix://``; its password is never
    shown."""
    start: Text = "0-0"
    """Where a watcher without state begins: ``"0-0"`` the whole stream, ``"$"`` only entries
    added after its first start, any other id the entries after it."""
    batch_size: Count = 100
    """At most this many entries per read, committed together in one transaction (and, with
    ``group``, acknowledged with one ``XACK``); ``1`` commits each entry alone."""
    block: Seconds = 5.0
    """The longest a read waits for new entries, in seconds; each command may take this plus
    10 s before the connection counts as lost."""
    group: OptionalText = None
    """A consumer group to read through (created at ``start`` if missing, with the stream);
    each entry is ``XACK``ed once its event committed."""
    consumer: OptionalText = None
    """The consumer's name in ``group`` (default: the watcher's name). Needs ``group``."""
    reconnect_attempts: Count = 10
    """Failed reconnections in a row before ``run()`` raises :class:`BrokerSourceError`."""
    batch_linger: SecondsOrZero = 0.0
    """Seconds a read that came back short of ``batch_size`` waits for more entries before
    its batch commits (``0``: commit what one read brought)."""

    added_later: ClassVar[frozenset[str]] = frozenset({"batch_linger"})

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"url must start with redis://, rediss:// or unix://, got {redact_url(value)!r}"
            )
        return value

    @field_validator("start")
    @classmethod
    def _stream_id(cls, value: str) -> str:
        if value != "$":
            try:
                parse_id(value if "-" in value else f"{value}-0")
            except ValueError as exc:
                raise ValueError(f"start must be '$' or a stream id: {exc}") from None
        return value

    @model_validator(mode="after")
    def _consumer_needs_group(self) -> RedisStreamParams:
        if self.consumer is not None and self.group is None:
            raise ValueError("consumer needs a group")
        return self


class RedisStreamWatcher(ReadyMadeWatcher[RedisStreamParams]):
    """Yields one event per entry of a Redis stream, in id order.

    The payload is ``{"stream", "id", "fields"}``: the entry's id as ``"<ms>-<seq>"`` and its
    fields as a JSON object of text (a name or value that is not UTF-8 becomes
    ``{"base64": "..."}``). ``start`` is where a watcher without state begins: ``"0-0"``
    (default) reads the whole stream, ``"$"`` only the entries added after its first start
    (entries added before its first event commits, while it is down, are not read), any other
    id the entries after it. ``batch_size`` entries are read at a time and commit together, as
    one :class:`~watchkeeper.triggerer.TriggerEventBatch` with the watermark after the last
    (``batch_size=1``: one commit per entry); a read that came back short waits up to
    ``batch_linger`` seconds for more; ``block`` seconds is the longest a read waits for new
    entries.

    ``group`` reads through that consumer group (created at ``start`` if missing, with the
    stream) as consumer ``consumer`` (default: the watcher's name), and ``XACK``s the entries
    of a batch, with one command, once their events committed. On start it first re-reads its own pending entries: those up to
    the watermark were committed before a crash and are only acknowledged, the others are
    emitted. Entries pending for another consumer name are not claimed.

    Connection: every command must answer within ``block`` + 10 seconds (a blocking read
    waits ``block`` seconds by design; longer silence is a dead link, as behind a network path
    that drops every packet), connecting within 5 s, and TCP keepalives are on. A lost or
    silent connection is replaced by a new one with exponential backoff, ``reconnect_attempts``
    times in a row, meanwhile the watcher's status is ``backing_off`` with the reason (logged
    as ``redis_reconnecting``); then ``run()`` raises :class:`BrokerSourceError` and the daemon
    restarts the watcher with its own backoff. Reads and ``XACK`` are idempotent, and the
    position is the committed one, so nothing is skipped or repeated across a reconnect.
    The connection is named ``watchkeeper:<watcher name>`` (``CLIENT LIST`` shows it).

    State key (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name):

    - ``<name>.watermark``: ``{"id": "<ms>-<seq>", "entries_read": n}``, the last entry
      emitted and how many entries the stream had ever received up to it (``null`` when
      unknown: the gap check then waits until the watcher has caught up with the stream).

    How to rewind it: stop the watcher, set ``<name>.watermark`` to ``{"id": "<ms>-<seq>"}``
    and start it again: it emits the entries after that id. ``{"id": "0-0"}`` (or deleting the
    key, with the default ``start``) reads the whole stream again. With ``group``, the group's
    own position must be moved too (``XGROUP SETID``), since the group delivers only entries
    after its last delivered id.

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = RedisStreamParams
    client = ("redis", "redis")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: Redis | None = None
        self._troubled = False
        self._name = f"{type(self).__name__}({self.params.stream!r})"

    def __repr__(self) -> str:
        group = "" if self.params.group is None else f" group={self.params.group!r}"
        return (
            f"<{type(self).__name__} url={redact_url(self.params.url)!r} stream={self.params.stream!r}"
            f"{group} connected={self._client is not None}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        await import_off_loop(*_CLIENT_MODULES)
        from redis.exceptions import ConnectionError as LostConnection
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as SilentServer

        key = f"{self.watcher_name}.watermark"
        stored = await stored_watermark(self.asset_state_store, key, self._name)
        position: Position | None = None
        failures = 0
        while True:
            client = self._connect()
            self._client = client
            try:
                if position is None:
                    position = await self._call(
                        "reading the stream", Position.start(client, self, stored)
                    )
                    if self.params.group is not None:
                        position.entries_read = None  # the group's position is the server's
                reader = self._read_group if self.params.group is not None else self._read
                async with contextlib.aclosing(reader(client, position)) as batches:
                    async for batch in batches:
                        failures = 0
                        stream = self.params.stream
                        if self.params.batch_size == 1:
                            entry_id, fields = batch[0]
                            yield TriggerEvent(
                                {"stream": stream, "id": entry_id, "fields": fields},
                                state={key: position.state()},
                            )
                        else:
                            yield TriggerEventBatch(
                                [
                                    TriggerEvent(
                                        {"stream": stream, "id": entry_id, "fields": fields}
                                    )
                                    for entry_id, fields in batch
                                ],
                                state={key: position.state()},
                            )
                        if self.params.group is not None:
                            # Committed: the group may forget them, with one XACK.
                            await self._call(
                                "acknowledging",
                                client.xack(
                                    stream, self.params.group, *[entry_id for entry_id, _ in batch]
                                ),
                            )
            except (BrokerSourceError, RedisError) as exc:
                error = exc
                if isinstance(exc, RedisError):
                    error = BrokerSourceError(
                        self._name,
                        f"reading {redact_url(self.params.url)}",
                        exc,
                        url_secrets(self.params.url),
                    )
                    error.__cause__ = exc
                # A lost or silent connection is retried on a new one; anything else is not.
                failures += 1
                lost = isinstance(error.__cause__, LostConnection | SilentServer)
                if not lost or failures > self.params.reconnect_attempts:
                    raise error from error.__cause__
                self._troubled = True
                delay = retry_delay(
                    self,
                    log,
                    "redis_reconnecting",
                    str(error),
                    failures,
                    stream=self.params.stream,
                    watcher=self.watcher_name,
                )
            else:
                return
            finally:
                self._client = None
                await close_bounded(client.aclose)
            await anyio.sleep(delay)

    async def cleanup(self) -> None:
        """Close the connection if ``run()`` was abandoned without being finalized."""
        client, self._client = self._client, None
        if client is not None:
            await close_bounded(client.aclose)

    def _connect(self) -> Redis:
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        name = re.sub(r"[^A-Za-z0-9_.:-]", "_", f"watchkeeper:{self.watcher_name}")[:120]
        client: Redis = Redis.from_url(
            self.params.url,
            # No retry inside the client: run() reconnects, and says so in the status.
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=_CONNECT_TIMEOUT,
            # A blocking XREAD answers after ``block`` seconds; longer silence is a dead link.
            socket_timeout=self.params.block + _SILENCE_MARGIN,
            socket_keepalive=True,
            client_name=name,
        )
        return client

    async def _call(self, action: str, awaitable: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            result = await awaitable
        except RedisError as exc:
            raise BrokerSourceError(
                self._name,
                f"{action} ({redact_url(self.params.url)})",
                exc,
                url_secrets(self.params.url),
            ) from exc
        if self._troubled:
            self._troubled = False
            self.report_source(None)  # it answers again
        return result

    async def _read(self, client: Redis, position: Position) -> AsyncGenerator[_Entries, None]:
        """Batches of the entries after the position, in order: MULTI reads (topped up for
        ``batch_linger`` seconds when short), or a blocking wait when idle."""
        size, linger = self.params.batch_size, self.params.batch_linger
        while True:
            batch: _Entries = []
            deadline: float | None = None
            while True:
                # One snapshot: the entries after the cursor and the stream's counters at that
                # moment. XINFO fails on a missing stream; that error stays in its own slot.
                wanted = size - len(batch)
                pipe = client.pipeline(transaction=True)
                pipe.xread({self.params.stream: format_id(position.last)}, count=wanted)
                pipe.xinfo_stream(self.params.stream)
                read, info = await self._call(
                    "reading the stream", pipe.execute(raise_on_error=False)
                )
                if isinstance(read, Exception):
                    raise read
                entries = read[0][1] if read else []
                position.observe(self, entries, None if isinstance(info, Exception) else info)
                batch += [(position.advance(raw_id), _fields(raw)) for raw_id, raw in entries]
                if len(entries) == wanted or not batch or linger <= 0:
                    break
                now = anyio.current_time()
                deadline = now + linger if deadline is None else deadline
                if now >= deadline:
                    break
                await anyio.sleep(deadline - now)
            if batch:
                yield batch
            if len(batch) < size:
                # At the tail: wait for the next entry (it is read again by the MULTI above).
                await self._call(
                    "waiting for entries",
                    client.xread(
                        {self.params.stream: format_id(position.last)},
                        count=1,
                        block=max(1, round(self.params.block * 1000)),
                    ),
                )

    async def _read_group(
        self, client: Redis, position: Position
    ) -> AsyncGenerator[_Entries, None]:
        from redis.exceptions import ResponseError

        group = self.params.group
        assert group is not None
        size, linger = self.params.batch_size, self.params.batch_linger
        consumer = self.params.consumer or self.watcher_name
        try:
            start = "$" if self.params.start == "$" else self.params.start
            await client.xgroup_create(self.params.stream, group, id=start, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # Our own pending entries first (delivered before a crash), then new ones.
        pending = "0-0"
        while True:
            read: Any = await self._call(
                "reading pending entries",
                client.xreadgroup(group, consumer, {self.params.stream: pending}, count=size),
            )
            entries = read[0][1] if read else []
            if not entries:
                break
            batch: _Entries = []
            committed: list[str] = []
            for raw_id, raw_fields in entries:
                entry_id = parse_id(raw_id)
                pending = format_id(entry_id)
                if entry_id <= position.last or not raw_fields:
                    if not raw_fields:
                        log.warning(
                            "redis_stream_gap",
                            stream=self.params.stream,
                            watcher=self.watcher_name,
                            entry=pending,
                            reason="a pending entry was deleted before it was read again",
                        )
                    committed.append(pending)
                    continue
                batch.append((position.advance(raw_id), _fields(raw_fields)))
            if committed:
                # Committed before a crash, never acknowledged: only the XACK is missing.
                await self._call(
                    "acknowledging", client.xack(self.params.stream, group, *committed)
                )
            if batch:
                yield batch
        block = max(1, round(self.params.block * 1000))
        while True:
            batch = []
            deadline: float | None = None
            while True:
                wanted = size - len(batch)
                wait = block
                if batch:
                    now = anyio.current_time()
                    deadline = now + linger if deadline is None else deadline
                    wait = round((deadline - now) * 1000)
                    if wait < 1:
                        break
                read = await self._call(
                    "reading the group",
                    client.xreadgroup(
                        group, consumer, {self.params.stream: ">"}, count=wanted, block=wait
                    ),
                )
                entries = read[0][1] if read else []
                batch += [(position.advance(raw_id), _fields(raw)) for raw_id, raw in entries]
                if len(entries) == wanted or linger <= 0 or (batch and not entries):
                    break
            if batch:
                yield batch


_Entries = list[tuple[str, dict[str, Any]]]
"""Stream entries read together: ``(id, fields)`` of each, in id order."""


def _fields(raw: dict[bytes, bytes]) -> dict[str, Any]:
    return {_text(k): _text(v) for k, v in raw.items()}
