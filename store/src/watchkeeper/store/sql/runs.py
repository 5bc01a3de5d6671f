"""Runs of tasks, written once for both SQL databases: their rows as
:class:`~.._tasks.TaskRun`, their listings, lease renewals and breaks, retries, and the counts
the metrics read (the rules are :mod:`watchkeeper.store._tasks`').

- **Renewing** leases is one fenced ``UPDATE`` for all the runs of a worker: a run is renewed
  only while it is ``running`` under the same owner and token and its lease has not lapsed
  (what :func:`~.._tasks.lost_reason` checks), on the store's clock.
- **Listings** carry only the filters given, the state written into the SQL as a literal (one
  of ``RUN_STATES``, checked by the caller), so the index of open runs answers where a
  generic ``(:state IS NULL OR state = :state)`` plan scanned every run ever made (the worker
  lists its running runs at every heartbeat).
- **Counts** of tries and durations read JSON and time differences, which the two databases
  spell differently: there the statement is chosen per dialect (:data:`_TRY_COUNTS`,
  :data:`_DURATION`).

A worker's step (finishing, claiming, creating runs) is the hot path, and each database
groups it its own way: :class:`SqlRuns` hands it to the backend's :class:`RunStepper`.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any, Final, Protocol

from .._run_errors import bucketed
from .._tasks import (
    MAX_LOST_TRIES,
    RunOutcome,
    RunStep,
    TaskRun,
)
from ..errors import RunNotFoundError, RunStateError
from .engine import BEGIN, Dialect, Job, Stmt, count, rows, run
from .run_steps import RUN_COLS, StepStatements, create_runs_now, runs_with_events
from .runner import Runner

__all__ = ["RUN_COLS", "RunStatements", "RunStepper", "SqlRuns", "runs_with_events"]

_NO_LIMIT: Final = 2**62

# How each database reads a try's entry of the errors JSON (cause, final) and a run's duration.
_TRY_COUNTS: Final = {
    "sqlite": (
        "SELECT r.task, coalesce(json_extract(e.value, '$.cause'), CASE WHEN "
        "json_extract(e.value, '$.error') LIKE 'the lease of worker %' THEN 'worker_lost' "
        "ELSE 'task_error' END), coalesce(json_extract(e.value, '$.final'), 0), count(*) "
        "FROM {p}task_runs r, json_each(r.errors) e WHERE r.errors != '[]' GROUP BY 1, 2, 3"
    ),
    "postgresql": (
        "SELECT r.task, coalesce(e ->> 'cause', CASE WHEN e ->> 'error' LIKE "
        "'the lease of worker %' THEN 'worker_lost' ELSE 'task_error' END), "
        "coalesce((e ->> 'final')::boolean, false), count(*) "
        "FROM {p}task_runs r, jsonb_array_elements(r.errors::jsonb) e "
        "WHERE r.errors <> '[]' GROUP BY 1, 2, 3"
    ),
}
_DURATION: Final = {
    "sqlite": "(julianday(finished_at) - julianday(started_at)) * 86400.0",
    "postgresql": "extract(epoch FROM finished_at - started_at)::float8",
}


class RunStatements(StepStatements):
    """Every statement of runs in one dialect, for one table prefix."""

    def __init__(self, dialect: Dialect, prefix: str, lock_events: str | None = None) -> None:
        super().__init__(dialect, prefix, lock_events)
        sql = partial(dialect.compile, prefix=prefix)
        self.event_ids = sql(
            "SELECT run_id, event_id FROM {p}task_run_events "
            "WHERE run_id {in:ids:bigint} ORDER BY run_id, event_id"
        )
        # Fenced as lost_reason fences: running, same owner and token, not lapsed.
        self.renew = sql(
            "UPDATE {p}task_runs SET lease_expires_at = {expires} "
            "WHERE id {in:ids:bigint} AND (id || ':' || lease_token) {in:keys} "
            "AND lease_owner = :owner AND state = 'running' AND lease_expires_at > {now} "
            "RETURNING id"
        )
        self.break_leases = sql(
            "UPDATE {p}task_runs SET lease_expires_at = {now} "
            "WHERE state = 'running' AND lease_owner {in:owners}"
        )
        self.state = sql("SELECT state FROM {p}task_runs WHERE id = :id {for_update}")
        self.retry = sql(
            "UPDATE {p}task_runs SET state = 'queued', max_tries = failures + 1, "
            "not_before = NULL, finished_at = NULL, updated_at = {now}, lost_tries = CASE "
            "WHEN lost_tries < :most THEN lost_tries ELSE :most END WHERE id = :id"
        )
        self.try_counts = sql(_TRY_COUNTS[dialect.name])

    def listing(self, task: bool, state: str | None, before: bool) -> Stmt:
        """Runs newest first with only these filters (``:task``, ``:before``), ``:limit``."""
        where = []
        if task:
            where.append("task = :task")
        if state is not None:
            where.append(f"state = '{state}'")
        if before:
            where.append("id < :before")
        sql = f"SELECT {RUN_COLS} FROM {{p}}task_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return self.dialect.compile(sql + " ORDER BY id DESC LIMIT :limit", self.prefix)

    def durations(self, bounds: tuple[float, ...]) -> Stmt:
        """Successful runs by task and duration bucket: count and total seconds."""
        took = _DURATION[self.dialect.name]
        bucket = "CASE " + "".join(f"WHEN {took} <= {b!r} THEN {i} " for i, b in enumerate(bounds))
        return self.dialect.compile(
            f"SELECT task, {bucket}ELSE {len(bounds)} END, count(*), sum({took}) "
            "FROM {p}task_runs WHERE state = 'success' GROUP BY 1, 2",
            self.prefix,
        )


# -- the jobs --------------------------------------------------------------------------------


def renew_leases(s: RunStatements, owner: str, runs: dict[int, int], ttl: float) -> Job[set[int]]:
    keys = [f"{run_id}:{token}" for run_id, token in runs.items()]
    found = yield rows(s.renew, owner=owner, ids=list(runs), keys=keys, ttl=ttl)
    return {r[0] for r in found}


def break_leases(s: RunStatements, owners: list[str]) -> Job[int]:
    changed: int = yield count(s.break_leases, owners=owners)
    return changed


def retry_run(s: RunStatements, run_id: int) -> Job[TaskRun]:
    yield BEGIN
    found = yield rows(s.state, id=run_id)
    if not found:
        raise RunNotFoundError(run_id)
    if found[0][0] != "failed":
        raise RunStateError(run_id, found[0][0], "only a failed run can be retried")
    yield run(s.retry, id=run_id, most=MAX_LOST_TRIES - 1)
    return (yield from runs_with_events(s, [run_id]))[0]


def list_runs(
    s: RunStatements, task: str | None, state: str | None, limit: int | None, before: int | None
) -> Job[list[TaskRun]]:
    stmt = s.listing(task is not None, state, before is not None)
    params: dict[str, Any] = {"limit": _NO_LIMIT if limit is None else limit}
    if task is not None:
        params["task"] = task
    if before is not None:
        params["before"] = before
    return [s.run(row) for row in (yield rows(stmt, **params))]


def run_event_ids(s: RunStatements, run_ids: list[int]) -> Job[dict[int, list[int]]]:
    found: dict[int, list[int]] = {}
    for run_id, event_id in (yield rows(s.event_ids, ids=run_ids)):
        found.setdefault(run_id, []).append(event_id)
    return found


def count_tries(s: RunStatements) -> Job[dict[tuple[str, str, bool], int]]:
    found = yield rows(s.try_counts)
    return {(task, cause, bool(final)): n for task, cause, final, n in found}


def run_durations(
    s: RunStatements, bounds: tuple[float, ...]
) -> Job[dict[str, tuple[list[int], float]]]:
    return bucketed((yield rows(s.durations(bounds))), len(bounds))


# -- the driver ------------------------------------------------------------------------------


class RunStepper(Protocol):
    """What each database does its own way: a worker's steps, grouped by its writer."""

    @property
    def events_lock(self) -> str | None:
        """The statement taking the events lock exclusively, where event ids can commit out
        of id order (PostgreSQL); ``None`` where they cannot (SQLite)."""
        ...

    async def _astep_runs(
        self,
        owner: str,
        finish: RunOutcome | None,
        claim: int,
        ttl: timedelta,
        tasks: list[str] | None,
        create: int,
        peers: int,
    ) -> RunStep: ...


class SqlRuns:
    """The runs driver (:class:`~watchkeeper.store.protocols.RunsDriver`) of a SQL store."""

    __slots__ = ("_runner", "_statements", "_stepper")

    def __init__(self, runner: Runner, stepper: RunStepper) -> None:
        self._runner = runner
        self._stepper = stepper
        self._statements: RunStatements | None = None

    def __repr__(self) -> str:
        return f"<SqlRuns over {self._runner!r}>"

    @property
    def statements(self) -> RunStatements:
        """The statements (built on first use: a store knows its schema once it is set up)."""
        s = self._statements
        if s is None:
            runner = self._runner
            lock = self._stepper.events_lock
            s = self._statements = RunStatements(runner.dialect, runner.prefix, lock)
        return s

    async def _acreate_runs(self, name: str, max_runs: int) -> list[TaskRun]:
        return await self._runner.write(
            partial(create_runs_now, self.statements, name, max_runs), what="creating runs"
        )

    async def _astep_runs(
        self,
        owner: str,
        finish: RunOutcome | None,
        claim: int,
        ttl: timedelta,
        tasks: list[str] | None,
        create: int,
        peers: int,
    ) -> RunStep:
        return await self._stepper._astep_runs(owner, finish, claim, ttl, tasks, create, peers)

    async def _aheartbeat_runs(self, owner: str, runs: dict[int, int], ttl: timedelta) -> set[int]:
        return await self._runner.write(
            partial(renew_leases, self.statements, owner, runs, ttl.total_seconds()),
            what="renewing run leases",
        )

    async def _abreak_run_leases(self, owners: list[str]) -> int:
        return await self._runner.write(
            partial(break_leases, self.statements, owners), what="breaking run leases"
        )

    async def _aget_run(self, run_id: int) -> TaskRun:
        found = await self._runner.read(
            partial(runs_with_events, self.statements, [run_id]), what="reading a run"
        )
        if not found:
            raise RunNotFoundError(run_id)
        return found[0]

    async def _alist_runs(
        self, task: str | None, state: str | None, limit: int | None, before: int | None
    ) -> list[TaskRun]:
        return await self._runner.read(
            partial(list_runs, self.statements, task, state, limit, before), what="listing runs"
        )

    async def _arun_event_ids(self, run_ids: list[int]) -> dict[int, list[int]]:
        return await self._runner.read(
            partial(run_event_ids, self.statements, run_ids), what="listing the events of runs"
        )

    async def _aretry_run(self, run_id: int) -> TaskRun:
        return await self._runner.write(
            partial(retry_run, self.statements, run_id), what="retrying a run"
        )

    async def _acount_tries(self) -> dict[tuple[str, str, bool], int]:
        return await self._runner.read(
            partial(count_tries, self.statements), what="counting the tries of runs"
        )

    async def _arun_durations(
        self, bounds: tuple[float, ...]
    ) -> dict[str, tuple[list[int], float]]:
        return await self._runner.read(
            partial(run_durations, self.statements, bounds), what="measuring run durations"
        )
