"""How a job of :mod:`watchkeeper.store.sql` runs on SQLite: writes inside the group-commit
writer's batch transaction (in its thread), reads on the reader connection.

In a batch every statement already runs in one ``BEGIN IMMEDIATE`` transaction holding the
file's write lock, so a job's ``BEGIN`` changes nothing, and row locks are no SQL at all; a
``notify`` is for other processes' listeners, and SQLite has none (the service wakes the
waiters of its own process). ``:now`` is the batch's time as stored text, ``:expires`` that
time plus ``ttl`` seconds.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol, TypeVar

from ..sql.dialects import SQLITE, sqlite_text
from ..sql.engine import Dialect, Job, Many, Query, Step, drive, drive_sync

__all__ = ["SqliteRunner", "run_job", "run_on"]

T = TypeVar("T")


class BatchTx(Protocol):
    """What a job needs of the writer's batch (:class:`~.writer.Tx`)."""

    @property
    def conn(self) -> sqlite3.Connection: ...
    def now(self) -> tuple[datetime, str]: ...


class Store(Protocol):
    """What the runner needs of the SQLite store (its writer, its reader, its clock)."""

    def clock(self) -> datetime: ...
    async def _write(self, fn: Callable[[Any], T], *, savepoint: bool = True) -> T: ...
    async def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...


def _later(now: datetime, ttl: float) -> str:
    return sqlite_text(now + timedelta(seconds=ttl))


def _step(conn: sqlite3.Connection, now: str, expires: Callable[[float], str], step: Step) -> Any:
    if type(step) is Many:
        stmt = step.stmt
        conn.executemany(stmt.sql, [stmt.bind(p, now, expires) for p in step.params])
        return None
    if type(step) is not Query:
        return None  # BEGIN: already in the batch's transaction; notify: nobody listens
    cursor = conn.execute(step.stmt.sql, step.stmt.bind(step.params, now, expires))
    if step.kind == "rows":
        return cursor.fetchall()
    return cursor.rowcount if step.kind == "count" else None


def run_job(job: Job[T], tx: BatchTx) -> T:
    """Run ``job`` in the writer's batch transaction ``tx``."""
    return run_on(job, tx.conn, tx.now()[0])


def run_on(job: Job[T], conn: sqlite3.Connection, moment: datetime) -> T:
    """Run ``job`` on ``conn``, in the transaction the caller opened, at the time ``moment``."""
    return drive_sync(job, partial(_step, conn, sqlite_text(moment), partial(_later, moment)))


class SqliteRunner:
    """The :class:`~watchkeeper.store.sql.leases.LeaseRunner` of a SQLite store: each write a
    fresh job in the writer (which runs it again after a busy file), reads on the reader."""

    __slots__ = ("_store",)
    dialect: Dialect = SQLITE
    prefix = ""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __repr__(self) -> str:
        return f"<SqliteRunner of {self._store!r}>"

    async def write(
        self,
        job: Callable[[], Job[T]],
        *,
        what: str,
        lane: str = "writes",
        bound: float | None = None,
    ) -> T:
        return await self._store._write(lambda tx: run_job(job(), tx))

    async def read(self, job: Callable[[], Job[T]], *, what: str) -> T:
        moment = self._store.clock()
        stamp, expires = sqlite_text(moment), partial(_later, moment)

        async def step(step: Step) -> Any:
            if type(step) is not Query:
                return None
            found = await self._store._read(
                step.stmt.sql, step.stmt.bind(step.params, stamp, expires)
            )
            return found if step.kind == "rows" else None

        return await drive(job(), step)
