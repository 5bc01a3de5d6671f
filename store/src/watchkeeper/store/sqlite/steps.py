"""A worker's step on SQLite: finish a run, claim ready ones, create runs from pending events.

:func:`step` is one operation of the group-commit writer. Neighbouring steps of a batch run
together (:data:`RUN_STEPS`, an :class:`~.writer.OpGroup`): each finish on its own, fenced by
its lease token (a refused one fails alone and writes nothing), then one claim for all the
steps of one owner, lease and task list, creating runs at most once when too few are ready.
With eight slots finishing at once that is one claim statement, one lapsed-lease check and one
read of the claimed runs' events where eight steps made eight of each.

Also here: how a run's row becomes a :class:`~.._tasks.TaskRun`, which :mod:`.tasks` shares.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, NamedTuple

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
    lapsed_error,
    lost_reason,
    plan_runs,
)
from .._types import AssetEvent, AssetScope
from ..errors import RunLeaseLostError, RunNotFoundError, TaskNotFoundError
from . import meta
from .schema import from_db, to_db
from .tasks_schema import EVENT_COLS, LAPSED_RUNS, READY_RUNS, RUN_COLS

if TYPE_CHECKING:
    from .writer import Tx

__all__ = [
    "RUN_STEPS",
    "StepItem",
    "create_runs",
    "lease_row",
    "run_from_row",
    "runs_with_events",
    "spec_from_row",
    "step",
    "task_spec",
]

Row = tuple[Any, ...]


def _opt(text: str | None) -> datetime | None:
    return None if text is None else from_db(text)


def run_from_row(row: Row, events: Sequence[AssetEvent] = ()) -> TaskRun:
    """A run from its ``RUN_COLS`` row."""
    return TaskRun(
        id=row[0], task=row[1], state=row[2], try_number=row[3], max_tries=row[4],
        event_count=row[5], created_at=from_db(row[6]), updated_at=from_db(row[7]),
        started_at=_opt(row[8]), finished_at=_opt(row[9]), not_before=_opt(row[10]),
        lease_owner=row[11], lease_token=row[12], lease_expires_at=_opt(row[13]),
        errors=errors_from_json(row[14]), outlet_event_ids=ids_from_json(row[15]),
        events=tuple(events), failures=row[16], lost_tries=row[17],
    )  # fmt: skip


def runs_with_events(conn: Any, run_ids: Sequence[int]) -> list[TaskRun]:
    """The runs ``run_ids`` (by id), each with its events."""
    if not run_ids:
        return []
    marks = ", ".join("?" * len(run_ids))
    rows = conn.execute(
        f"SELECT {RUN_COLS} FROM task_runs WHERE id IN ({marks}) ORDER BY id", run_ids
    ).fetchall()
    return _with_events(conn, rows)


def _with_events(conn: Any, rows: Sequence[Row]) -> list[TaskRun]:
    """Runs from their rows, with their events (one query)."""
    if not rows:
        return []
    ids = [row[0] for row in rows]
    events: dict[int, list[AssetEvent]] = {}
    for r in conn.execute(
        f"SELECT e.run_id, {EVENT_COLS} FROM task_run_events e "
        f"JOIN asset_events ev ON ev.id = e.event_id WHERE e.run_id IN "
        f"({', '.join('?' * len(ids))}) ORDER BY e.event_id",
        ids,
    ):
        events.setdefault(r[0], []).extend(meta.events_result([r[1:]]))
    return [run_from_row(row, events.get(row[0], ())) for row in rows]


def spec_from_row(row: Row) -> TaskSpec:
    """A task's spec from its ``name, assets, mode, max_events, max_tries`` row."""
    return TaskSpec(row[0], tuple(json.loads(row[1])), row[2], row[3], row[4])


def task_spec(tx: Tx, name: str) -> tuple[TaskSpec, bool]:
    """Task ``name``'s spec and whether it is paused (:class:`TaskNotFoundError` if unknown)."""
    row = tx.conn.execute(
        "SELECT name, assets, mode, max_events, max_tries, paused FROM tasks WHERE name = ?",
        (name,),
    ).fetchone()
    if row is None:
        raise TaskNotFoundError(f"task {name!r}")
    return spec_from_row(row), bool(row[5])


def lease_row(tx: Tx, run_id: int) -> Row:
    """What fencing needs of run ``run_id``: state, lease, tries, errors, task, failures."""
    row = tx.conn.execute(
        "SELECT state, lease_owner, lease_token, lease_expires_at, try_number, max_tries, "
        "errors, task, failures FROM task_runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        raise RunNotFoundError(run_id)
    return tuple(row)


# -- creating runs --------------------------------------------------------------------------------


def create_runs(tx: Tx, name: str, max_runs: int) -> list[int]:
    """Up to ``max_runs`` runs of task ``name`` from its pending events, its cursors moved
    past them; their ids."""
    conn = tx.conn
    spec, paused = task_spec(tx, name)
    if paused:
        return []
    cursors = dict(conn.execute("SELECT asset, cursor FROM task_cursors WHERE task = ?", (name,)))
    pending: dict[str, list[tuple[int, str]]] = {}
    for asset in spec.assets:
        rows = conn.execute(
            "SELECT id FROM asset_events WHERE asset_name = ? AND id > ? ORDER BY id LIMIT ?",
            (asset, cursors.get(asset, 0), max_runs * spec.max_events),
        ).fetchall()
        pending[asset] = [(r[0], asset) for r in rows]
    plans = plan_runs(spec, pending, max_runs)
    if not plans:
        return []
    _, stamp = tx.now()
    run_ids: list[int] = []
    for taken, _ in plans:
        (run_id,) = conn.execute(
            "INSERT INTO task_runs (task, state, try_number, max_tries, event_count, "
            "created_at, updated_at) VALUES (?, 'queued', 0, ?, ?, ?, ?) RETURNING id",
            (name, spec.max_tries, len(taken), stamp, stamp),
        ).fetchone()
        run_ids.append(run_id)
    conn.executemany(
        "INSERT INTO task_run_events (run_id, event_id, task, asset) VALUES (?, ?, ?, ?)",
        [
            (run_id, event_id, name, asset)
            for run_id, (taken, _) in zip(run_ids, plans, strict=True)
            for event_id, asset in taken
        ],
    )
    moved: dict[str, int] = {}
    for _, cursors_after in plans:
        moved.update(cursors_after)
    conn.executemany(
        "UPDATE task_cursors SET cursor = ?, updated_at = ?, writer_kind = NULL, "
        "writer_name = NULL WHERE task = ? AND asset = ?",
        [(cursor, stamp, name, asset) for asset, cursor in moved.items()],
    )
    return run_ids


# -- one step -------------------------------------------------------------------------------------


class StepItem(NamedTuple):
    """The arguments of one step (``tasks`` a tuple, so that steps can be grouped by it)."""

    owner: str
    finish: RunOutcome | None
    claim: int
    span: timedelta
    tasks: tuple[str, ...] | None
    create: int


def step(tx: Tx, item: StepItem) -> RunStep:
    """Finish ``item.finish`` (fenced), then claim up to ``item.claim`` runs, creating some
    first (``item.create`` per task at most) when too few are ready."""
    finished = None if item.finish is None else _finish(tx, item.owner, item.finish)
    claimed, created = _claim_or_create(
        tx, item.owner, item.claim, item.span, item.tasks, item.create
    )
    return RunStep(finished, tuple(claimed), created)


class RunSteps:
    """Neighbouring :func:`step` operations as one call (see the module docstring).

    Same effects as the steps one after the other, except that every finish comes before
    every claim, and which of the grouped steps gets which of the claimed runs.
    """

    def run(self, tx: Tx, items: Sequence[StepItem]) -> list[Any]:
        outcomes: list[Any] = []
        claims: dict[tuple[str, timedelta, tuple[str, ...] | None], list[int]] = {}
        for i, item in enumerate(items):
            try:
                finished = None if item.finish is None else _finish(tx, item.owner, item.finish)
            except (RunLeaseLostError, RunNotFoundError) as exc:  # raised before any write
                outcomes.append(exc)
                continue
            outcomes.append(RunStep(finished, ()))
            if item.claim:
                claims.setdefault((item.owner, item.span, item.tasks), []).append(i)
        for (owner, span, tasks), indices in claims.items():
            want = sum(items[i].claim for i in indices)
            create = max(items[i].create for i in indices)
            claimed, created = _claim_or_create(tx, owner, want, span, tasks, create)
            for i in indices:
                take = items[i].claim
                # The creation is reported to the step that asked for it (the largest).
                made = created if create and items[i].create == create else 0
                created -= made
                outcomes[i] = RunStep(outcomes[i].finished, tuple(claimed[:take]), made)
                del claimed[:take]
        return outcomes


RUN_STEPS: Final = RunSteps()


def _claim_or_create(
    tx: Tx, owner: str, claim: int, span: timedelta, tasks: Sequence[str] | None, create: int
) -> tuple[list[TaskRun], int]:
    """The runs claimed, and how many were created."""
    claimed = _claim(tx, owner, claim, span, tasks) if claim else []
    created = 0
    if create and len(claimed) < claim:
        names = tasks
        if names is None:
            names = [r[0] for r in tx.conn.execute("SELECT name FROM tasks WHERE paused = 0")]
        for name in names:
            try:
                created += len(create_runs(tx, name, create))
            except TaskNotFoundError:
                continue
        claimed += _claim(tx, owner, claim - len(claimed), span, tasks)
    return claimed, created


def _claim(
    tx: Tx, owner: str, limit: int, span: timedelta, tasks: Sequence[str] | None
) -> list[TaskRun]:
    conn = tx.conn
    now, stamp = tx.now()
    only = ""
    params: list[object] = []
    if tasks is not None:
        only = f" AND r.task IN ({', '.join('?' * len(tasks))})"
        params = list(tasks)
    # Tries whose worker stopped renewing: recorded, then retried or (no tries left) failed.
    lapsed = conn.execute(LAPSED_RUNS + only, (stamp, *params)).fetchall()
    for run_id, try_number, lost_tries, lease_owner, errors in lapsed:
        state = after_lost(lost_tries + 1)
        lost = lapsed_error(lease_owner, try_number, now, final=state == "failed")
        entries = (*errors_from_json(errors), lost)
        conn.execute(
            "UPDATE task_runs SET state = ?, errors = ?, updated_at = ?, not_before = NULL, "
            "finished_at = CASE WHEN ? = 'failed' THEN ? END, lease_owner = NULL, "
            "lease_expires_at = NULL, lost_tries = lost_tries + 1 WHERE id = ?",
            (state, errors_to_json(entries), stamp, state, stamp, run_id),
        )
    rows = conn.execute(
        "UPDATE task_runs SET state = 'running', try_number = try_number + 1, lease_owner = ?, "
        "lease_token = lease_token + 1, lease_expires_at = ?, started_at = ?, updated_at = ?, "
        f"not_before = NULL WHERE id IN ({READY_RUNS}{only} ORDER BY r.id LIMIT ?) "
        f"RETURNING {RUN_COLS}",
        (owner, to_db(now + span), stamp, stamp, stamp, *params, limit),
    ).fetchall()
    return _with_events(conn, sorted(rows))


def _finish(tx: Tx, owner: str, outcome: RunOutcome) -> TaskRun:
    """Record ``outcome`` if ``owner`` still holds the run's lease with its token; else raise
    :class:`RunLeaseLostError` (or :class:`RunNotFoundError`) having written nothing."""
    conn = tx.conn
    now, stamp = tx.now()
    run_id, token = outcome.run_id, outcome.token
    if outcome.success and not outcome.outlets:  # the common case: one fenced statement
        row = conn.execute(
            "UPDATE task_runs SET state = 'success', finished_at = ?, updated_at = ?, "
            "lease_owner = NULL, lease_expires_at = NULL WHERE id = ? AND state = 'running' "
            "AND lease_owner = ? AND lease_token = ? AND lease_expires_at > ? "
            f"RETURNING {RUN_COLS}",
            (stamp, stamp, run_id, owner, token, stamp),
        ).fetchone()
        if row is not None:
            return run_from_row(row)
    state, lease_owner, lease_token, expires, try_number, max_tries, errors, task, failures = (
        lease_row(tx, run_id)
    )
    reason = lost_reason(state, lease_owner, lease_token, _opt(expires), owner, token, now)
    if reason is not None:
        raise RunLeaseLostError(run_id, owner, token, reason)
    if outcome.success:
        outlet_ids: list[int] = []
        for outlet in outcome.outlets:
            asset_id, asset_name = tx.resolve(AssetScope(name=outlet.asset))
            (event_id,) = conn.execute(
                "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, "
                "created_at) VALUES (?, ?, ?, ?, NULL, ?) RETURNING id",
                (asset_id, asset_name, f"task:{task}", outlet.payload_json, stamp),
            ).fetchone()
            outlet_ids.append(event_id)
        conn.execute(
            "UPDATE task_runs SET state = 'success', finished_at = ?, updated_at = ?, "
            "lease_owner = NULL, lease_expires_at = NULL, outlet_event_ids = ? WHERE id = ?",
            (stamp, stamp, ids_to_json(outlet_ids), run_id),
        )
    else:
        new_state, not_before = after_failure(
            failures + 1, max_tries, now, outcome.retry_delay, retry=outcome.retry
        )
        entries = (
            *errors_from_json(errors),
            RunError(
                try_number,
                outcome.error or "failed",
                outcome.traceback,
                now,
                outcome.cause,
                new_state == "failed",
            ),
        )
        conn.execute(
            "UPDATE task_runs SET state = ?, not_before = ?, updated_at = ?, errors = ?, "
            "lease_owner = NULL, lease_expires_at = NULL, finished_at = ?, "
            "failures = failures + 1 WHERE id = ?",
            (new_state, None if not_before is None else to_db(not_before), stamp,
             errors_to_json(entries), stamp if new_state == "failed" else None, run_id),
        )  # fmt: skip
    row = conn.execute(f"SELECT {RUN_COLS} FROM task_runs WHERE id = ?", (run_id,)).fetchone()
    return run_from_row(row)
