"""Garbage collection, written once for both SQL databases: one pass of a
:class:`~watchkeeper.store._gc.GcPlan` (the rules are :mod:`watchkeeper.store._gc`').

A dry run only selects. Otherwise, with ``batch_size`` 0, every kind is deleted by one
statement, each kind in a write of its own; with a batch size, each batch is its own write, so
no write transaction is held long (on PostgreSQL a batch skips the rows another transaction holds).
The rows deleted come back through ``RETURNING`` for the report, in the order the database
keeps (SQLite: ``rowid``, the memory backend's insertion order; PostgreSQL: by key).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Final

from .._gc import GcPlan
from .._types import GcReport, TaskScope
from .engine import BEGIN, Dialect, Job, Stmt, count, rows
from .runner import Runner

__all__ = ["GcStatements", "SqlGc"]

_KEYS: Final = "dag_id, run_id, task_id, map_index, key"
_TASK_KINDS: Final = {
    "expired": "NOT never_expire AND expires_at IS NOT NULL AND expires_at < {ts:bound}",
    "retention": "NOT never_expire AND expires_at IS NULL AND updated_at < {ts:bound}",
}
_INACTIVE: Final = "asset_id IN (SELECT id FROM {p}assets WHERE NOT active)"
# _gc.py's rule; a NULL dedup cutoff (keep events with a dedup key forever) is never true.
_EVENTS: Final = "created_at < {ts:events} AND (dedup_key IS NULL OR created_at < {ts:dedup})"
_BATCH: Final = "LIMIT :limit {for_update} {skip_locked}"
# A finished run's logs go with its events (_logs.py): the runs finished before their cutoff.
_LOGS: Final = (
    "run_id IN (SELECT id FROM {p}task_runs "
    "WHERE state IN ('success', 'failed') AND finished_at < {ts:events})"
)


class GcStatements:
    """Select, delete, and delete-a-batch statements for each kind of garbage, each row led by
    its place in the database's order (``{order}``); and the events' count and deletes."""

    def __init__(self, dialect: Dialect, prefix: str) -> None:
        self.dialect = dialect
        sql = partial(dialect.compile, prefix=prefix)
        self.select: dict[str, Stmt] = {}
        self.delete: dict[str, Stmt] = {}
        self.delete_batch: dict[str, Stmt] = {}
        for kind, cond in _TASK_KINDS.items():
            back = f"RETURNING {{order}}, {_KEYS}"
            self.select[kind] = sql(f"SELECT {{order}}, {_KEYS} FROM {{p}}task_state WHERE {cond}")
            self.delete[kind] = sql(f"DELETE FROM {{p}}task_state WHERE {cond} {back}")
            self.delete_batch[kind] = sql(
                f"DELETE FROM {{p}}task_state WHERE ({_KEYS}) IN (SELECT {_KEYS} "
                f"FROM {{p}}task_state WHERE {cond} {_BATCH}) {back}"
            )
        self.select["orphaned"] = sql(
            "SELECT {order:s}, a.name, s.key FROM {p}asset_state AS s "
            "JOIN {p}assets AS a ON a.id = s.asset_id WHERE NOT a.active"
        )
        self.delete["orphaned"] = sql(
            f"DELETE FROM {{p}}asset_state WHERE {_INACTIVE} RETURNING {{order}}, asset_id, key"
        )
        self.delete_batch["orphaned"] = sql(
            "DELETE FROM {p}asset_state WHERE (asset_id, key) IN (SELECT asset_id, key "
            f"FROM {{p}}asset_state WHERE {_INACTIVE} {_BATCH}) RETURNING {{order}}, asset_id, key"
        )
        self.names = sql("SELECT id, name FROM {p}assets WHERE id {in:ids:bigint}")
        self.events_count = sql(f"SELECT count(*) FROM {{p}}asset_events WHERE {_EVENTS}")
        self.events_delete = sql(f"DELETE FROM {{p}}asset_events WHERE {_EVENTS}")
        self.events_delete_batch = sql(
            "DELETE FROM {p}asset_events WHERE id IN (SELECT id FROM {p}asset_events "
            f"WHERE {_EVENTS} {_BATCH})"
        )
        self.logs_count = sql(f"SELECT count(*) FROM {{p}}task_run_logs WHERE {_LOGS}")
        self.logs_delete = sql(f"DELETE FROM {{p}}task_run_logs WHERE {_LOGS}")
        self.logs_delete_batch = sql(
            "DELETE FROM {p}task_run_logs WHERE seq IN (SELECT seq FROM {p}task_run_logs "
            f"WHERE {_LOGS} {_BATCH})"
        )


# -- the jobs --------------------------------------------------------------------------------


def _named(s: GcStatements, found: Sequence[Any]) -> Job[list[tuple[Any, ...]]]:
    """Orphan rows ``(order, asset_id, key)`` as ``(order, asset name, key)``."""
    ids = sorted({r[1] for r in found})
    names = dict((yield rows(s.names, ids=ids))) if ids else {}
    return [(r[0], names[r[1]], r[2]) for r in found]


def select(s: GcStatements, kind: str, bound: Any) -> Job[list[tuple[Any, ...]]]:
    """What :func:`delete` would delete (the dry run)."""
    params = {} if kind == "orphaned" else {"bound": bound}
    return [tuple(r) for r in (yield rows(s.select[kind], **params))]


def delete(s: GcStatements, kind: str, bound: Any, limit: int) -> Job[list[tuple[Any, ...]]]:
    """Delete the rows of one kind (at most ``limit``; 0: all, in one statement)."""
    yield BEGIN
    params: dict[str, Any] = {} if kind == "orphaned" else {"bound": bound}
    if limit:
        found = yield rows(s.delete_batch[kind], limit=limit, **params)
    else:
        found = yield rows(s.delete[kind], **params)
    if kind == "orphaned":
        return (yield from _named(s, found))
    return [tuple(r) for r in found]


def count_events(s: GcStatements, cutoffs: tuple[Any, Any]) -> Job[int]:
    found = yield rows(s.events_count, events=cutoffs[0], dedup=cutoffs[1])
    return int(found[0][0])


def delete_events(s: GcStatements, cutoffs: tuple[Any, Any], limit: int) -> Job[int]:
    """Delete the events past retention (at most ``limit``; 0: all); return how many."""
    yield BEGIN
    if limit:
        stmt, params = s.events_delete_batch, {"limit": limit}
    else:
        stmt, params = s.events_delete, {}
    deleted: int = yield count(stmt, events=cutoffs[0], dedup=cutoffs[1], **params)
    return deleted


def count_logs(s: GcStatements, cutoff: Any) -> Job[int]:
    found = yield rows(s.logs_count, events=cutoff)
    return int(found[0][0])


def delete_logs(s: GcStatements, cutoff: Any, limit: int) -> Job[int]:
    """Delete the log chunks of the runs finished before ``cutoff`` (at most ``limit``)."""
    yield BEGIN
    if limit:
        deleted: int = yield count(s.logs_delete_batch, events=cutoff, limit=limit)
    else:
        deleted = yield count(s.logs_delete, events=cutoff)
    return deleted


# -- the driver ------------------------------------------------------------------------------


class SqlGc:
    """The GC driver (:class:`~watchkeeper.store.protocols.GcDriver`) of a SQL store, over its
    :class:`~.runner.Runner`; each delete bounded by ``bound`` seconds when given."""

    __slots__ = ("_bound", "_runner", "_statements")

    def __init__(self, runner: Runner, *, bound: float | None = None) -> None:
        self._runner, self._bound = runner, bound
        self._statements: GcStatements | None = None

    def __repr__(self) -> str:
        return f"<SqlGc over {self._runner!r}>"

    @property
    def statements(self) -> GcStatements:
        s = self._statements
        if s is None:
            s = self._statements = GcStatements(self._runner.dialect, self._runner.prefix)
        return s

    async def _acollect_garbage(self, plan: GcPlan) -> GcReport:
        s, run = self.statements, self._runner
        kinds: dict[str, Any] = {"expired": plan.now, "orphaned": None}
        if plan.stale_before is not None:  # default_retention_days = 0 disables it
            kinds["retention"] = plan.stale_before
        due = plan.events
        cutoffs = None if due is None else (due.events, due.dedup)
        found: dict[str, list[tuple[Any, ...]]] = {kind: [] for kind in kinds}
        events = logs = 0
        write = partial(run.write, what="GC", lane="late", bound=self._bound)
        if plan.dry_run:
            for kind, bound in kinds.items():
                found[kind] = await run.read(partial(select, s, kind, bound), what="GC")
            if cutoffs is not None:
                events = await run.read(partial(count_events, s, cutoffs), what="GC")
                logs = await run.read(partial(count_logs, s, cutoffs[0]), what="GC")
        else:  # one write per kind (batch_size 0), or per batch: no write is held long
            size = plan.batch_size
            for kind, bound in kinds.items():
                while True:
                    chunk = await write(partial(delete, s, kind, bound, size))
                    found[kind].extend(chunk)
                    if not size or len(chunk) < size:
                        break
            while cutoffs is not None:
                deleted = await write(partial(delete_events, s, cutoffs, size))
                events += deleted
                if not size or deleted < size:
                    break
            while cutoffs is not None:
                deleted = await write(partial(delete_logs, s, cutoffs[0], size))
                logs += deleted
                if not size or deleted < size:
                    break
        report = GcReport(dry_run=plan.dry_run, events=events, logs=logs)
        for kind in ("expired", "retention"):
            rows_ = sorted(found.get(kind, []))
            setattr(report, kind, [(TaskScope._from_row(*r[1:5]), r[5]) for r in rows_])
        report.orphaned = [(r[1], r[2]) for r in sorted(found["orphaned"])]
        return report
