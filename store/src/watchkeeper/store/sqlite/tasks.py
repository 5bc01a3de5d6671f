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
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .._tasks import (
    RunOutcome,
    RunStep,
    TaskInfo,
    TaskRun,
    TaskSpec,
    check_rewind,
)
from .._types import Writer
from . import ops
from .consumers import SqliteConsumers
from .schema import from_db, to_db
from .steps import (
    RUN_STEPS,
    StepItem,
    create_runs,
    runs_with_events,
    spec_from_row,
    step,
    task_spec,
)
from .tasks_schema import ANYTHING_TO_CLAIM
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
    """The tasks driver of the SQLite backend (:class:`~watchkeeper.store.protocols.TaskSpecsDriver` and
    :class:`~watchkeeper.store.protocols.RunsDriver`):
    runs here, consumers in :class:`~.consumers.SqliteConsumers`."""

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
            spec = spec_from_row(row)
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
