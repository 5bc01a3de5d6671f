"""How a job of :mod:`watchkeeper.store.sql` runs on PostgreSQL: on one connection, in
autocommit until the job says ``BEGIN``, then in one transaction to its end (committed when
it returns, rolled back when it raises); a ``notify`` is a ``pg_notify`` in that transaction.

``:now`` is the store's clock parameter (``None``: the database's ``now()``); ``{expires}``
is computed by the server from it and ``:ttl``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import datetime
from typing import Any, NoReturn, TypeVar, cast

from ..sql.dialects import POSTGRES
from ..sql.engine import Begin, Dialect, Job, Many, Query, Step, drive
from .connections import transaction
from .ops import LATE, CallOp
from .part import PostgresPart

__all__ = ["PostgresRunner", "no_expiry", "run_job"]

T = TypeVar("T")


def no_expiry(ttl: float) -> NoReturn:  # pragma: no cover - no PostgreSQL statement binds it
    raise AssertionError("PostgreSQL computes an expiry in SQL")


async def run_job(
    job: Job[T],
    conn: Any,
    *,
    clock: datetime | None,
    channel: Callable[[str], str],
    bound: float | None = None,
    in_transaction: bool = False,
) -> T:
    """Run ``job`` on ``conn`` (outside any transaction); ``channel(topic)`` names a topic's
    NOTIFY channel; ``bound`` limits each statement (``None``: the connection's bound);
    ``in_transaction``: ``conn`` is in the caller's transaction already."""
    async with AsyncExitStack() as stack:

        async def step(step: Step) -> Any:
            nonlocal in_transaction
            if isinstance(step, Query):
                stmt = step.stmt
                args = stmt.bind(step.params, clock, no_expiry)
                if step.kind == "rows":
                    return await conn.fetch(stmt.sql, *args, timeout=bound)
                status = await conn.execute(stmt.sql, *args, timeout=bound)
                return int(status.rsplit(" ", 1)[-1]) if step.kind == "count" else None
            if isinstance(step, Many):
                stmt = step.stmt
                sets = [stmt.bind(p, clock, no_expiry) for p in step.params]
                await conn.executemany(stmt.sql, sets, timeout=bound)
                return None
            if isinstance(step, Begin):
                if not in_transaction:
                    await stack.enter_async_context(transaction(conn))
                    in_transaction = True
                return None
            await conn.execute(
                "SELECT pg_notify($1, $2)", channel(step.topic), step.payload, timeout=bound
            )
            return None

        return await drive(job, step)


class PostgresRunner:
    """The :class:`~watchkeeper.store.sql.runner.Runner` of a PostgreSQL store's pool: a write
    is one transaction on a pooled connection (tried again on another one when the server was
    unavailable), or in lane ``"late"`` a step of the writer's batch after its events; a read
    one statement at a time through the pool."""

    __slots__ = ("_part",)
    dialect: Dialect = POSTGRES

    def __init__(self, part: PostgresPart) -> None:
        self._part = part

    def __repr__(self) -> str:
        return f"<PostgresRunner of {self._part!r}>"

    @property
    def prefix(self) -> str:
        return self._part._prefix

    async def write(
        self,
        job: Callable[[], Job[T]],
        *,
        what: str,
        lane: str = "writes",
        bound: float | None = None,
    ) -> T:
        part = self._part
        clock = part._clock_param()

        def channel(topic: str) -> str:
            raise AssertionError(f"no NOTIFY topic {topic!r} on the pool")  # pragma: no cover

        async def fn(conn: Any) -> T:
            return await run_job(
                job(), conn, clock=clock, channel=channel, bound=bound, in_transaction=True
            )

        if lane == "late":  # in the writer's batch, after its events
            return cast("T", await part._submit(CallOp(fn, phase=LATE)))
        return await part._transact(what, fn)

    async def read(self, job: Callable[[], Job[T]], *, what: str) -> T:
        part = self._part
        clock = part._clock_param()

        async def step(step: Step) -> Any:
            if not isinstance(step, Query):
                raise TypeError(f"a read job wrote: {step!r}")  # pragma: no cover
            args = step.stmt.bind(step.params, clock, no_expiry)
            found = await part._fetch(what, step.stmt.sql, *args)
            return found if step.kind == "rows" else None

        return await drive(job(), step)
