"""The memory backend's logs driver: each run's chunks in a list, with the same seq, cap and
retention as the SQL table (:mod:`watchkeeper.store.sql.logs`)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime

from ._logs import LogChunk, NewChunk
from ._memory_tasks import MemoryTasks
from .errors import RunNotFoundError

__all__ = ["MemoryLogs"]


@dataclass(frozen=True, slots=True)
class _Row:
    chunk: LogChunk
    start_offset: int  # the bytes of its try stored before it
    size: int


class MemoryLogs:
    """The logs driver (:class:`~._logs.LogsDriver`) of the memory backend, beside its
    tasks (whose runs it checks and whose finish times its retention reads)."""

    def __init__(self, tasks: MemoryTasks) -> None:
        self._tasks = tasks
        self._rows: dict[int, builtins.list[_Row]] = {}  # run id: its chunks by seq
        self._next_seq = 1

    def _check_run(self, run_id: int) -> None:
        _, _, runs = self._tasks._tasks_state()
        if run_id not in runs:
            raise RunNotFoundError(run_id)

    async def _aappend_logs(
        self, run_id: int, try_number: int, chunks: builtins.list[NewChunk], max_bytes: int
    ) -> None:
        now = self._tasks.clock()
        with self._tasks._lock:
            self._check_run(run_id)
            rows = self._rows.setdefault(run_id, [])
            mine = [r for r in rows if r.chunk.try_number == try_number]
            end = mine[-1].start_offset + mine[-1].size if mine else 0
            for stream, text, size in chunks:
                chunk = LogChunk(run_id, try_number, self._next_seq, stream, text, now)
                rows.append(_Row(chunk, end, size))
                self._next_seq += 1
                end += size
            cut = end - max_bytes
            if cut > 0:
                rows[:] = [
                    r for r in rows if r.chunk.try_number != try_number or r.start_offset >= cut
                ]

    async def _alist_logs(
        self, run_id: int, try_number: int | None, after_seq: int, limit: int | None
    ) -> builtins.list[LogChunk]:
        with self._tasks._lock:
            self._check_run(run_id)
            found = [
                r.chunk
                for r in self._rows.get(run_id, ())
                if r.chunk.seq > after_seq and try_number in (None, r.chunk.try_number)
            ]
        return found if limit is None else found[:limit]

    def collect(self, finished_before: datetime, dry_run: bool) -> int:
        """With the store's lock held: delete (or with ``dry_run`` count) the chunks of the
        runs that finished before ``finished_before``; how many."""
        _, _, runs = self._tasks._tasks_state()
        due = [
            run_id
            for run_id in self._rows
            if (run := runs.get(run_id)) is not None
            and run.state in ("success", "failed")
            and run.finished_at is not None
            and run.finished_at < finished_before
        ]
        gone = sum(len(self._rows[run_id]) for run_id in due)
        if not dry_run:
            for run_id in due:
                del self._rows[run_id]
        return gone
