"""What a part of the memory backend (its tasks, its controls) reaches of the store: its lock,
its event list, its state tables and its clock, all owned by the store."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from ._types import AssetEvent, AssetScope, Put, RawEntry, Writer

__all__ = ["MemoryCore", "MemoryPart"]


class MemoryCore(Protocol):
    """The memory backend as its parts see it."""

    clock: Callable[[], datetime]
    _lock: threading.Lock
    _events: list[AssetEvent]
    _next_event_id: int
    _asset_state: dict[tuple[int, str], RawEntry]

    def _resolve(self, scope: AssetScope) -> Any: ...
    def _put(self, put: Put) -> int: ...
    def _check_writer(self, writer: Writer | None) -> None: ...


class MemoryPart:
    """A part of the memory backend; the tables it shares live in the store, read here each
    time (garbage collection replaces the event list)."""

    def __init__(self, store: MemoryCore) -> None:
        self._store = store

    @property
    def _lock(self) -> threading.Lock:
        return self._store._lock

    @property
    def _events(self) -> list[AssetEvent]:
        return self._store._events

    @property
    def _next_event_id(self) -> int:
        return self._store._next_event_id

    @_next_event_id.setter
    def _next_event_id(self, value: int) -> None:
        self._store._next_event_id = value

    @property
    def _asset_state(self) -> dict[tuple[int, str], RawEntry]:
        return self._store._asset_state

    def clock(self) -> datetime:
        return self._store.clock()

    def _resolve(self, scope: AssetScope) -> Any:
        return self._store._resolve(scope)

    def _put(self, put: Put) -> int:
        return self._store._put(put)

    def _check_writer(self, writer: Writer | None) -> None:
        self._store._check_writer(writer)
