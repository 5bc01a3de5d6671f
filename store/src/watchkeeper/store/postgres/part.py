"""What a part of the PostgreSQL backend (its leases, runs, controls) reaches of
the store: its pool and transactions, its statements, its clock and its session settings,
all owned by the store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .schema import table_prefix

if TYPE_CHECKING:
    import asyncpg

    from .connections import Freshness
    from .sql import Statements

__all__ = ["PostgresCore", "PostgresPart"]

T = TypeVar("T")


class PostgresCore(Protocol):
    """The PostgreSQL backend as its parts see it."""

    schema: str | None
    statement_timeout: float
    clock: Callable[[], datetime]
    _dsn: str
    _sql: Statements
    _open: bool
    _freshness: Freshness

    async def _fetch(self, what: str, sql: str, *args: Any) -> list[asyncpg.Record]: ...
    async def _submit(self, op: Any) -> Any: ...
    async def _transact(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T: ...
    def _pool_or_closed(self) -> asyncpg.Pool: ...
    def _connect_args(self) -> dict[str, Any]: ...
    def _clock_param(self) -> datetime | None: ...


class PostgresPart:
    """A part of the PostgreSQL backend: what it needs of the store, read here each time."""

    def __init__(self, store: PostgresCore) -> None:
        self._store = store

    @property
    def schema(self) -> str | None:
        return self._store.schema

    @property
    def _prefix(self) -> str:
        return table_prefix(self._store.schema)

    @property
    def statement_timeout(self) -> float:
        return self._store.statement_timeout

    @property
    def _dsn(self) -> str:
        return self._store._dsn

    @property
    def _sql(self) -> Statements:
        return self._store._sql

    @property
    def _open(self) -> bool:
        return self._store._open

    @property
    def _freshness(self) -> Freshness:
        return self._store._freshness

    def clock(self) -> datetime:
        return self._store.clock()

    async def _fetch(self, what: str, sql: str, *args: Any) -> list[asyncpg.Record]:
        return await self._store._fetch(what, sql, *args)

    async def _submit(self, op: Any) -> Any:
        return await self._store._submit(op)

    async def _transact(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        return await self._store._transact(what, fn)

    def _pool_or_closed(self) -> asyncpg.Pool:
        return self._store._pool_or_closed()

    def _connect_args(self) -> dict[str, Any]:
        return self._store._connect_args()

    def _clock_param(self) -> datetime | None:
        return self._store._clock_param()
