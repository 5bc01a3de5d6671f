"""Task cursors and runs for :class:`~watchkeeper.store.SqliteStateBackend`.

The event consumers and the wake-ups are :mod:`.consumers`.

Every write is one operation of the group-commit writer (:mod:`.writer`), so it is one
transaction and serialised with every other write of the file: creating a run and moving its
cursors, claiming runs, finishing one with its outlet events. Several threads of one process
share the writer; several processes serialise on SQLite's write lock. Event ids are commit
order (``AUTOINCREMENT`` under the write lock), so a cursor never passes an uncommitted event.
The rules are :mod:`._tasks`'.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .._tasks import (
    RunError,
    RunOutcome,
    RunStep,
    TaskInfo,
    TaskRun,
    TaskSpec,
    after_failure,
    errors_from_json,
    errors_to_json,
    ids_from_json,
    ids_to_json,
    lapsed_error,
    lost_reason,
    plan_runs,
)
from .._taskstore import TaskStoreBackend
from .._types import AssetEvent, AssetScope, Writer
from ..errors import (
    RunLeaseLostError,
    RunNotFoundError,
    RunStateError,
    TaskNotFoundError,
)
from . import meta, ops
from .consumers import EVENT_COLS
from .schema import from_db, to_db
from .tasks_schema import ANYTHING_TO_CLAIM, LAPSED_RUNS, READY_RUNS, RUN_COLS, runs_query

if TYPE_CHECKING:
    from .writer import Tx

__all__ = ["SqliteTasks"]

T = TypeVar("T")
Row = tuple[Any, ...]


def _opt(text: str | None) -> datetime | None:
    return None if text is None else from_db(text)


def _run(row: Row, events: Sequence[AssetEvent] = ()) -> TaskRun:
    return TaskRun(
        id=row[0], task=row[1], state=row[2], try_number=row[3], max_tries=row[4],
        event_count=row[5], created_at=from_db(row[6]), updated_at=from_db(row[7]),
        started_at=_opt(row[8]), finished_at=_opt(row[9]), not_before=_opt(row[10]),
        lease_owner=row[11], lease_token=row[12], lease_expires_at=_opt(row[13]),
        errors=errors_from_json(row[14]), outlet_event_ids=ids_from_json(row[15]),
        events=tuple(events),
    )  # fmt: skip


def _runs_with_events(conn: Any, run_ids: Sequence[int]) -> list[TaskRun]:
    if not run_ids:
        return []
    marks = ", ".join("?" * len(run_ids))
    rows = conn.execute(
        f"SELECT {RUN_COLS} FROM task_runs WHERE id IN ({marks}) ORDER BY id", run_ids
    ).fetchall()
    events: dict[int, list[AssetEvent]] = {}
    for r in conn.execute(
        f"SELECT e.run_id, {EVENT_COLS} FROM task_run_events e "
        f"JOIN asset_events ev ON ev.id = e.event_id WHERE e.run_id IN ({marks}) "
        "ORDER BY e.event_id",
        run_ids,
    ):
        events.setdefault(r[0], []).extend(meta.events_result([r[1:]]))
    return [_run(row, events.get(row[0], ())) for row in rows]


def _spec(row: Row) -> TaskSpec:
    return TaskSpec(row[0], tuple(json.loads(row[1])), row[2], row[3], row[4])


# -- operations (fn(tx), run by the writer) -------------------------------------------------------


def _sync_tasks(tx: Tx, specs: Sequence[TaskSpec]) -> None:
    conn = tx.conn
    _, stamp = tx.now()
    for spec in specs:
        conn.execute(
            "INSERT INTO tasks (name, assets, mode, max_events, max_tries, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
            "assets = excluded.assets, mode = excluded.mode, max_events = excluded.max_events, "
            "max_tries = excluded.max_tries, updated_at = excluded.updated_at",
            (spec.name, json.dumps(spec.assets), spec.mode, spec.max_events, spec.max_tries, stamp),
        )
        for asset in spec.assets:
            # A new cursor starts at the end of the log: a task sees the events after it
            # was declared, as an asset-scheduled DAG does.
            conn.execute(
                "INSERT INTO task_cursors (task, asset, cursor, updated_at) "
                "SELECT ?, ?, coalesce(max(id), 0), ? FROM asset_events WHERE asset_name = ? "
                "ON CONFLICT (task, asset) DO NOTHING",
                (spec.name, asset, stamp, asset),
            )


def _task_spec(tx: Tx, name: str) -> tuple[TaskSpec, bool]:
    row = tx.conn.execute(
        "SELECT name, assets, mode, max_events, max_tries, paused FROM tasks WHERE name = ?",
        (name,),
    ).fetchone()
    if row is None:
        raise TaskNotFoundError(f"task {name!r}")
    return _spec(row), bool(row[5])


def _set_paused(tx: Tx, name: str, paused: bool) -> None:
    _task_spec(tx, name)
    tx.conn.execute("UPDATE tasks SET paused = ? WHERE name = ?", (int(paused), name))


def _rewind(tx: Tx, name: str, asset: str, to_event_id: int, writer: Writer | None) -> None:
    spec, _ = _task_spec(tx, name)
    if asset not in spec.assets:
        raise TaskNotFoundError(f"asset {asset!r} of task {name!r}")
    _, stamp = tx.now()
    who = ops.writer_cols(writer)
    tx.conn.execute(
        "UPDATE task_cursors SET cursor = ?, updated_at = ?, writer_kind = ?, writer_name = ? "
        "WHERE task = ? AND asset = ?",
        (to_event_id - 1, stamp, who[0], who[1], name, asset),
    )


def _create_runs(tx: Tx, name: str, max_runs: int) -> list[TaskRun]:
    conn = tx.conn
    spec, paused = _task_spec(tx, name)
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
    return _runs_with_events(conn, run_ids)


def _step(
    tx: Tx, owner: str, finish: RunOutcome | None, claim: int, span: timedelta,
    tasks: Sequence[str] | None, create: int,
) -> RunStep:  # fmt: skip
    finished = None if finish is None else _finish(tx, owner, finish)
    claimed = _claim(tx, owner, claim, span, tasks) if claim else []
    if create and len(claimed) < claim:
        names = tasks
        if names is None:
            names = [r[0] for r in tx.conn.execute("SELECT name FROM tasks WHERE paused = 0")]
        for name in names:
            try:
                _create_runs(tx, name, create)
            except TaskNotFoundError:
                continue
        claimed += _claim(tx, owner, claim - len(claimed), span, tasks)
    return RunStep(finished, tuple(claimed))


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
    for run_id, try_number, max_tries, lease_owner, errors in lapsed:
        entries = (*errors_from_json(errors), lapsed_error(lease_owner, try_number, now))
        state = "queued" if try_number < max_tries else "failed"
        conn.execute(
            "UPDATE task_runs SET state = ?, errors = ?, updated_at = ?, not_before = NULL, "
            "finished_at = CASE WHEN ? = 'failed' THEN ? END, lease_owner = NULL, "
            "lease_expires_at = NULL WHERE id = ?",
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
    return [_run(row, events.get(row[0], ())) for row in rows]


def _lease_row(tx: Tx, run_id: int) -> Row:
    row = tx.conn.execute(
        "SELECT state, lease_owner, lease_token, lease_expires_at, try_number, max_tries, "
        "errors, task FROM task_runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        raise RunNotFoundError(run_id)
    return tuple(row)


def _heartbeat(tx: Tx, owner: str, runs: Mapping[int, int], span: timedelta) -> set[int]:
    now, _ = tx.now()
    held: set[int] = set()
    for run_id, token in runs.items():
        try:
            row = _lease_row(tx, run_id)
        except RunNotFoundError:
            continue
        if lost_reason(row[0], row[1], row[2], _opt(row[3]), owner, token, now) is None:
            tx.conn.execute(
                "UPDATE task_runs SET lease_expires_at = ? WHERE id = ?",
                (to_db(now + span), run_id),
            )
            held.add(run_id)
    return held


def _break(tx: Tx, owners: Sequence[str]) -> int:
    _, stamp = tx.now()
    marks = ", ".join("?" * len(owners))
    cur = tx.conn.execute(
        "UPDATE task_runs SET lease_expires_at = ? WHERE state = 'running' "
        f"AND lease_owner IN ({marks})",
        (stamp, *owners),
    )
    return cur.rowcount


def _finish(tx: Tx, owner: str, outcome: RunOutcome) -> TaskRun:
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
            return _run(row)
    state, lease_owner, lease_token, expires, try_number, max_tries, errors, task = _lease_row(
        tx, run_id
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
        new_state, not_before = after_failure(try_number, max_tries, now, outcome.retry_delay)
        entries = (
            *errors_from_json(errors),
            RunError(try_number, outcome.error or "failed", outcome.traceback, now),
        )
        conn.execute(
            "UPDATE task_runs SET state = ?, not_before = ?, updated_at = ?, errors = ?, "
            "lease_owner = NULL, lease_expires_at = NULL, finished_at = ? WHERE id = ?",
            (new_state, None if not_before is None else to_db(not_before), stamp,
             errors_to_json(entries), stamp if new_state == "failed" else None, run_id),
        )  # fmt: skip
    row = conn.execute(f"SELECT {RUN_COLS} FROM task_runs WHERE id = ?", (run_id,)).fetchone()
    return _run(row)


def _retry(tx: Tx, run_id: int) -> TaskRun:
    state = _lease_row(tx, run_id)[0]
    if state != "failed":
        raise RunStateError(run_id, state, "only a failed run can be retried")
    _, stamp = tx.now()
    tx.conn.execute(
        "UPDATE task_runs SET state = 'queued', max_tries = try_number + 1, not_before = NULL, "
        "finished_at = NULL, updated_at = ? WHERE id = ?",
        (stamp, run_id),
    )
    return _runs_with_events(tx.conn, [run_id])[0]


class SqliteTasks(TaskStoreBackend):
    """The :class:`~._tasks.TaskQueue` and :class:`~._tasks.EventConsumers` of the SQLite backend."""

    if TYPE_CHECKING:

        async def _write(self, fn: Callable[[Tx], T], *, savepoint: bool = True) -> T: ...
        async def _read(self, sql: str, params: Sequence[object] = ()) -> list[Row]: ...

    # -- tasks -------------------------------------------------------------------------------

    async def _async_tasks(self, specs: builtins.list[TaskSpec]) -> None:
        await self._write(lambda tx: _sync_tasks(tx, specs))

    async def _alist_tasks(self) -> builtins.list[TaskInfo]:
        tasks = await self._read(
            "SELECT name, assets, mode, max_events, max_tries, paused FROM tasks ORDER BY name"
        )
        cursors = await self._read(
            "SELECT c.task, c.asset, c.cursor, c.writer_kind, c.writer_name, "
            "(SELECT count(*) FROM asset_events ev WHERE ev.asset_name = c.asset "
            "AND ev.id > c.cursor) FROM task_cursors c"
        )
        by_task: dict[str, list[Row]] = {}
        for row in cursors:
            by_task.setdefault(row[0], []).append(row)
        out = []
        for row in tasks:
            spec = _spec(row)
            mine = {r[1]: r for r in by_task.get(spec.name, []) if r[1] in spec.assets}
            out.append(
                TaskInfo(
                    spec,
                    bool(row[5]),
                    {a: r[2] for a, r in mine.items()},
                    {a: r[5] for a, r in mine.items()},
                    {a: ops._writer(r[3], r[4], None) for a, r in mine.items()},
                )
            )
        return out

    async def _aset_task_paused(self, name: str, paused: bool) -> None:
        await self._write(lambda tx: _set_paused(tx, name, paused))

    async def _arewind_task(
        self, name: str, asset: str, to_event_id: int, writer: Writer | None
    ) -> None:
        await self._write(lambda tx: _rewind(tx, name, asset, to_event_id, writer))

    async def _acreate_runs(self, name: str, max_runs: int) -> builtins.list[TaskRun]:
        return await self._write(lambda tx: _create_runs(tx, name, max_runs))

    # -- runs --------------------------------------------------------------------------------

    async def _astep_runs(
        self,
        owner: str,
        finish: RunOutcome | None,
        claim: int,
        span: timedelta,
        tasks: builtins.list[str] | None,
        create: int,
    ) -> RunStep:
        if finish is None and not await self._anything_to_claim(create > 0):
            return RunStep(None, ())  # no write: another process's commits need not wait
        return await self._write(lambda tx: _step(tx, owner, finish, claim, span, tasks, create))

    async def _anything_to_claim(self, create: bool) -> bool:
        """Whether a claim could find something (a read, without the write lock): a ready
        run, a lapsed lease, or (``create``) a task with events after its cursor."""
        stamp = to_db(self.clock())
        rows = await self._read(ANYTHING_TO_CLAIM, (stamp, stamp, int(create)))
        return bool(rows[0][0])

    async def _aheartbeat_runs(self, owner: str, runs: dict[int, int], span: timedelta) -> set[int]:
        return await self._write(lambda tx: _heartbeat(tx, owner, runs, span))

    async def _abreak_run_leases(self, owners: builtins.list[str]) -> int:
        return await self._write(lambda tx: _break(tx, owners))

    async def _aget_run(self, run_id: int) -> TaskRun:
        rows = await self._read(f"SELECT {RUN_COLS} FROM task_runs WHERE id = ?", (run_id,))
        if not rows:
            raise RunNotFoundError(run_id)
        events = await self._read(
            f"SELECT {EVENT_COLS} FROM task_run_events e JOIN asset_events ev "
            "ON ev.id = e.event_id WHERE e.run_id = ? ORDER BY e.event_id",
            (run_id,),
        )
        return _run(rows[0], meta.events_result(events))

    async def _alist_runs(
        self, task: str | None, state: str | None, limit: int | None
    ) -> builtins.list[TaskRun]:
        sql, params = runs_query(task, state)
        rows = await self._read(sql, (*params, -1 if limit is None else limit))
        return [_run(row) for row in rows]

    async def _acount_runs(self) -> dict[tuple[str, str], int]:
        rows = await self._read("SELECT task, state, count(*) FROM task_runs GROUP BY task, state")
        return {(task, state): count for task, state, count in rows}

    async def _aretry_run(self, run_id: int) -> TaskRun:
        return await self._write(lambda tx: _retry(tx, run_id))
