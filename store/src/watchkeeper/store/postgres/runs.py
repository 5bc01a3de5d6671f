"""Run claims for :class:`~watchkeeper.store.PostgresStateBackend`, in one statement.

A mixin of :class:`.tasks.PostgresTasks`. Every run lease follows the database clock
(``now()``), the one clock all workers share, unless a clock is set on the backend (tests). A
claim is one statement (the ready runs with ``FOR UPDATE ... SKIP LOCKED``, their lease, and
their events, a plain success finished in it too): PostgreSQL can update inside ``WITH``, so
what takes SQLite three statements (:mod:`watchkeeper.store.sql.run_steps`) is one round trip
here. The rest of a step (a failure's finish, outlet events, runs of tasks on several assets)
runs as the engine's jobs on the step's connection (:attr:`PostgresRuns._steps`).
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .._tasks import (
    LAPSED,
    MAX_LOST_TRIES,
    RunOutcome,
    TaskRun,
)
from .._types import AssetEvent
from ..sql.dialects import POSTGRES
from ..sql.engine import Job
from ..sql.run_steps import RUN_COLS, StepStatements, refuse
from .consumers import EVENT_COLS, LOCK_KEY, PostgresConsumers, events_lock, events_prelude
from .executor import run_job
from .sql import database_clock
from .steps import Group, StepOp, settle_steps

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "RUN_WIDTH",
    "PostgresRuns",
    "create_claim_sql",
    "horizon_sql",
    "step_rows",
    "step_sql",
    "writers_in_flight_sql",
]

T = TypeVar("T")

RUN_WIDTH = len(RUN_COLS.split(","))
# The lapsed try's error, as :data:`~._tasks.LAPSED` words it ($8: that text, in format()).
LAPSED_SQL = LAPSED.replace("'{owner}'", "'%s'")


def step_sql(p: str, *, group: bool = False) -> str:
    """A worker's step in one statement (autocommit: one round trip, one transaction).

    $1 the clock (NULL: ``now()``), $2 the task names (NULL: all), $3 how many to claim, $4
    the owner, $5 the lease ttl, $6/$7 the run and token a plain success finishes (NULL:
    none), $8 the lapsed error's format. When claiming, a lapsed try (its worker stopped
    renewing) is claimed again at once with its error recorded, or queued (past ``limit``),
    or failed (no tries left). Rows: ``'d'`` and the finished run; ``'c'``, a claimed run
    and one of its events (or NULLs). A refused finish changes nothing (every other part
    waits for ``done``).

    ``group``: the steps of several slots of one worker (:mod:`.steps`), each a plain success
    wanting at most one run: $6/$7 are arrays of runs and tokens, $3 an array saying which
    of them want a run; as many runs are claimed as there are finishes that were not refused
    and want one (none when all were refused).
    """
    cols = ", ".join(f"u.{c.strip()}" for c in RUN_COLS.split(","))
    ready = (
        f"FROM {p}task_runs r JOIN {p}tasks t ON t.name = r.task WHERE NOT t.paused "
        "AND ($2::text[] IS NULL OR r.task = ANY($2::text[]))"
    )
    go = "($6::int8 IS NULL OR EXISTS (SELECT 1 FROM done))"
    limit, claiming = "$3", "$3 > 0"
    finished = (
        "WHERE u.id = $6::int8 AND u.state = 'running' AND u.lease_owner = $4 "
        "AND u.lease_token = $7::int8 AND u.lease_expires_at > n.at"
    )
    want = ""
    if group:
        finished = (
            # u.id = ANY: each run found by its id in an index, whatever the statistics say
            # (on a young table they led to a scan of every open run).
            ", unnest($6::int8[], $7::int8[]) AS f(id, token) WHERE u.id = f.id "
            "AND u.id = ANY($6::int8[]) "
            "AND u.state = 'running' AND u.lease_owner = $4 AND u.lease_token = f.token "
            "AND u.lease_expires_at > n.at"
        )
        want = (
            "want AS (SELECT count(*) AS k FROM done JOIN unnest($6::int8[], $3::bool[]) "
            "AS w(id, wants) ON w.id = done.id WHERE w.wants), "
        )
        go = limit = "(SELECT k FROM want)"
        go, claiming = f"{go} > 0", "true"
    # A lapsed try's error appended to the run's errors (their JSON as errors_to_json has it).
    entry = (
        "(u.errors::jsonb || jsonb_build_array(jsonb_build_object('try', u.try_number, "
        "'error', format($8::text, u.lease_owner), 'traceback', NULL, 'at', n.at, "
        "'cause', 'worker_lost')))::text"
    )
    # A lapsed try does not count against retries, only against MAX_LOST_TRIES (after_lost).
    again = f"u.lost_tries + 1 < {MAX_LOST_TRIES}"
    # The entry of a lapsed try that is not claimed again at once: final when it fails the run.
    final_entry = entry.replace("'worker_lost')))", f"'worker_lost', 'final', NOT ({again}))))")
    return (
        "WITH n AS (SELECT coalesce($1::timestamptz, now()) AS at), "
        f"done AS (UPDATE {p}task_runs u SET state = 'success', finished_at = n.at, "
        "updated_at = n.at, lease_owner = NULL, lease_expires_at = NULL FROM n "
        f"{finished} RETURNING {cols}), {want}"
        f"gone AS (SELECT r.id {ready} AND r.state = 'running' "
        "AND r.lease_expires_at <= (SELECT at FROM n) FOR UPDATE OF r SKIP LOCKED), "
        f"c AS (SELECT r.id {ready} AND ((r.state = 'queued' AND (r.not_before IS NULL "
        "OR r.not_before <= (SELECT at FROM n))) OR (r.state = 'running' "
        f"AND r.lease_expires_at <= (SELECT at FROM n) AND r.lost_tries + 1 < {MAX_LOST_TRIES})) "
        f"ORDER BY r.id LIMIT {limit} FOR UPDATE OF r SKIP LOCKED), "
        f"lapsed AS (UPDATE {p}task_runs u SET state = CASE WHEN {again} "
        f"THEN 'queued' ELSE 'failed' END, errors = {final_entry}, updated_at = n.at, "
        "not_before = NULL, lease_owner = NULL, lease_expires_at = NULL, finished_at = CASE "
        f"WHEN {again} THEN NULL ELSE n.at END, lost_tries = u.lost_tries + 1 FROM gone, n "
        f"WHERE u.id = gone.id AND u.id NOT IN (SELECT id FROM c) AND {claiming} "
        f"AND {go} RETURNING u.id), "
        f"claimed AS (UPDATE {p}task_runs u SET state = 'running', "
        "try_number = u.try_number + 1, lease_owner = $4, lease_token = u.lease_token + 1, "
        "lease_expires_at = n.at + $5::interval, started_at = n.at, updated_at = n.at, "
        f"not_before = NULL, errors = CASE WHEN u.state = 'running' THEN {entry} "
        "ELSE u.errors END, lost_tries = CASE WHEN u.state = 'running' THEN u.lost_tries + 1 "
        f"ELSE u.lost_tries END FROM c, n WHERE u.id = c.id AND {go} RETURNING {cols}) "
        "SELECT 'd' AS kind, done.*, NULL::int8, NULL::text, NULL::text, NULL::text, "
        "NULL::text, NULL::timestamptz FROM done UNION ALL "
        f"SELECT 'c', u.*, {EVENT_COLS} FROM claimed u LEFT JOIN {p}task_run_events e "
        f"ON e.run_id = u.id LEFT JOIN {p}asset_events ev ON ev.id = e.event_id "
        f"ORDER BY 1, 2, {RUN_WIDTH + 2}"
    )


def _lock_match(key: str) -> str:
    """``pg_locks`` rows of the granted shared events lock (a 64-bit advisory key: its high
    half in ``classid``, its low half in ``objid``, ``objsubid`` 1)."""
    return (
        "l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock' AND l.objsubid = 1 "
        f"AND l.classid = (({key} >> 32) & 4294967295)::oid "
        f"AND l.objid = ({key} & 4294967295)::oid "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )


def horizon_sql(p: str, key: str) -> str:
    """The tasks (of $1; NULL: all) that are not paused and have a committed event after a
    cursor (their specs, as a JSON list, by name), the newest event id, and the transactions then holding the
    shared events lock (``virtualtransaction``), in one statement that takes no lock.

    Every event with a lower id than the newest one was inserted by a transaction that took
    the shared lock before its insert: once the listed holders have ended, every event up
    to that id has committed or rolled back (see :mod:`.tasks`)."""
    return (
        "SELECT (SELECT coalesce(jsonb_agg(jsonb_build_array(t.name, t.assets, t.mode, "
        "t.max_events, t.max_tries) ORDER BY t.name), '[]')::text "
        f"FROM {p}tasks t WHERE NOT t.paused AND t.removed_at IS NULL "
        "AND ($1::text[] IS NULL OR t.name = ANY($1)) "
        f"AND EXISTS (SELECT 1 FROM {p}task_cursors c WHERE c.task = t.name AND EXISTS "
        f"(SELECT 1 FROM {p}asset_events e WHERE e.asset_name = c.asset AND e.id > c.cursor))"
        f"), (SELECT coalesce(max(id), 0) FROM {p}asset_events), "
        f"ARRAY(SELECT l.virtualtransaction FROM pg_locks l WHERE {_lock_match(key)})"
    )


def writers_in_flight_sql(key: str) -> str:
    """Whether any of the transactions $1 (``virtualtransaction``) still holds the shared
    events lock."""
    return (
        f"SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE {_lock_match(key)} "
        "AND l.virtualtransaction = ANY($1::text[]))"
    )


# The batch window (:func:`~.._tasks.window_waits`) in this one statement: no window, or
# max_events pending (up to the horizon), or the oldest pending event window seconds old.
_WINDOW_OPEN = (
    "(t.batch_window = 0 OR (SELECT count(*) FROM (SELECT 1 FROM {p}asset_events e "
    "WHERE e.asset_name = c.asset AND e.id > c.cursor AND e.id <= blk.h "
    "LIMIT t.max_events) w) >= t.max_events OR (SELECT e.created_at FROM {p}asset_events e "
    "WHERE e.asset_name = c.asset AND e.id > c.cursor ORDER BY e.id LIMIT 1) "
    "<= (SELECT at FROM n) - t.batch_window * interval '1 second')"
)


def create_claim_sql(p: str, key: str) -> str:
    """Create the runs of a one-asset task from its events after its cursor (up to the
    horizon) and claim the first of them, in one statement (autocommit).

    $1 the task, $2 the horizon (NULL: read here, see below), $3 how many runs at most, $4 the
    clock (NULL: ``now()``), $5 the owner, $6 how many of the new runs to claim, $7 the lease
    ttl. Each run takes the next ``max_events`` events (what :func:`~._tasks.plan_runs` gives
    a one-asset task). The cursor moves only if it is still where it was read
    (``c.cursor = cur.cursor``, checked again on the row after a concurrent move): a worker
    that lost the race creates nothing.

    With $2 NULL the horizon is the newest event id, and nothing is created unless no
    transaction holds the shared events lock (:func:`horizon_sql`); otherwise the caller
    waits for the holders returned and runs it again with that id. With no committed event
    after the cursor no holder is returned: there is nothing to wait for (an event still
    committing wakes the workers with its notification). Rows: each claimed run
    (``RUN_COLS``) with one of its events (``EVENT_COLS``), in run and event order, then on
    every row how many runs were created, ``what`` (``'one'``: a one-asset task that is not
    paused; ``'other'``: a task on several assets; ``NULL``: paused or unknown), the horizon,
    the holders; with no run claimed, one row of NULLs with those four.
    """
    cols = ", ".join(f"r.{c.strip()}" for c in RUN_COLS.split(","))
    events = ", ".join(f"{c.strip()} AS ev_{c.strip()[3:]}" for c in EVENT_COLS.split(","))
    claim = "plan.k < $6"
    return (
        "WITH n AS (SELECT coalesce($4::timestamptz, now()) AS at), "
        "t AS (SELECT name, assets[1] AS asset, max_events, max_tries, batch_window, "
        f"CASE WHEN cardinality(assets) = 1 THEN 'one' ELSE 'other' END AS what FROM {p}tasks "
        "WHERE name = $1 AND NOT paused AND removed_at IS NULL), "
        f"blk AS (SELECT (SELECT what FROM t) AS what, coalesce($2::int8, (SELECT "
        f"coalesce(max(id), 0) FROM {p}asset_events)) AS h, CASE WHEN $2::int8 IS NULL "
        f"AND EXISTS (SELECT 1 FROM {p}task_cursors c JOIN t ON t.name = c.task "
        f"AND t.asset = c.asset JOIN {p}asset_events e ON e.asset_name = c.asset "
        "AND e.id > c.cursor WHERE t.what = 'one') THEN "
        f"ARRAY(SELECT l.virtualtransaction FROM pg_locks l WHERE {_lock_match(key)}) "
        "ELSE '{}'::text[] END AS holders), "
        f"cur AS (SELECT c.cursor, t.asset, t.max_events, t.max_tries FROM {p}task_cursors c "
        "JOIN t ON t.name = c.task AND t.asset = c.asset, blk WHERE t.what = 'one' "
        f"AND cardinality(blk.holders) = 0 AND {_WINDOW_OPEN.format(p=p)}), "
        "pend AS (SELECT e.id, (row_number() OVER (ORDER BY e.id) - 1) / cur.max_events AS k "
        f"FROM cur, LATERAL (SELECT e.id FROM {p}asset_events e WHERE e.asset_name = cur.asset "
        "AND e.id > cur.cursor AND e.id <= (SELECT h FROM blk) ORDER BY e.id "
        "LIMIT $3 * cur.max_events) e ORDER BY e.id), "
        f"moved AS (UPDATE {p}task_cursors c SET cursor = (SELECT max(id) FROM pend), "
        "updated_at = n.at, writer_kind = NULL, writer_name = NULL FROM cur, n "
        "WHERE c.task = $1 AND c.asset = cur.asset AND c.cursor = cur.cursor "
        "AND EXISTS (SELECT 1 FROM pend) RETURNING c.cursor), "
        f"plan AS (SELECT g.k, g.cnt, nextval(pg_get_serial_sequence('{p}task_runs', 'id')) "
        "AS run_id FROM (SELECT k, count(*) AS cnt FROM pend WHERE EXISTS "
        "(SELECT 1 FROM moved) GROUP BY k ORDER BY k) g), "
        f"runs AS (INSERT INTO {p}task_runs (id, task, state, try_number, max_tries, "
        "event_count, created_at, updated_at, started_at, lease_owner, lease_token, "
        "lease_expires_at) OVERRIDING SYSTEM VALUE SELECT plan.run_id, $1, "
        f"CASE WHEN {claim} THEN 'running' ELSE 'queued' END, "
        f"CASE WHEN {claim} THEN 1 ELSE 0 END, cur.max_tries, plan.cnt, n.at, n.at, "
        f"CASE WHEN {claim} THEN n.at END, CASE WHEN {claim} THEN $5 END, "
        f"CASE WHEN {claim} THEN 1 ELSE 0 END, CASE WHEN {claim} THEN n.at + $7::interval "
        f"END FROM plan, n, cur ORDER BY plan.k RETURNING {RUN_COLS}), "
        f"links AS (INSERT INTO {p}task_run_events (run_id, event_id, task, asset) "
        "SELECT plan.run_id, pend.id, $1, cur.asset FROM pend JOIN plan ON plan.k = pend.k, cur) "
        f"SELECT x.*, (SELECT count(*) FROM runs), blk.what, blk.h, blk.holders FROM blk "
        f"LEFT JOIN (SELECT {cols}, {events} "
        "FROM runs r JOIN plan ON plan.run_id = r.id JOIN pend ON pend.k = plan.k "
        f"JOIN {p}asset_events ev ON ev.id = pend.id WHERE r.state = 'running') x ON true "
        "ORDER BY x.id, x.ev_id"
    )


def step_rows(s: StepStatements, rows: Sequence[Any]) -> tuple[list[TaskRun], list[TaskRun]]:
    """The rows of :func:`step_sql`: the finished runs (``'d'``, without their events) and
    the claimed ones with their events (``'c'``), in run order."""
    finished: list[TaskRun] = []
    runs: dict[int, tuple[Any, list[AssetEvent]]] = {}
    for r in rows:
        values = tuple(r)
        if values[0] == "d":
            finished.append(s.run(values[1 : RUN_WIDTH + 1]))
            continue
        entry = runs.setdefault(values[1], (values[1 : RUN_WIDTH + 1], []))
        if values[RUN_WIDTH + 1] is not None:
            entry[1].append(s.event(values[RUN_WIDTH + 1 :]))
    return finished, [s.run(row, events) for row, events in runs.values()]


class PostgresRuns(PostgresConsumers):
    """Claims, finishes and leases of runs (see the module docstring)."""

    @property
    def events_lock(self) -> str:
        """The events lock taken exclusively (see :mod:`.tasks`)."""
        return events_lock(self.schema)

    @property
    def _events_key(self) -> str:
        return LOCK_KEY.replace("$1::text", "NULL" if self.schema is None else f"'{self.schema}'")

    @property
    def _steps(self) -> StepStatements:
        """The engine's statements of a step here (built on first use: the schema is known)."""
        s: StepStatements | None = self.__dict__.get("_step_statements")
        if s is None:
            # A finish's outlet events hold the events lock shared and wake the listeners,
            # as every transaction inserting events does (events_hook).
            share = events_prelude(self.schema)
            s = StepStatements(POSTGRES, self._prefix, self.events_lock, share)
            self.__dict__["_step_statements"] = s
        return s

    async def _in(self, conn: Any, job: Job[T]) -> T:
        """Run an engine job in ``conn``'s transaction."""
        return await run_job(
            job, conn, clock=database_clock(self.clock), channel=str, in_transaction=True
        )

    async def _claim(
        self,
        fetch: Callable[..., Awaitable[builtins.list[Any]]],
        owner: str,
        limit: int,
        span: timedelta,
        tasks: builtins.list[str] | None,
        finish: RunOutcome | None = None,
    ) -> tuple[TaskRun | None, builtins.list[TaskRun]]:
        """One statement: the plain success ``finish`` (no outlets; fenced), the lapsed tries
        of dead workers queued again (or failed), and up to ``limit`` ready runs claimed with
        their events. When ``finish`` is refused nothing changes and ``(None, [])`` returns."""
        done = finish.run_id if finish is not None else None
        token = finish.token if finish is not None else None
        rows = await fetch(
            self._step_sql,
            database_clock(self.clock),
            tasks,
            limit,
            owner,
            span,
            done,
            token,
            LAPSED_SQL,
        )
        finished, claimed = step_rows(self._steps, rows)
        return (finished[0] if finished else None), claimed

    async def _run_steps(self, conn: Any, group: Group, steps: builtins.list[StepOp]) -> None:
        """The statement of grouped steps (:mod:`.steps`), on the writer's ``conn``; a step
        whose finish was refused then gets why (read on the pool)."""
        owner, span, tasks = group
        sql: str | None = self.__dict__.get("_group_step_sql_text")
        if sql is None:
            sql = self.__dict__["_group_step_sql_text"] = step_sql(self._prefix, group=True)
        rows = await conn.fetch(
            sql, database_clock(self.clock), None if tasks is None else list(tasks),
            [s.wants for s in steps], owner, span, [s.finish.run_id for s in steps],
            [s.finish.token for s in steps], LAPSED_SQL,
        )  # fmt: skip
        settle_steps(steps, *step_rows(self._steps, rows))
        for step in steps:
            if not step.ran:
                refuse = functools.partial(self._refuse, owner=owner, outcome=step.finish)
                try:  # raises why
                    await self._transact("finishing a run", refuse)
                except Exception as exc:  # noqa: BLE001 - the refusal is its caller's
                    step.fail(exc)

    @property
    def _step_sql(self) -> str:
        cached: str | None = self.__dict__.get("_step_sql_text")
        if cached is None:
            cached = self.__dict__["_step_sql_text"] = step_sql(self._prefix)
        return cached

    async def _refuse(self, conn: Any, owner: str, outcome: RunOutcome) -> None:
        """Raise why ``owner`` could not finish ``outcome``'s run."""
        await self._in(conn, refuse(self._steps, owner, outcome))
