"""Run listings for :class:`~watchkeeper.store.PostgresStateBackend`: runs newest first, a
page at a time, and the event ids of the runs listed (one query for a whole page)."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from .._run_errors import bucketed
from .part import PostgresPart
from .runs import RUN_COLS, run_from_row

if TYPE_CHECKING:
    from .._tasks import TaskRun

__all__ = ["PostgresRunListing"]


class PostgresRunListing(PostgresPart):
    """A part of :class:`.tasks.PostgresTasks` (see the module docstring)."""

    async def _alist_runs(
        self, task: str | None, state: str | None, limit: int | None, before: int | None
    ) -> builtins.list[TaskRun]:
        # Only the filters given, the state as a literal (one of RUN_STATES, checked): a
        # generic "($1 IS NULL OR state = $1)" plan scanned every run ever made, where
        # "state = 'running'" is answered by the partial index of open runs.
        args: list[object] = [limit]
        where = []
        if task is not None:
            args.append(task)
            where.append(f"task = ${len(args)}")
        if state is not None:
            where.append(f"state = '{state}'")
        if before is not None:
            args.append(before)
            where.append(f"id < ${len(args)}")
        sql = f"SELECT {RUN_COLS} FROM {self._prefix}task_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT $1"
        rows = await self._fetch("listing runs", sql, *args)
        return [run_from_row(row) for row in rows]

    async def _arun_event_ids(self, run_ids: builtins.list[int]) -> dict[int, builtins.list[int]]:
        rows = await self._fetch(
            "listing the events of runs",
            f"SELECT run_id, event_id FROM {self._prefix}task_run_events "
            "WHERE run_id = ANY($1::int8[]) ORDER BY run_id, event_id",
            run_ids,
        )
        found: dict[int, list[int]] = {}
        for row in rows:
            found.setdefault(row[0], []).append(row[1])
        return found

    async def _acount_tries(self) -> dict[tuple[str, str, bool], int]:
        rows = await self._fetch(
            "counting the tries of runs",
            "SELECT r.task, coalesce(e ->> 'cause', CASE WHEN e ->> 'error' LIKE "
            "'the lease of worker %' THEN 'worker_lost' ELSE 'task_error' END), "
            "coalesce((e ->> 'final')::boolean, false), count(*) "
            f"FROM {self._prefix}task_runs r, jsonb_array_elements(r.errors::jsonb) e "
            "WHERE r.errors <> '[]' GROUP BY 1, 2, 3",
        )
        return {(row[0], row[1], bool(row[2])): row[3] for row in rows}

    async def _arun_durations(
        self, bounds: tuple[float, ...]
    ) -> dict[str, tuple[builtins.list[int], float]]:
        took = "extract(epoch FROM finished_at - started_at)::float8"
        bucket = "CASE " + "".join(f"WHEN {took} <= {b!r} THEN {i} " for i, b in enumerate(bounds))
        rows = await self._fetch(
            "measuring run durations",
            f"SELECT task, {bucket}ELSE {len(bounds)} END, count(*), sum({took}) "
            f"FROM {self._prefix}task_runs WHERE state = 'success' GROUP BY 1, 2",
        )
        return bucketed(rows, len(bounds))
