"""A worker's step, written once for both SQL databases: finish a try (fenced by its lease),
create runs from a task's pending events, claim ready runs (the rules are
:mod:`watchkeeper.store._tasks`').

- **Finishing** is fenced by the lease: the common case (a success without outlet events) is
  one ``UPDATE ... WHERE`` the owner, token and unexpired lease still hold; otherwise the row
  is read (``FOR UPDATE`` on PostgreSQL), :func:`~.._tasks.lost_reason` says why a refused
  finish is refused (nothing written), and :func:`~.._tasks.after_failure` what a failure
  does. Outlet events are inserted under the events lock where event ids can commit out of
  order (PostgreSQL: the shared lock of :mod:`watchkeeper.store.postgres.tasks`).
- **Creating** runs reads each scheduled asset's events after the task's cursor (up to a
  *horizon* on PostgreSQL, below which every event has committed), plans them with
  :func:`~.._tasks.plan_runs` and moves the cursors; the caller serialises the creations of
  one task (SQLite's writer; PostgreSQL: the task row, or the cursor compare of its
  one-statement creation).
- **Grouping**: :func:`step_group` runs the steps that reach a writer together as one: the
  plain successes in one statement, each fenced by its own run, token and owner, the other
  finishes one by one (a refused finish fails alone, having written nothing), then one claim
  per owner, lease and task list, creating runs at most once when too few are ready. That is
  one finish, one claim, one lapsed-lease check and one read of the claimed runs' events
  where eight slots finishing at once made eight of each.
- **Claiming** on SQLite is three statements (lapsed tries recorded, the ready runs leased,
  their events read): SQLite has no ``UPDATE`` inside ``WITH``. PostgreSQL claims (and
  finishes plain successes) in one statement, :mod:`watchkeeper.store.postgres.runs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from typing import Any, Final, NamedTuple

from .._events import AssetEvent
from .._run_errors import lapsed_error
from .._tasks import (
    RunError,
    RunOutcome,
    RunStep,
    TaskRun,
    TaskSpec,
    after_failure,
    after_lost,
    errors_from_json,
    errors_to_json,
    ids_from_json,
    ids_to_json,
    lost_reason,
    plan_runs,
    window_waits,
)
from ..errors import AssetNotFoundError, RunLeaseLostError, RunNotFoundError, TaskNotFoundError
from .engine import BEGIN, Dialect, Job, many, rows, run

__all__ = [
    "RUN_COLS",
    "StepItem",
    "StepStatements",
    "check_lease",
    "claim_or_create",
    "create_runs",
    "create_runs_now",
    "finish_run",
    "refuse",
    "runs_with_events",
    "step_group",
]

RUN_COLS: Final = (
    "id, task, state, try_number, max_tries, event_count, created_at, updated_at, started_at, "
    "finished_at, not_before, lease_owner, lease_token, lease_expires_at, errors, "
    "outlet_event_ids, failures, lost_tries"
)
EVENT_COLS: Final = "ev.id, ev.asset_name, ev.watcher, ev.payload, ev.dedup_key, ev.created_at"

_NO_LIMIT: Final = 2**62
_SPEC: Final = (
    "SELECT name, assets, mode, max_events, max_tries, paused, batch_window, max_active_runs, "
    "removed_at FROM {p}tasks"
)
_READY: Final = (
    "SELECT r.id FROM {p}task_runs r JOIN {p}tasks t ON t.name = r.task WHERE NOT t.paused "
    "AND r.state = 'queued' AND (r.not_before IS NULL OR r.not_before <= {now})"
)


class StepStatements:
    """The statements of a step in one dialect, for one table prefix, and the row mapping of
    runs. Where event ids can commit out of id order (PostgreSQL): ``lock_events`` takes the
    events lock exclusively, ``share_events`` shared (and wakes the listeners of events)."""

    def __init__(
        self,
        dialect: Dialect,
        prefix: str,
        lock_events: str | None = None,
        share_events: str | None = None,
    ) -> None:
        self.dialect = dialect
        self.prefix = prefix
        sql = partial(dialect.compile, prefix=prefix)
        self.by_ids = sql(
            f"SELECT {RUN_COLS} FROM {{p}}task_runs WHERE id {{in:ids:bigint}} ORDER BY id"
        )
        self.events = sql(
            f"SELECT e.run_id, {EVENT_COLS} FROM {{p}}task_run_events e "
            "JOIN {p}asset_events ev ON ev.id = e.event_id "
            "WHERE e.run_id {in:ids:bigint} ORDER BY e.event_id"
        )
        self.lock_events = None if lock_events is None else sql(lock_events)
        self.share_events = None if share_events is None else sql(share_events)
        self.spec = sql(_SPEC + " WHERE name = :name")
        self.spec_locked = sql(_SPEC + " WHERE name = :name {for_update}")
        self.unpaused = sql(
            "SELECT name FROM {p}tasks WHERE NOT paused AND removed_at IS NULL ORDER BY name"
        )
        self.cursors = sql("SELECT asset, cursor, {now} FROM {p}task_cursors WHERE task = :name")
        self.pending = sql(
            "SELECT id, created_at FROM {p}asset_events WHERE asset_name = :asset "
            "AND id > :cursor AND id <= :horizon ORDER BY id LIMIT :limit"
        )
        self.insert_run = sql(
            "INSERT INTO {p}task_runs (task, state, try_number, max_tries, event_count, "
            "created_at, updated_at) VALUES (:task, 'queued', 0, :tries, :n, {now}, {now}) "
            "RETURNING id"
        )
        self.link = sql(
            "INSERT INTO {p}task_run_events (run_id, event_id, task, asset) "
            "VALUES (:run, :event, :task, :asset)"
        )
        self.move = sql(
            "UPDATE {p}task_cursors SET cursor = :cursor, updated_at = {now}, "
            "writer_kind = NULL, writer_name = NULL WHERE task = :task AND asset = :asset"
        )
        done = (
            "UPDATE {p}task_runs SET state = 'success', finished_at = {now}, "
            "updated_at = {now}, lease_owner = NULL, lease_expires_at = NULL WHERE id = :id "
            "AND state = 'running' AND lease_owner = :owner AND lease_token = :token "
            f"AND lease_expires_at > {{now}} RETURNING {RUN_COLS}"
        )
        self.done = sql(done)
        # Plain successes of a group in one statement, each fenced by its own key.
        self.done_all = sql(
            "UPDATE {p}task_runs SET state = 'success', finished_at = {now}, "
            "updated_at = {now}, lease_owner = NULL, lease_expires_at = NULL "
            "WHERE id {in:ids:bigint} AND state = 'running' AND lease_expires_at > {now} "
            "AND (id || ':' || lease_token || ':' || lease_owner) {in:keys} "
            f"RETURNING {RUN_COLS}"
        )
        self.lease = sql(
            "SELECT state, lease_owner, lease_token, lease_expires_at, try_number, max_tries, "
            "errors, task, failures, {now} FROM {p}task_runs WHERE id = :id {for_update}"
        )
        self.failed = sql(
            "UPDATE {p}task_runs SET state = :state, not_before = {ts:not_before}, "
            "updated_at = {now}, errors = :errors, lease_owner = NULL, lease_expires_at = NULL, "
            "finished_at = CASE WHEN :final THEN {now} END, failures = failures + 1 "
            f"WHERE id = :id RETURNING {RUN_COLS}"
        )
        self.assets = sql("SELECT name, id FROM {p}assets WHERE active AND name {in:names}")
        self.emit = sql(
            "INSERT INTO {p}asset_events (asset_id, asset_name, watcher, payload, dedup_key, "
            "created_at) VALUES (:asset_id, :asset, :watcher, :payload, NULL, {now}) RETURNING id"
        )
        self.outlets = sql(
            f"UPDATE {{p}}task_runs SET outlet_event_ids = :ids WHERE id = :id RETURNING {RUN_COLS}"
        )
        # SQLite's claim (PostgreSQL's is one statement): with and without a task filter.
        only = " AND r.task {in:tasks}"
        lapsed = (
            "SELECT r.id, r.try_number, r.lost_tries, r.lease_owner, r.errors, {now} "
            "FROM {p}task_runs r JOIN {p}tasks t ON t.name = r.task WHERE r.state = 'running' "
            "AND NOT t.paused AND r.lease_expires_at <= {now}"
        )
        self.lapsed = (sql(lapsed), sql(lapsed + only))
        self.lost = sql(
            "UPDATE {p}task_runs SET state = :state, errors = :errors, updated_at = {now}, "
            "not_before = NULL, finished_at = CASE WHEN :final THEN {now} END, "
            "lease_owner = NULL, lease_expires_at = NULL, lost_tries = lost_tries + 1 "
            "WHERE id = :id"
        )
        claim = (
            "UPDATE {p}task_runs SET state = 'running', try_number = try_number + 1, "
            "lease_owner = :owner, lease_token = lease_token + 1, lease_expires_at = {expires}, "
            "started_at = {now}, updated_at = {now}, not_before = NULL WHERE id IN ("
        )
        tail = f" ORDER BY r.id LIMIT :limit) RETURNING {RUN_COLS}"
        self.claim = (sql(claim + _READY + tail), sql(claim + _READY + only + tail))
        self.anything = sql(
            "SELECT EXISTS (SELECT 1 FROM {p}task_runs WHERE state = 'queued' "
            "AND (not_before IS NULL OR not_before <= {now})) OR EXISTS (SELECT 1 "
            "FROM {p}task_runs WHERE state = 'running' AND lease_expires_at <= {now}) "
            "OR (:create AND EXISTS (SELECT 1 FROM {p}task_cursors c JOIN {p}tasks t "
            "ON t.name = c.task WHERE NOT t.paused AND t.removed_at IS NULL AND EXISTS (SELECT 1 "
            "FROM {p}asset_events e WHERE e.asset_name = c.asset AND e.id > c.cursor)))"
        )

    def run(self, row: Sequence[Any], events: Sequence[AssetEvent] = ()) -> TaskRun:
        """A run from its ``RUN_COLS`` row."""
        ts = self.dialect.timestamp  # the hot path: no helper per column
        return TaskRun(
            id=row[0], task=row[1], state=row[2], try_number=row[3], max_tries=row[4],
            event_count=row[5], created_at=ts(row[6]), updated_at=ts(row[7]),
            started_at=None if row[8] is None else ts(row[8]),
            finished_at=None if row[9] is None else ts(row[9]),
            not_before=None if row[10] is None else ts(row[10]),
            lease_owner=row[11], lease_token=row[12],
            lease_expires_at=None if row[13] is None else ts(row[13]),
            errors=errors_from_json(row[14]), outlet_event_ids=ids_from_json(row[15]),
            events=tuple(events), failures=row[16], lost_tries=row[17],
        )  # fmt: skip

    def event(self, row: Sequence[Any]) -> AssetEvent:
        """An event from its ``EVENT_COLS`` row (the payload decoded when it is read)."""
        ts = self.dialect.timestamp
        return AssetEvent.from_json(row[0], row[1], row[2], row[3], row[4], ts(row[5]))

    def task_spec(self, row: Sequence[Any]) -> TaskSpec | None:
        """A task's spec from its ``_SPEC`` row; ``None`` when it gets no new runs (paused,
        or removed from the definitions)."""
        if row[5] or row[8] is not None:
            return None
        assets = self.dialect.json_list(row[1])
        return TaskSpec(row[0], tuple(assets), row[2], row[3], row[4], row[6], row[7])


def runs_with_events(s: StepStatements, run_ids: list[int]) -> Job[list[TaskRun]]:
    """The runs ``run_ids`` (by id), each with its events."""
    if not run_ids:
        return []
    found = yield rows(s.by_ids, ids=run_ids)
    if not found:
        return []
    events: dict[int, list[AssetEvent]] = {}
    for r in (yield rows(s.events, ids=[row[0] for row in found])):
        events.setdefault(r[0], []).append(s.event(r[1:]))
    return [s.run(row, events.get(row[0], ())) for row in found]


# -- creating runs ---------------------------------------------------------------------------


def create_runs(
    s: StepStatements, spec: TaskSpec, max_runs: int, horizon: int | None = None
) -> Job[list[int]]:
    """Up to ``max_runs`` runs of ``spec`` from its pending events (ids up to ``horizon``),
    its cursors moved past them; their ids. The caller serialises creations of the task."""
    name = spec.name
    read = yield rows(s.cursors, name=name)
    cursors = {r[0]: r[1] for r in read}
    pending: dict[str, list[tuple[int, str]]] = {}
    most = _NO_LIMIT if horizon is None else horizon
    ts, oldest = s.dialect.timestamp, None
    for asset in spec.assets:
        found = yield rows(
            s.pending, asset=asset, cursor=cursors.get(asset, 0), horizon=most,
            limit=max_runs * spec.max_events,
        )  # fmt: skip
        pending[asset] = [(r[0], asset) for r in found]
        if found and (oldest is None or ts(found[0][1]) < oldest):
            oldest = ts(found[0][1])
    count = sum(len(p) for p in pending.values())
    if read and window_waits(spec, count, oldest, ts(read[0][2])):
        return []
    plans = plan_runs(spec, pending, max_runs)
    run_ids: list[int] = []
    for taken, _ in plans:
        found = yield rows(s.insert_run, task=name, tries=spec.max_tries, n=len(taken))
        run_ids.append(found[0][0])
    if not plans:
        return run_ids
    yield many(
        s.link,
        [
            {"run": run_id, "event": event_id, "task": name, "asset": asset}
            for run_id, (taken, _) in zip(run_ids, plans, strict=True)
            for event_id, asset in taken
        ],
    )
    moved: dict[str, int] = {}
    for _, after in plans:
        moved.update(after)
    yield many(s.move, [{"cursor": c, "task": name, "asset": a} for a, c in moved.items()])
    return run_ids


def create_runs_now(s: StepStatements, name: str, max_runs: int) -> Job[list[TaskRun]]:
    """``acreate_runs``: the task row held, every event below the ids read committed (the
    events lock, where ids commit out of order)."""
    yield BEGIN
    found = yield rows(s.spec_locked, name=name)
    if not found:
        raise TaskNotFoundError(f"task {name!r}")
    spec = s.task_spec(found[0])
    if spec is None:
        return []
    if s.lock_events is not None:
        yield run(s.lock_events)
    run_ids = yield from create_runs(s, spec, max_runs)
    return (yield from runs_with_events(s, run_ids))


# -- finishing -------------------------------------------------------------------------------


def check_lease(s: StepStatements, owner: str, outcome: RunOutcome) -> Job[Sequence[Any]]:
    """The run's row as fencing needs it (``now`` last, parsed) if ``owner`` holds its lease
    with the outcome's token; else raise why (:func:`~.._tasks.lost_reason`)."""
    found = yield rows(s.lease, id=outcome.run_id)
    if not found:
        raise RunNotFoundError(outcome.run_id)
    ts = s.dialect.timestamp
    state, holder, held, expires, *_, now = found[0]
    now = ts(now)
    at = None if expires is None else ts(expires)
    reason = lost_reason(state, holder, held, at, owner, outcome.token, now)
    if reason is not None:
        raise RunLeaseLostError(outcome.run_id, owner, outcome.token, reason)
    return (*found[0][:-1], now)


def refuse(s: StepStatements, owner: str, outcome: RunOutcome) -> Job[None]:
    """Raise why a fenced finish of ``outcome`` changed nothing."""
    yield from check_lease(s, owner, outcome)
    raise RunLeaseLostError(outcome.run_id, owner, outcome.token, "its lease changed meanwhile")


def finish_run(s: StepStatements, owner: str, outcome: RunOutcome) -> Job[TaskRun]:
    """Record ``outcome`` if ``owner`` still holds the run's lease with its token; else raise
    :class:`RunLeaseLostError` (or :class:`RunNotFoundError`) having written nothing."""
    run_id = outcome.run_id
    if not outcome.success:
        row = yield from check_lease(s, owner, outcome)
        try_number, max_tries, errors, failures, now = row[4], row[5], row[6], row[8], row[9]
        new_state, not_before = after_failure(
            failures + 1, max_tries, now, outcome.retry_delay, retry=outcome.retry
        )
        final = new_state == "failed"
        entry = RunError(
            try_number, outcome.error or "failed", outcome.traceback, now, outcome.cause, final
        )
        found = yield rows(
            s.failed, id=run_id, state=new_state, not_before=not_before, final=final,
            errors=errors_to_json((*errors_from_json(errors), entry)),
        )  # fmt: skip
        return s.run(found[0])
    found = yield rows(s.done, id=run_id, owner=owner, token=outcome.token)  # the common case
    if not found:
        yield from refuse(s, owner, outcome)
    if not outcome.outlets:
        return s.run(found[0])
    task = found[0][1]
    names = sorted({o.asset for o in outcome.outlets})
    assets = dict((yield rows(s.assets, names=names)))
    for name in names:
        if name not in assets:
            raise AssetNotFoundError(name)
    if s.share_events is not None:
        yield run(s.share_events)
    ids: list[int] = []
    for o in outcome.outlets:
        made = yield rows(
            s.emit, asset_id=assets[o.asset], asset=o.asset, watcher=f"task:{task}",
            payload=o.payload_json,
        )  # fmt: skip
        ids.append(made[0][0])
    return s.run((yield rows(s.outlets, id=run_id, ids=ids_to_json(sorted(ids))))[0])


# -- claiming (SQLite) -----------------------------------------------------------------------


def claim_runs(
    s: StepStatements, owner: str, limit: int, ttl: float, tasks: Sequence[str] | None
) -> Job[list[TaskRun]]:
    """Up to ``limit`` ready runs leased to ``owner``; first, the tries whose worker stopped
    renewing recorded, then retried or (no tries left) failed."""
    only = {} if tasks is None else {"tasks": list(tasks)}
    ts = s.dialect.timestamp
    for run_id, try_number, lost_tries, lease_owner, errors, now in (
        yield rows(s.lapsed[tasks is not None], **only)
    ):
        state = after_lost(lost_tries + 1)
        final = state == "failed"
        lost = lapsed_error(lease_owner, try_number, ts(now), final=final)
        entries = errors_to_json((*errors_from_json(errors), lost))
        yield run(s.lost, id=run_id, state=state, errors=entries, final=final)
    found = yield rows(s.claim[tasks is not None], owner=owner, ttl=ttl, limit=limit, **only)
    if not found:
        return []
    found = sorted(found)
    events: dict[int, list[AssetEvent]] = {}
    for r in (yield rows(s.events, ids=[row[0] for row in found])):
        events.setdefault(r[0], []).append(s.event(r[1:]))
    return [s.run(row, events.get(row[0], ())) for row in found]


def claim_or_create(
    s: StepStatements, owner: str, claim: int, ttl: float, tasks: Sequence[str] | None, create: int
) -> Job[tuple[list[TaskRun], int]]:
    """The runs claimed, creating up to ``create`` runs per task first when too few are
    ready; and how many were created."""
    claimed = (yield from claim_runs(s, owner, claim, ttl, tasks)) if claim else []
    created = 0
    if create and len(claimed) < claim:
        names = list(tasks) if tasks is not None else [r[0] for r in (yield rows(s.unpaused))]
        for name in names:
            found = yield rows(s.spec, name=name)
            spec = s.task_spec(found[0]) if found else None
            if spec is not None:
                created += len((yield from create_runs(s, spec, create)))
        claimed += yield from claim_runs(s, owner, claim - len(claimed), ttl, tasks)
    return claimed, created


# -- steps, alone or grouped -----------------------------------------------------------------


class StepItem(NamedTuple):
    """The arguments of one step (``tasks`` a tuple, so that steps can be grouped by it)."""

    owner: str
    finish: RunOutcome | None
    claim: int
    ttl: timedelta
    tasks: tuple[str, ...] | None
    create: int


def _plain_successes(s: StepStatements, items: Sequence[StepItem]) -> Job[dict[int, TaskRun]]:
    """The plain successes (no outlets) among ``items`` recorded in one statement, each
    fenced by its run, token and owner: the finished runs by item index. Those it did not
    finish are left to :func:`finish_run`, which says why (it writes nothing for them)."""
    plain: dict[int, int] = {}
    keys: list[str] = []
    for i, item in enumerate(items):
        f = item.finish
        if f is not None and f.success and not f.outlets and f.run_id not in plain:
            plain[f.run_id] = i  # a run finished twice: the first finishes, the second is refused
            keys.append(f"{f.run_id}:{f.token}:{item.owner}")
    if len(plain) < 2:
        return {}  # one alone: finish_run's own statement is as short
    found = yield rows(s.done_all, ids=list(plain), keys=keys)
    return {plain[row[0]]: s.run(row) for row in found}


def step_group(s: StepStatements, items: Sequence[StepItem]) -> Job[list[Any]]:
    """The steps ``items`` as one (see the module docstring): each one's :class:`RunStep`, or
    the error that refused its finish.

    Same effects as the steps one after the other, except that every finish comes before
    every claim, and which of the grouped steps gets which of the claimed runs."""
    outcomes: list[Any] = []
    claims: dict[tuple[str, timedelta, tuple[str, ...] | None], list[int]] = {}
    done = yield from _plain_successes(s, items)
    for i, item in enumerate(items):
        finished = None
        if item.finish is not None:
            try:
                finished = done.get(i) or (yield from finish_run(s, item.owner, item.finish))
            except (RunLeaseLostError, RunNotFoundError) as exc:  # raised before any write
                outcomes.append(exc)
                continue
        outcomes.append(RunStep(finished, ()))
        if item.claim:
            claims.setdefault((item.owner, item.ttl, item.tasks), []).append(i)
    for (owner, ttl, tasks), indices in claims.items():
        want = sum(items[i].claim for i in indices)
        create = max(items[i].create for i in indices)
        claimed, created = yield from claim_or_create(
            s, owner, want, ttl.total_seconds(), tasks, create
        )
        for i in indices:
            take = items[i].claim
            # The creation is reported to the step that asked for it (the largest).
            made = created if create and items[i].create == create else 0
            created -= made
            outcomes[i] = RunStep(outcomes[i].finished, tuple(claimed[:take]), made)
            del claimed[:take]
    return outcomes
