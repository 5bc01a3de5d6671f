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
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .._tasks import (
    RunOutcome,
    RunStep,
    TaskInfo,
    TaskSpec,
    check_rewind,
    deleting_running,
)
from .._types import Writer
from ..errors import TaskNotFoundError
from ..sql.dialects import SQLITE
from ..sql.run_steps import StepItem, StepStatements, step_group
from . import ops
from .consumers import SqliteConsumers
from .executor import run_on
from .schema import from_db, to_db
from .writer import Op

if TYPE_CHECKING:
    from .writer import Tx

__all__ = ["SqliteTasks"]

T = TypeVar("T")
Row = tuple[Any, ...]


_STEPS: Final = StepStatements(SQLITE, "")


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


# -- a worker's steps, on the engine (:mod:`..sql.run_steps`) in the writer's batch ---------------


def _step(tx: Tx, item: StepItem) -> RunStep:
    """One step alone: raises what refused its finish."""
    (outcome,) = run_on(step_group(_STEPS, [item]), tx.conn, tx.now()[0])
    if isinstance(outcome, BaseException):
        raise outcome
    result: RunStep = outcome
    return result


class _RunSteps:
    """Neighbouring steps of a batch as one call (:func:`~..sql.run_steps.step_group`)."""

    def run(self, tx: Tx, items: Sequence[StepItem]) -> list[Any]:
        return run_on(step_group(_STEPS, items), tx.conn, tx.now()[0])


RUN_STEPS: Final = _RunSteps()


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


class SqliteTasks(SqliteConsumers):
    """The tasks driver of the SQLite backend (:class:`~watchkeeper.store.protocols.TaskSpecsDriver`),
    consumers in :class:`~.consumers.SqliteConsumers`; and the writer's grouping of a worker's
    steps for :class:`~watchkeeper.store.sql.runs.SqlRuns`."""

    events_lock: str | None = None
    """Event ids are commit order here (``AUTOINCREMENT`` under the write lock): no lock."""

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
        op = Op(_step, item, group=RUN_STEPS)
        op.company = peers
        self._live_writer().put(op)
        await op.done
        result: RunStep = op.outcome()
        return result

    async def _anything_to_claim(self, create: bool) -> bool:
        """Whether a claim could find something (a read, without the write lock): a ready
        run, a lapsed lease, or (``create``) a task with events after its cursor."""
        stmt = _STEPS.anything
        rows = await self._read(stmt.sql, stmt.bind({"create": create}, to_db(self.clock()), str))
        return bool(rows[0][0])

    async def _acount_runs(self) -> dict[tuple[str, str], int]:
        rows = await self._read("SELECT task, state, count(*) FROM task_runs GROUP BY task, state")
        return {(task, state): count for task, state, count in rows}

    async def _aoldest_pending(self) -> dict[tuple[str, str], datetime]:
        rows = await self._read(
            "SELECT c.task, c.asset, (SELECT e.created_at FROM asset_events e "
            "WHERE e.asset_name = c.asset AND e.id > c.cursor ORDER BY e.id LIMIT 1) "
            "FROM task_cursors c"
        )
        return {(task, asset): from_db(at) for task, asset, at in rows if at is not None}
