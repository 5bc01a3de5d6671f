"""What a part of the SQLite backend (its runs, controls) reaches of the store:
its writer and its reader, owned by the store."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .writer import GroupCommitWriter, Tx

__all__ = ["SqliteCore", "SqlitePart"]

T = TypeVar("T")


class SqliteCore(Protocol):
    """The SQLite backend as its parts see it."""

    clock: Callable[[], datetime]

    async def _write(self, fn: Callable[[Tx], T], *, savepoint: bool = True) -> T: ...
    async def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...
    def _live_writer(self) -> GroupCommitWriter: ...


class SqlitePart:
    """A part of the SQLite backend: it writes through the store's group-commit writer and
    reads through its reader connection."""

    def __init__(self, store: SqliteCore) -> None:
        self._store = store

    def clock(self) -> datetime:
        return self._store.clock()

    async def _write(self, fn: Callable[[Tx], T], *, savepoint: bool = True) -> T:
        return await self._store._write(fn, savepoint=savepoint)

    async def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return await self._store._read(sql, params)

    def _live_writer(self) -> GroupCommitWriter:
        return self._store._live_writer()
