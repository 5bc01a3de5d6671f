"""``FakeEventSource``: a scripted event source for testing watchers.

A trigger under test either *polls* it, like a REST API or a table read by cursor::

    items = await source.poll(after=cursor, limit=100)

or *listens* to it, like a message broker, acknowledging each message once it is safe::

    async for message in source.listen():
        yield TriggerEvent(message.payload, dedup_key=str(message.seq))
        await source.ack(message)

Every item carries a sequence number. The test publishes items and scripts faults: the next
delivery raises (:meth:`~FakeEventSource.fail`), hangs (:meth:`~FakeEventSource.hang`), delivers
items twice (:meth:`~FakeEventSource.duplicate`) or in reverse order
(:meth:`~FakeEventSource.reorder`), replays everything since the oldest unacknowledged item
(:meth:`~FakeEventSource.redeliver`, a broker after a crash), or the connection drops
(:meth:`~FakeEventSource.disconnect`).

``FakeEventSource()`` lives in memory; ``FakeEventSource.at(path)`` lives in a SQLite file that
a producer and a consumer in different processes open at the same time. A trigger keeps only
``source.address`` (a string, so it serializes) and reopens the source with
:meth:`FakeEventSource.connect` inside ``run()``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import anyio

from .._core import AsyncService
from ._source_store import MemorySourceStore, Row, SourceStore, SqliteSourceStore

__all__ = [
    "FakeEventSource",
    "SourceClosedError",
    "SourceDisconnectedError",
    "SourceError",
    "SourceItem",
    "SourceUnavailableError",
    "Subscription",
]

_MEMORY_STORES: weakref.WeakValueDictionary[str, MemorySourceStore] = weakref.WeakValueDictionary()


class SourceError(Exception):
    """Raised by a :class:`FakeEventSource`; the root of the source's errors."""


class SourceUnavailableError(SourceError, ConnectionError):
    """Raised by a delivery that a :meth:`FakeEventSource.fail` fault was scripted for."""


class SourceDisconnectedError(SourceError, ConnectionError):
    """Raised when the connection dropped (:meth:`FakeEventSource.disconnect`).

    Open subscriptions end with it, acknowledgements of what they delivered are refused, and
    the next :meth:`~FakeEventSource.poll` of each handle raises it once.
    """

    def __init__(self, address: str, what: str) -> None:
        super().__init__(f"{address}: connection dropped; {what}")


class SourceClosedError(SourceError, RuntimeError):
    """Raised when a SQLite-backed source is used outside ``async with``."""

    def __init__(self, address: str) -> None:
        super().__init__(
            f"{address} is not open: use `async with FakeEventSource.at(path) as source:`"
        )


@dataclass(frozen=True, slots=True)
class SourceItem:
    """One delivered item: ``seq`` is its sequence number, ``delivery`` counts the deliveries."""

    seq: int
    payload: Any
    delivery: int = 1
    generation: int = field(default=0, compare=False, repr=False)

    @property
    def redelivered(self) -> bool:
        """True when this item was delivered before (a duplicate or a redelivery)."""
        return self.delivery > 1


def _item(row: Row, generation: int, delivery: int | None = None) -> SourceItem:
    return SourceItem(row.seq, json.loads(row.payload_json), delivery or row.deliveries, generation)


def _check_count(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class FakeEventSource(AsyncService):
    """A scripted, sequence-numbered event source kept in memory; see the module docstring.

    :param name: the in-memory source's name, part of its :attr:`address` (default: a random
        one). :meth:`at` makes one kept in a SQLite file instead.

    :raises ValueError: an empty name, or one another in-memory source of this process has.
    """

    def __init__(self, name: str | None = None, *, _store: SourceStore | None = None) -> None:
        if _store is None:
            if name is not None and (not isinstance(name, str) or not name):
                raise ValueError(f"name must be a non-empty str, got {name!r}")
            name = name or f"fake-{uuid.uuid4().hex[:12]}"
            if name in _MEMORY_STORES:
                raise ValueError(f"a FakeEventSource named {name!r} already exists")
            memory = MemorySourceStore(name)
            _MEMORY_STORES[name] = memory
            _store = memory
        self._store = _store
        self._open = isinstance(_store, MemorySourceStore)
        self._seen_generation: int | None = None

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> FakeEventSource:
        """Make a handle on the source kept in a SQLite file.

        Open it with ``async with``; any number of processes may open the same file.

        :param path: the file (created when missing).
        """
        return cls(_store=SqliteSourceStore(Path(path).absolute()))

    @classmethod
    def connect(cls, address: str) -> FakeEventSource:
        """Make a new handle on the source at ``address`` (another task's or process's).

        :param address: a source's :attr:`address`: ``memory://…`` or ``sqlite:///…``.
        :raises TypeError: ``address`` is not a string.
        :raises LookupError: no in-memory source of that name in this process.
        :raises ValueError: not a source's address.
        """
        if not isinstance(address, str):
            raise TypeError(f"address must be a str, got {type(address).__name__}")
        if address.startswith("sqlite:///"):
            return cls.at(address.removeprefix("sqlite:///"))
        if address.startswith("memory://"):
            store = _MEMORY_STORES.get(address.removeprefix("memory://"))
            if store is None:
                raise LookupError(f"no in-memory FakeEventSource at {address!r} in this process")
            return cls(_store=store)
        raise ValueError(f"not a FakeEventSource address: {address!r}")

    @property
    def address(self) -> str:
        """Where this source lives; pass it to a trigger and :meth:`connect` to it there."""
        return self._store.address

    async def _aopen(self, resources: contextlib.AsyncExitStack) -> None:
        if self._open:  # an in-memory source is always open
            return
        await self._store.aopen()
        self._open = True
        resources.push_async_callback(self._close_store)

    async def _close_store(self) -> None:
        """Close the handle (the SQLite connection); the items stay in the source."""
        self._open = False
        with anyio.move_on_after(5, shield=True):
            await self._store.aclose()

    def __repr__(self) -> str:
        return f"<FakeEventSource address={self.address!r} open={self._open}>"

    def _check_open(self) -> SourceStore:
        if not self._open:
            raise SourceClosedError(self.address)
        return self._store

    # -- producer side ------------------------------------------------------------------------

    async def publish(self, *payloads: Any, seq: int | None = None) -> list[int]:
        """Append JSON payloads to the source.

        :param payloads: at least one JSON value.
        :param seq: publish exactly one payload at this number, which may be lower than items
            already published: a row whose transaction took its id early and committed
            late.

        :returns: the payloads' sequence numbers.
        :raises TypeError: a payload is not JSON.
        :raises ValueError: no payload, or ``seq`` with several payloads or below 1.
        :raises SourceClosedError: a SQLite-backed handle used outside ``async with``.
        """
        store = self._check_open()
        if not payloads:
            raise ValueError("publish() needs at least one payload")
        if seq is not None:
            _check_count("seq", seq, 1)
            if len(payloads) != 1:
                raise ValueError(f"publish(seq={seq}) takes one payload, got {len(payloads)}")
        encoded: list[str] = []
        for index, payload in enumerate(payloads):
            try:
                encoded.append(json.dumps(payload, allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"payload #{index} is not JSON: {payload!r} ({exc})") from exc
        return await store.publish(encoded, seq)

    # -- fault script ---------------------------------------------------------------------------

    async def fail(self, message: str = "scripted failure", *, times: int = 1) -> None:
        """Make the next deliveries (polls or receives) raise :class:`SourceUnavailableError`.

        :param message: the error's message.
        :param times: how many deliveries fail.
        """
        _check_count("times", times, 1)
        await self._check_open().add_fault("fail", times, str(message))

    async def hang(self, *, times: int = 1) -> None:
        """Make the next deliveries wait until they are cancelled.

        :param times: how many deliveries hang.
        """
        _check_count("times", times, 1)
        await self._check_open().add_fault("hang", times, None)

    async def duplicate(self, count: int = 1) -> None:
        """Deliver each of the next items twice in a row.

        :param count: how many items are doubled.
        """
        _check_count("count", count, 1)
        await self._check_open().add_fault("duplicate", count, None)

    async def reorder(self, count: int = 2) -> None:
        """Deliver the next items in reverse order.

        :param count: how many items are reversed (at least 2).
        """
        _check_count("count", count, 2)
        await self._check_open().add_fault("reorder", count, None)

    async def redeliver(self) -> None:
        """The next delivery restarts from the oldest unacknowledged item (a broker after a
        crash replays everything since the last acknowledgement); ``poll`` ignores ``after``
        for that one call."""
        await self._check_open().add_fault("redeliver", 1, None)

    async def disconnect(self) -> None:
        """Drop every connection now: open subscriptions raise :class:`SourceDisconnectedError`,
        their deliveries can no longer be acknowledged, and unacknowledged items go to the next
        subscription."""
        await self._check_open().bump_generation()

    # -- consumer side --------------------------------------------------------------------------

    async def poll(self, *, after: int = 0, limit: int = 100) -> list[SourceItem]:
        """Read the items after a sequence number, in order, with the scripted faults applied.

        :param after: the last sequence number seen (0: from the start).
        :param limit: at most this many items.
        :returns: the items with ``seq > after``, in sequence order.
        :raises SourceUnavailableError: a :meth:`fail` fault was scripted for this delivery.
        :raises SourceDisconnectedError: the source was disconnected since the last poll (poll
            again to reconnect).
        :raises SourceClosedError: a SQLite-backed handle used outside ``async with``.
        """
        store = self._check_open()
        _check_count("after", after, 0)
        _check_count("limit", limit, 1)
        generation, fault = await store.head()
        if self._seen_generation is None:
            self._seen_generation = generation
        elif generation != self._seen_generation:
            self._seen_generation = generation
            raise SourceDisconnectedError(self.address, "poll again to reconnect")
        duplicate = reorder = fault_id = 0
        if fault is not None:
            fault_id = fault.fault_id
            if fault.kind in ("fail", "hang", "redeliver"):
                await store.consume_fault(fault.fault_id, 1)
            if fault.kind == "fail":
                raise SourceUnavailableError(f"{self.address}: {fault.message}")
            if fault.kind == "hang":
                await anyio.sleep_forever()
            if fault.kind == "redeliver":
                oldest = await store.min_unacked()
                after = oldest - 1 if oldest is not None else after
            duplicate = fault.remaining if fault.kind == "duplicate" else 0
            reorder = fault.remaining if fault.kind == "reorder" else 0
        rows = await store.fetch(after, limit, unacked_only=False)
        items = [_item(row, generation) for row in rows]
        if reorder and items:
            used = min(reorder, len(items))
            items[:used] = reversed(items[:used])
            await store.consume_fault(fault_id, used)
        if duplicate and items:
            used = min(duplicate, len(items))
            doubled: list[SourceItem] = []
            for index, item in enumerate(items):
                doubled.append(item)
                if index < used:
                    doubled.append(_item(rows[index], generation, item.delivery + 1))
            items = doubled
            await store.consume_fault(fault_id, used)
        return items

    def listen(self, *, prefetch: int = 1) -> Subscription:
        """Subscribe: iterate to receive unacknowledged items in order; :meth:`ack` each one.

        :param prefetch: items fetched at a time; like a broker's prefetch, an item fetched
            ahead counts as delivered even before the consumer takes it.

        :returns: the subscription, an async iterator of items.
        """
        self._check_open()
        _check_count("prefetch", prefetch, 1)
        return Subscription(self, self._store, prefetch)

    async def ack(self, item: SourceItem) -> None:
        """Acknowledge a delivered item, so no later subscription receives it again.

        Acknowledging twice is harmless.

        :param item: an item a subscription or a poll delivered.
        :raises TypeError: ``item`` is not a :class:`SourceItem`.
        :raises SourceDisconnectedError: it was delivered before a disconnect.
        :raises KeyError: no item with its sequence number.
        """
        store = self._check_open()
        if not isinstance(item, SourceItem):
            raise TypeError(f"ack() takes a SourceItem, got {type(item).__name__}")
        outcome = await store.ack(item.seq, item.generation)
        if outcome == "disconnected":
            raise SourceDisconnectedError(
                self.address, f"seq {item.seq} was delivered on a dropped connection"
            )
        if outcome == "unknown":
            raise KeyError(f"no item with seq {item.seq} in {self.address}")

    # -- inspection -----------------------------------------------------------------------------

    async def items(self) -> list[SourceItem]:
        """Every published item in sequence order; ``delivery`` is how often it was sent."""
        generation, _ = await self._check_open().head()
        return [_item(row, generation) for row in await self._store.rows()]

    async def acked(self) -> list[int]:
        """Sequence numbers acknowledged so far."""
        return [row.seq for row in await self._check_open().rows() if row.acked]

    async def unacked(self) -> list[int]:
        """Sequence numbers not acknowledged yet."""
        return [row.seq for row in await self._check_open().rows() if not row.acked]

    async def last_seq(self) -> int:
        """The highest published sequence number (0 when empty)."""
        rows = await self._check_open().rows()
        return rows[-1].seq if rows else 0


class Subscription:
    """One listening session of a :class:`FakeEventSource`; an async iterator of items.

    It delivers unacknowledged items in sequence order and waits for new ones. When the
    connection drops it raises :class:`SourceDisconnectedError`; a new ``listen()`` then
    receives every item that was not acknowledged.
    """

    def __init__(self, source: FakeEventSource, store: SourceStore, prefetch: int) -> None:
        self._source = source
        self._store = store
        self._prefetch = prefetch
        self._cursor = 0
        # (item, is_copy): a copy made by a duplicate fault is not duplicated again
        self._pending: collections.deque[tuple[SourceItem, bool]] = collections.deque()
        self._generation: int | None = None
        self._closed = False

    def __aiter__(self) -> Self:
        return self

    def close(self) -> None:
        """End the session: the next receive raises ``StopAsyncIteration``."""
        self._closed = True

    async def _fill(self, want: int, generation: int) -> None:
        while len(self._pending) < want:
            rows = await self._store.fetch(
                self._cursor, max(self._prefetch, want), unacked_only=True
            )
            if not rows:
                return
            self._cursor = rows[-1].seq
            self._pending.extend((_item(row, generation), False) for row in rows)

    async def __anext__(self) -> SourceItem:
        store = self._store
        idle_for = 0
        while True:
            if self._closed:
                raise StopAsyncIteration
            self._source._check_open()
            generation, fault = await store.head()
            if self._generation is None:
                self._generation = generation
            elif generation != self._generation:
                self._closed = True
                raise SourceDisconnectedError(self._source.address, "listen() again")
            if self._pending and self._pending[0][1]:
                return self._pending.popleft()[0]  # the second copy follows at once
            if fault is not None:
                if fault.kind == "fail":
                    await store.consume_fault(fault.fault_id, 1)
                    raise SourceUnavailableError(f"{self._source.address}: {fault.message}")
                if fault.kind == "hang":
                    await store.consume_fault(fault.fault_id, 1)
                    await anyio.sleep_forever()
                if fault.kind == "redeliver":
                    await store.consume_fault(fault.fault_id, 1)
                    self._pending.clear()
                    self._cursor = 0
                    continue
            await self._fill(1, generation)
            if not self._pending:
                await store.wait_for_change(idle_for)
                idle_for = min(idle_for + 1, 16)
                continue
            if fault is not None and fault.kind == "reorder":
                await self._fill(fault.remaining, generation)
                used = min(fault.remaining, len(self._pending))
                head = [self._pending.popleft() for _ in range(used)]
                self._pending.extendleft(head)  # extendleft reverses them
                await store.consume_fault(fault.fault_id, used)
            item, is_copy = self._pending.popleft()
            if fault is not None and fault.kind == "duplicate" and not is_copy:
                await store.consume_fault(fault.fault_id, 1)
                again = SourceItem(item.seq, item.payload, item.delivery + 1, item.generation)
                self._pending.appendleft((again, True))
            return item
