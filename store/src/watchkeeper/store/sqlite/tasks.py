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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .._run_errors import bucketed
from .._tasks import (
    MAX_LOST_TRIES,
    RunOutcome,
    RunStep,
    TaskInfo,
    TaskRun,
    TaskSpec,
    check_rewind,
    deleting_running,
    lost_reason,
)
from .._types import Writer
from ..errors import RunNotFoundError, RunStateError
from . import meta, ops
from .consumers import EVENT_COLS, SqliteConsumers
from .schema import from_db, to_db
from .steps import (
    RUN_STEPS,
    StepItem,
    create_runs,
    lease_row,
    run_from_row,
    runs_with_events,
    spec_from_row,
    step,
    task_spec,
)
from .tasks_schema import ANYTHING_TO_CLAIM, RUN_COLS, runs_query
from .writer import Op

if TYPE_CHECKING:
    from .writer import Tx

__all__ = ["SqliteTasks"]

T = TypeVar("T")
Row = tuple[Any, ...]


# -- operations (fn(tx), run by the writer) -------------------------------------------------------


def _sync_tasks(tx: Tx, specs: Sequence[TaskSpec]) -> None:
    conn = tx.conn
    _, stamp = tx.now()
    for spec in specs:
        conn.execute(
            "INSERT INTO tasks (name, assets, mode, max_events, max_tries, batch_window, "
            "max_active_runs, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET "
            "assets = excluded.assets, mode = excluded.mode, max_events = excluded.max_events, "
            "max_tries = excluded.max_tries, batch_window = excluded.batch_window, "
            "max_active_runs = excluded.max_active_runs, removed_at = NULL, "
            "updated_at = excluded.updated_at",
            (spec.name, json.dumps(spec.assets), spec.mode, spec.max_events, spec.max_tries,
             spec.batch_window, spec.max_active_runs, stamp),
        )  # fmt: skip
        for asset in spec.assets:
            # A new cursor starts at the end of the log: a task sees the events after it
            # was declared, as an asset-scheduled DAG does.
            conn.execute(
                "INSERT INTO task_cursors (task, asset, cursor, updated_at) "
                "SELECT ?, ?, coalesce(max(id), 0), ? FROM asset_events WHERE asset_name = ? "
                "ON CONFLICT (task, asset) DO NOTHING",
                (spec.name, asset, stamp, asset),
            )


def _retire(tx: Tx, keep: Sequence[str]) -> list[str]:
    _, stamp = tx.now()
    rows = tx.conn.execute(
        "UPDATE tasks SET removed_at = ? WHERE removed_at IS NULL AND name NOT IN "
        "(SELECT value FROM json_each(?)) RETURNING name",
        (stamp, json.dumps(list(keep))),
    ).fetchall()
    return sorted(r[0] for r in rows)


def _delete(tx: Tx, name: str) -> None:
    task_spec(tx, name)
    running = tx.conn.execute(
        "SELECT min(id) FROM task_runs WHERE task = ? AND state = 'running'", (name,)
    ).fetchone()[0]
    if running is not None:
        raise deleting_running(name, running)
    tx.conn.execute("DELETE FROM task_cursors WHERE task = ?", (name,))
    tx.conn.execute("DELETE FROM tasks WHERE name = ?", (name,))


def _set_paused(tx: Tx, name: str, paused: bool) -> None:
    task_spec(tx, name)
    tx.conn.execute("UPDATE tasks SET paused = ? WHERE name = ?", (int(paused), name))


def _rewind(tx: Tx, name: str, asset: str, to_event_id: int, writer: Writer | None) -> None:
    spec, _ = task_spec(tx, name)
    row = tx.conn.execute(
        "SELECT (SELECT cursor FROM task_cursors WHERE task = ? AND asset = ?), "
        "(SELECT coalesce(max(id), 0) FROM asset_events WHERE asset_name = ?)",
        (name, asset, asset),
    ).fetchone()
    cursor = check_rewind(spec, asset, to_event_id, row[0] or 0, row[1])
    _, stamp = tx.now()
    who = ops.writer_cols(writer)
    tx.conn.execute(
        "UPDATE task_cursors SET cursor = ?, updated_at = ?, writer_kind = ?, writer_name = ? "
        "WHERE task = ? AND asset = ?",
        (cursor, stamp, who[0], who[1], name, asset),
    )


def _heartbeat(tx: Tx, owner: str, runs: Mapping[int, int], span: timedelta) -> set[int]:
    now, _ = tx.now()
    held: set[int] = set()
    for run_id, token in runs.items():
        try:
            row = lease_row(tx, run_id)
        except RunNotFoundError:
            continue
        if (
            lost_reason(
                row[0],
                row[1],
                row[2],
                None if row[3] is None else from_db(row[3]),
                owner,
                token,
                now,
            )
            is None
        ):
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


def _retry(tx: Tx, run_id: int) -> TaskRun:
    state = lease_row(tx, run_id)[0]
    if state != "failed":
        raise RunStateError(run_id, state, "only a failed run can be retried")
    _, stamp = tx.now()
    tx.conn.execute(
        "UPDATE task_runs SET state = 'queued', max_tries = failures + 1, not_before = NULL, "
        "finished_at = NULL, updated_at = ?, lost_tries = min(lost_tries, ?) WHERE id = ?",
        (stamp, MAX_LOST_TRIES - 1, run_id),
    )
    return runs_with_events(tx.conn, [run_id])[0]


class SqliteTasks(SqliteConsumers):
    """The tasks driver of the SQLite backend (:class:`~watchkeeper.store.protocols.TaskSpecsDriver` and
    :class:`~watchkeeper.store.protocols.RunsDriver`):
    runs here, consumers in :class:`~.consumers.SqliteConsumers`."""

    # -- tasks -------------------------------------------------------------------------------

    async def _async_tasks(self, specs: builtins.list[TaskSpec]) -> None:
        await self._write(lambda tx: _sync_tasks(tx, specs))

    async def _alist_tasks(self) -> builtins.list[TaskInfo]:
        tasks = await self._read(
            "SELECT name, assets, mode, max_events, max_tries, paused, batch_window, "
            "max_active_runs, removed_at FROM tasks ORDER BY name"
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
            spec = replace(spec_from_row(row), batch_window=row[6], max_active_runs=row[7])
            mine = {r[1]: r for r in by_task.get(spec.name, []) if r[1] in spec.assets}
            out.append(
                TaskInfo(
                    spec,
                    bool(row[5]),
                    {a: r[2] for a, r in mine.items()},
                    {a: r[5] for a, r in mine.items()},
                    {a: ops._writer(r[3], r[4], None) for a, r in mine.items()},
                    None if row[8] is None else from_db(row[8]),
                )
            )
        return out

    async def _aretire_tasks(self, keep: builtins.list[str]) -> builtins.list[str]:
        return await self._write(lambda tx: _retire(tx, keep))

    async def _adelete_task(self, name: str) -> None:
        await self._write(lambda tx: _delete(tx, name))

    async def _aset_task_paused(self, name: str, paused: bool) -> None:
        await self._write(lambda tx: _set_paused(tx, name, paused))

    async def _arewind_task(
        self, name: str, asset: str, to_event_id: int, writer: Writer | None
    ) -> None:
        await self._write(lambda tx: _rewind(tx, name, asset, to_event_id, writer))

    async def _acreate_runs(self, name: str, max_runs: int) -> builtins.list[TaskRun]:
        return await self._write(
            lambda tx: runs_with_events(tx.conn, create_runs(tx, name, max_runs))
        )

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
        if finish is None and not await self._anything_to_claim(create > 0):
            return RunStep(None, ())  # no write: another process's commits need not wait
        # Neighbouring steps of a batch run as one (RUN_STEPS), this one alone if that fails.
        item = StepItem(owner, finish, claim, span, None if tasks is None else tuple(tasks), create)
        op = Op(step, item, group=RUN_STEPS)
        op.company = peers
        self._live_writer().put(op)
        await op.done
        result: RunStep = op.outcome()
        return result

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
        return run_from_row(rows[0], meta.events_result(events))

    async def _alist_runs(
        self, task: str | None, state: str | None, limit: int | None, before: int | None
    ) -> builtins.list[TaskRun]:
        sql, params = runs_query(task, state, before)
        rows = await self._read(sql, (*params, -1 if limit is None else limit))
        return [run_from_row(row) for row in rows]

    async def _arun_event_ids(self, run_ids: builtins.list[int]) -> dict[int, builtins.list[int]]:
        found: dict[int, list[int]] = {}
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start : start + 500]
            rows = await self._read(
                f"SELECT run_id, event_id FROM task_run_events WHERE run_id IN "
                f"({', '.join('?' * len(chunk))}) ORDER BY run_id, event_id",
                chunk,
            )
            for run_id, event_id in rows:
                found.setdefault(run_id, []).append(event_id)
        return found

    async def _acount_runs(self) -> dict[tuple[str, str], int]:
        rows = await self._read("SELECT task, state, count(*) FROM task_runs GROUP BY task, state")
        return {(task, state): count for task, state, count in rows}

    async def _acount_tries(self) -> dict[tuple[str, str, bool], int]:
        rows = await self._read(
            "SELECT r.task, coalesce(json_extract(e.value, '$.cause'), CASE WHEN "
            "json_extract(e.value, '$.error') LIKE 'the lease of worker %' THEN 'worker_lost' "
            "ELSE 'task_error' END), coalesce(json_extract(e.value, '$.final'), 0), count(*) "
            "FROM task_runs r, json_each(r.errors) e WHERE r.errors != '[]' GROUP BY 1, 2, 3"
        )
        return {(task, cause, bool(final)): n for task, cause, final, n in rows}

    async def _arun_durations(
        self, bounds: tuple[float, ...]
    ) -> dict[str, tuple[builtins.list[int], float]]:
        took = "(julianday(finished_at) - julianday(started_at)) * 86400.0"
        bucket = "CASE " + "".join(f"WHEN {took} <= {b!r} THEN {i} " for i, b in enumerate(bounds))
        rows = await self._read(
            f"SELECT task, {bucket}ELSE {len(bounds)} END, count(*), sum({took}) "
            "FROM task_runs WHERE state = 'success' GROUP BY 1, 2"
        )
        return bucketed(rows, len(bounds))

    async def _aoldest_pending(self) -> dict[tuple[str, str], datetime]:
        rows = await self._read(
            "SELECT c.task, c.asset, (SELECT e.created_at FROM asset_events e "
            "WHERE e.asset_name = c.asset AND e.id > c.cursor ORDER BY e.id LIMIT 1) "
            "FROM task_cursors c"
        )
        return {(task, asset): from_db(at) for task, asset, at in rows if at is not None}

    async def _aretry_run(self, run_id: int) -> TaskRun:
        return await self._write(lambda tx: _retry(tx, run_id))
