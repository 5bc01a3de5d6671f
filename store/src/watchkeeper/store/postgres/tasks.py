"""Runs for :class:`~watchkeeper.store.PostgresStateBackend` (event consumers and task specs
are :mod:`watchkeeper.store.sql.tasks`'; the events lock and the wake-ups :mod:`.consumers`).

Each operation is one short transaction on a pooled connection (``_transact``), not a batch
of the group writer: claims hold run rows (``FOR UPDATE ... SKIP LOCKED``, so several workers
claim different runs without waiting on each other; see :mod:`.runs`), and a finish holds its
run row while it checks the lease and commits the outlet events. A worker's step finishes a
try and claims the next in one statement (the plain successes of slots finishing at once share
one, :mod:`.steps`); when too few runs are ready it creates a batch and
claims from it: for a task on one asset in one more statement, the horizon read in it (the
cursor moves only from where it was read, so of two workers racing one creates and the other
nothing); for a task on several assets in a transaction (the task rows, locked in name order,
serialise the creations of one task). The rules are :mod:`._tasks`'.

**Commit order.** An identity column hands out ids at insert, not at commit, so two writers'
events can commit out of id order, and a cursor read between the two commits would step over
the later-committed lower id for good. Every transaction that inserts events therefore holds
a shared transaction-scoped advisory lock, taken before its first insert (the group writer
takes it per batch, see :func:`events_hook`; a finish with outlets takes it too). A worker
creating runs reads, in one statement that takes no lock, the newest event id and the
transactions then holding that lock (``pg_locks``): every event with a lower id was inserted
by one of them or has committed. Once they have ended (polled; none, the usual case at a low
rate, costs nothing more) the id is a *horizon*: every event up to it has committed or rolled
back, and runs are created from those. Event commits never wait for this: an exclusive
request, as declaring tasks, ``acreate_runs`` and consumer fetches still make, would queue
every new shared one behind it. Lock order for those, always: task rows, then the events lock.

**Wake-ups.** The same hook sends one ``NOTIFY`` per committed batch (never one per event);
:meth:`.controls.PostgresControls._await_events` listens on a connection of its own and falls back to
polling when that connection is lost.
"""

from __future__ import annotations

import builtins
import functools
import json
from datetime import timedelta
from typing import Any, TypeVar

import anyio

from .._tasks import (
    RunOutcome,
    RunStep,
    TaskRun,
    TaskSpec,
)
from .._types import AssetEvent
from ..errors import (
    TaskNotFoundError,
)
from ..sql.run_steps import create_runs, finish_run
from .runs import (
    RUN_WIDTH,
    PostgresRuns,
    create_claim_sql,
    horizon_sql,
    writers_in_flight_sql,
)
from .sql import database_clock
from .steps import StepOp

__all__ = ["PostgresTasks"]

T = TypeVar("T")


class PostgresTasks(PostgresRuns):
    """The stepper of PostgreSQL's runs driver (:class:`~watchkeeper.store.sql.runs.SqlRuns`):
    a worker's step here (the events horizon, creating and claiming in one statement), claims
    in :class:`.runs.PostgresRuns`, the events lock in :class:`.consumers.PostgresConsumers`
    (consumers and task specs are :mod:`watchkeeper.store.sql.tasks`')."""

    horizon_waits: int = 0
    """How many times a step found an earlier event's writer still in flight and waited for it
    (a counter: what a step held up by an uncommitted event can be seen by)."""

    async def _spec(self, conn: Any, name: str, *, lock: bool = False) -> tuple[TaskSpec, bool]:
        row = await conn.fetchrow(
            f"SELECT name, assets, mode, max_events, max_tries, paused FROM {self._prefix}tasks "
            f"WHERE name = $1{' FOR UPDATE' if lock else ''}",
            name,
        )
        if row is None:
            raise TaskNotFoundError(f"task {name!r}")
        return TaskSpec(row[0], tuple(row[1]), row[2], row[3], row[4]), row[5]

    # -- runs --------------------------------------------------------------------------------

    async def _horizon(
        self, tasks: builtins.list[str] | None
    ) -> tuple[builtins.list[TaskSpec], int]:
        """The tasks (of ``tasks``) with committed events after a cursor, and an event id at
        or below which every event has committed or rolled back: the newest id, once the
        transactions that held the shared events lock when it was read have ended.

        No lock is taken, so event commits never queue behind this (an exclusive request
        would hold up every new shared one): the holders are read from ``pg_locks`` with
        the id, and polled until they are gone (one round trip when none holds it, the usual
        case at a low rate; at a high one, about the rest of the batches then in flight)."""
        key = self._events_key
        rows = await self._fetch("reading pending events", horizon_sql(self._prefix, key), tasks)
        specs_json, horizon, holders = rows[0]
        specs = [TaskSpec(n, tuple(a), m, e, t) for n, a, m, e, t in json.loads(specs_json)]
        if not specs or not holders:
            return specs, int(horizon)
        await self._wait_writers(holders)
        return specs, int(horizon)

    async def _wait_writers(self, holders: builtins.list[str]) -> None:
        """Return once none of the transactions ``holders`` holds the shared events lock."""
        pause = 0.0005
        sql = writers_in_flight_sql(self._events_key)
        while (await self._fetch("reading the events horizon", sql, holders))[0][0]:
            self.horizon_waits += 1
            await anyio.sleep(pause)
            pause = min(pause * 2, 0.004)

    async def _create_claim_one(
        self,
        name: str,
        owner: str,
        wanted: int,
        span: timedelta,
        create: int,
        horizon: int | None,
    ) -> tuple[str | None, builtins.list[TaskRun], int]:
        """Create up to ``create`` runs of the one-asset task ``name`` and claim up to
        ``wanted`` of them: one statement (:func:`.runs.create_claim_sql`), and with
        ``horizon`` None, the horizon read in it too (again with the id read, once the
        writers then in flight have ended). Returns what the task is (``'one'``, ``'other'``:
        on several assets, nothing created; None: paused or unknown), the claimed runs and
        how many runs were created."""
        sql: str | None = self.__dict__.get("_create_claim_text")
        if sql is None:
            sql = self.__dict__["_create_claim_text"] = create_claim_sql(
                self._prefix, self._events_key
            )
        while True:
            rows = await self._fetch(
                "creating and claiming runs", sql,
                name, horizon, create, database_clock(self.clock), owner, wanted, span,
            )  # fmt: skip
            made, what, read, holders = rows[0][-4:]
            if not holders:
                break
            await self._wait_writers(holders)
            horizon = int(read)
        runs: dict[int, tuple[Any, list[AssetEvent]]] = {}
        for r in rows:
            values = tuple(r)
            if values[0] is None:
                continue
            entry = runs.setdefault(values[0], (values[:RUN_WIDTH], []))
            entry[1].append(self._steps.event(values[RUN_WIDTH : RUN_WIDTH + 6]))
        return what, [self._steps.run(row, events) for row, events in runs.values()], made

    # -- runs --------------------------------------------------------------------------------

    async def _astep_runs(
        self,
        owner: str,
        finish: RunOutcome | None,
        claim: int,
        span: timedelta,
        tasks: builtins.list[str] | None,
        create: int,
        peers: int,
    ) -> RunStep:
        finished: TaskRun | None = None
        claimed: builtins.list[TaskRun]
        if finish is not None and finish.success and not finish.outlets and claim <= 1:
            # A slot's usual step: with the others finishing at once (creating after, if short).
            group = (owner, span, None if tasks is None else tuple(tasks))
            done: RunStep = await self._submit(
                StepOp(group, finish, claim == 1, peers, self._run_steps)
            )
            finished, claimed = done.finished, list(done.claimed)
        elif finish is not None and (not finish.success or finish.outlets):
            # A failure (its retry) or outlet events: the finish, then the claim.
            async def step(conn: Any) -> tuple[TaskRun, list[TaskRun]]:
                done = await self._in(conn, finish_run(self._steps, owner, finish))
                return done, (await self._claim(conn.fetch, owner, claim, span, tasks))[1]

            finished, claimed = await self._transact("finishing and claiming runs", step)
        else:  # a plain success and the claim: one statement
            finished, claimed = await self._claim(
                functools.partial(self._fetch, "finishing and claiming runs"),
                owner, claim, span, tasks, finish,
            )  # fmt: skip
            if finish is not None and finished is None:
                await self._transact(
                    "finishing a run", lambda conn: self._refuse(conn, owner, finish)
                )
        if not create or len(claimed) >= claim:
            return RunStep(finished, tuple(claimed))
        # Too few ready: create runs from the events up to the horizon and claim from them.
        # A one-asset task's in one statement each (a worker that lost the race for the
        # cursor creates nothing); the others' in one transaction, task rows locked in name
        # order, as before.
        wanted = claim - len(claimed)
        more: list[TaskRun] = []
        if tasks is not None and len(tasks) == 1:  # one task (a worker's usual): one statement
            what, more, made = await self._create_claim_one(
                tasks[0], owner, wanted, span, create, None
            )
            if what != "other":
                return RunStep(finished, (*claimed, *more), made)
        specs, horizon = await self._horizon(tasks)
        if not specs:
            return RunStep(finished, tuple(claimed))
        made = 0
        for spec in specs:
            if len(spec.assets) == 1:
                _, runs, n = await self._create_claim_one(
                    spec.name, owner, max(0, wanted - len(more)), span, create, horizon
                )
                more, made = more + runs, made + n
        several = [spec for spec in specs if len(spec.assets) > 1]
        if several:
            # Tasks on several assets: their plans (all / any) are :func:`plan_runs`'.
            names = [spec.name for spec in several]

            async def create_and_claim(conn: Any) -> tuple[list[TaskRun], int]:
                locked = await conn.fetch(
                    "SELECT name, assets, mode, max_events, max_tries, paused, batch_window, "
                    f"max_active_runs, removed_at FROM {self._prefix}tasks "
                    "WHERE name = ANY($1::text[]) ORDER BY name FOR UPDATE",
                    names,
                )
                n = 0
                for row in locked:
                    spec = self._steps.task_spec(row)
                    if spec is not None:  # not paused or removed meanwhile
                        job = create_runs(self._steps, spec, create, horizon)
                        n += len(await self._in(conn, job))
                if len(more) >= wanted:
                    return [], n
                runs = (await self._claim(conn.fetch, owner, wanted - len(more), span, tasks))[1]
                return runs, n

            runs, n = await self._transact("creating and claiming runs", create_and_claim)
            more, made = more + runs, made + n
        return RunStep(finished, (*claimed, *more), made)
