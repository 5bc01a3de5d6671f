"""The logs kept with each run, written once for both SQL databases (the rules are
:mod:`watchkeeper.store._logs`'; the table is migration 12's).

A chunk's ``seq`` is the table's own increasing key, so appends never compete for a number
(a try lost with its lease may still be writing while the next one starts). Each row also
keeps its ``size`` in bytes and ``start_offset``, the bytes its try had stored before it: the
cap is then one range delete, ``start_offset < end - max_bytes``, over the index of the try.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from .._logs import LogChunk, NewChunk
from ..errors import RunNotFoundError
from .engine import BEGIN, Dialect, Job, count, many, rows
from .runner import Runner

__all__ = ["LOG_TABLE_POSTGRES", "LOG_TABLE_SQLITE", "LogStatements", "SqlLogs"]

_COLS: Final = "run_id, try_number, seq, stream, text, created_at"
_INDEX: Final = (
    "CREATE INDEX task_run_logs_try ON {p}task_run_logs (run_id, try_number, start_offset)"
)

LOG_TABLE_SQLITE: Final[tuple[str, ...]] = (
    """
    CREATE TABLE task_run_logs (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id       INTEGER NOT NULL,
        try_number   INTEGER NOT NULL,
        stream       TEXT NOT NULL,
        text         TEXT NOT NULL,
        size         INTEGER NOT NULL,
        start_offset INTEGER NOT NULL,
        created_at   TEXT NOT NULL
    )
    """,
    _INDEX.replace("{p}", ""),
)
"""Migration 12 on SQLite (AUTOINCREMENT: a seq is never reused, even after a delete)."""

LOG_TABLE_POSTGRES: Final[tuple[str, ...]] = (
    """
    CREATE TABLE {p}task_run_logs (
        seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id       bigint NOT NULL,
        try_number   integer NOT NULL,
        stream       text NOT NULL,
        text         text NOT NULL,
        size         integer NOT NULL,
        start_offset bigint NOT NULL,
        created_at   timestamptz NOT NULL
    )
    """,
    _INDEX,
)
"""Migration 12 on PostgreSQL (no foreign key: runs are never deleted while their logs live,
and the check would cost every append)."""


class LogStatements:
    """The logs' statements in one dialect, for one table prefix."""

    def __init__(self, dialect: Dialect, prefix: str) -> None:
        self.dialect = dialect
        sql = partial(dialect.compile, prefix=prefix)
        self.run = sql("SELECT id FROM {p}task_runs WHERE id = :run_id")
        self.end = sql(
            "SELECT start_offset + size FROM {p}task_run_logs "
            "WHERE run_id = :run_id AND try_number = :try_number "
            "ORDER BY start_offset DESC LIMIT 1"
        )
        self.insert = sql(
            "INSERT INTO {p}task_run_logs "
            "(run_id, try_number, stream, text, size, start_offset, created_at) "
            "VALUES (:run_id, :try_number, :stream, :text, :size, :start_offset, {now})"
        )
        self.prune = sql(
            "DELETE FROM {p}task_run_logs "
            "WHERE run_id = :run_id AND try_number = :try_number AND start_offset < :cut"
        )
        where = "run_id = :run_id AND seq > :after"
        self.list: dict[tuple[bool, bool], Any] = {}
        for one_try in (False, True):
            for limited in (False, True):
                cond = where + (" AND try_number = :try_number" if one_try else "")
                tail = " LIMIT :limit" if limited else ""
                self.list[one_try, limited] = sql(
                    f"SELECT {_COLS} FROM {{p}}task_run_logs WHERE {cond} ORDER BY seq{tail}"
                )

    def chunk(self, row: Any) -> LogChunk:
        return LogChunk(row[0], row[1], row[2], row[3], row[4], self.dialect.timestamp(row[5]))


# -- the jobs --------------------------------------------------------------------------------


def append(
    s: LogStatements, run_id: int, try_number: int, chunks: list[NewChunk], max_bytes: int
) -> Job[None]:
    """Store ``chunks`` after the try's others; drop the try's oldest past ``max_bytes``."""
    yield BEGIN
    if not (yield rows(s.run, run_id=run_id)):
        raise RunNotFoundError(run_id)
    found = yield rows(s.end, run_id=run_id, try_number=try_number)
    end = int(found[0][0]) if found else 0
    params = []
    for stream, text, size in chunks:
        params.append(
            {
                "run_id": run_id,
                "try_number": try_number,
                "stream": stream,
                "text": text,
                "size": size,
                "start_offset": end,
            }
        )
        end += size
    yield many(s.insert, params)
    if end > max_bytes:  # the chunks that start before the last max_bytes go
        yield count(s.prune, run_id=run_id, try_number=try_number, cut=end - max_bytes)


def list_logs(
    s: LogStatements, run_id: int, try_number: int | None, after_seq: int, limit: int | None
) -> Job[list[LogChunk]]:
    params: dict[str, Any] = {"run_id": run_id, "after": after_seq}
    if try_number is not None:
        params["try_number"] = try_number
    if limit is not None:
        params["limit"] = limit
    found = yield rows(s.list[try_number is not None, limit is not None], **params)
    if not found and not (yield rows(s.run, run_id=run_id)):
        raise RunNotFoundError(run_id)
    return [s.chunk(r) for r in found]


# -- the driver ------------------------------------------------------------------------------


class SqlLogs:
    """The logs driver (:class:`~watchkeeper.store._logs.LogsDriver`) of a SQL store, over
    its :class:`~.runner.Runner`."""

    __slots__ = ("_runner", "_statements")

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._statements: LogStatements | None = None

    def __repr__(self) -> str:
        return f"<SqlLogs over {self._runner!r}>"

    @property
    def statements(self) -> LogStatements:
        s = self._statements
        if s is None:
            s = self._statements = LogStatements(self._runner.dialect, self._runner.prefix)
        return s

    async def _aappend_logs(
        self, run_id: int, try_number: int, chunks: list[NewChunk], max_bytes: int
    ) -> None:
        job = partial(append, self.statements, run_id, try_number, chunks, max_bytes)
        await self._runner.write(job, what="appending a run's logs")

    async def _alist_logs(
        self, run_id: int, try_number: int | None, after_seq: int, limit: int | None
    ) -> list[LogChunk]:
        job = partial(list_logs, self.statements, run_id, try_number, after_seq, limit)
        return await self._runner.read(job, what="listing a run's logs")
