"""How a job of :mod:`watchkeeper.store.sql` runs on SQLite: writes inside the group-commit
writer's batch transaction (in its thread), reads on the reader connection.

In a batch every statement already runs in one ``BEGIN IMMEDIATE`` transaction holding the
file's write lock, so a job's ``BEGIN`` changes nothing, and row locks are no SQL at all; a
``notify`` is for other processes' listeners, and SQLite has none (the service wakes the
waiters of its own process). ``:now`` is the batch's time as stored text, ``:expires`` that
time plus ``ttl`` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ..sql.dialects import SQLITE
from ..sql.engine import Dialect, Job, Query, Step, drive, drive_sync
from .schema import to_db

if TYPE_CHECKING:
    from .part import SqliteCore
    from .writer import Tx

__all__ = ["SqliteRunner", "run_job"]

T = TypeVar("T")


def _later(now: datetime, ttl: float) -> str:
    return to_db(now + timedelta(seconds=ttl))


def _step(tx: Tx, now: str, expires: Callable[[float], str], step: Step) -> Any:
    if type(step) is not Query:
        return None  # BEGIN: already in the batch's transaction; notify: nobody listens
    cursor = tx.conn.execute(step.stmt.sql, step.stmt.bind(step.params, now, expires))
    if step.kind == "rows":
        return cursor.fetchall()
    return cursor.rowcount if step.kind == "count" else None


def run_job(job: Job[T], tx: Tx) -> T:
    """Run ``job`` in the writer's batch transaction ``tx``."""
    moment, stamp = tx.now()
    return drive_sync(job, partial(_step, tx, stamp, partial(_later, moment)))


class SqliteRunner:
    """The :class:`~watchkeeper.store.sql.leases.LeaseRunner` of a SQLite store: each write a
    fresh job in the writer (which runs it again after a busy file), reads on the reader."""

    __slots__ = ("_store",)
    dialect: Dialect = SQLITE
    prefix = ""

    def __init__(self, store: SqliteCore) -> None:
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
        stamp, expires = to_db(moment), partial(_later, moment)

        async def step(step: Step) -> Any:
            if type(step) is not Query:
                return None
            found = await self._store._read(
                step.stmt.sql, step.stmt.bind(step.params, stamp, expires)
            )
            return found if step.kind == "rows" else None

        return await drive(job(), step)
