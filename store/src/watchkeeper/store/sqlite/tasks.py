"""Runs for :class:`~watchkeeper.store.SqliteStateBackend` (consumers and task specs are
:mod:`watchkeeper.store.sql.tasks`').

Every write is one operation of the group-commit writer (:mod:`.writer`), so it is one
transaction and serialised with every other write of the file: creating a run and moving its
cursors, claiming runs, finishing one with its outlet events. Several threads of one process
share the writer; several processes serialise on SQLite's write lock. Event ids are commit
order (``AUTOINCREMENT`` under the write lock), so a cursor never passes an uncommitted event.
The rules are :mod:`._tasks`'.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .._run_errors import bucketed
from .._tasks import (
    MAX_LOST_TRIES,
    RunOutcome,
    RunStep,
    TaskRun,
    lost_reason,
)
from ..errors import RunNotFoundError, RunStateError
from . import meta
from .part import SqlitePart
from .schema import from_db, to_db
from .steps import (
    RUN_STEPS,
    StepItem,
    create_runs,
    lease_row,
    run_from_row,
    runs_with_events,
    step,
)
from .tasks_schema import ANYTHING_TO_CLAIM, EVENT_COLS, RUN_COLS, runs_query
from .writer import Op

if TYPE_CHECKING:
    from .writer import Tx

__all__ = ["SqliteTasks"]

T = TypeVar("T")
Row = tuple[Any, ...]


# -- operations (fn(tx), run by the writer) -------------------------------------------------------


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


class SqliteTasks(SqlitePart):
    """The runs driver of the SQLite backend (:class:`~watchkeeper.store.protocols.RunsDriver`)."""

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

    async def _aretry_run(self, run_id: int) -> TaskRun:
        return await self._write(lambda tx: _retry(tx, run_id))
