"""How the PostgreSQL writer applies a batch of :mod:`.ops`: resolved, ordered by kind, and
turned into a few set-based statements, inside the batch's transaction.

Ops that share a batch were all in flight at the same moment (none of their callers has had an
answer yet), so any serial order of them is a correct one. :func:`apply_batch` picks the order
that needs the fewest round trips: asset registrations first, then every asset scope is
resolved with one query, then event commits (:mod:`.commits`: one statement per round),
compare-and-sets, upserts, deletes, clears, and the rest (status rows, garbage collection),
each kind set-based (one ``unnest`` statement for all of them). Two ops on the same row go in
successive rounds of statements, so the second sees the first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from .._leases import check_fence
from .._types import AssetScope, TaskScope
from ..errors import LeaseLostError, VersionConflictError
from .commits import EventStatements, commit_round
from .ops import CAS, CATALOG, PUT, CallOp, ClearOp, DeleteOp, EventsOp, Op, PutOp
from .sql import Statements, StateStatements, columns, rowcount

if TYPE_CHECKING:
    import asyncpg

__all__ = ["apply_batch", "one_round"]

T = TypeVar("T")


def _rounds(ops: Sequence[T], keys_of: Callable[[T], Sequence[Hashable]]) -> list[list[T]]:
    """Split ``ops`` so that no round has two ops on the same key, keeping their order per key."""
    next_round: dict[Hashable, int] = {}
    out: list[list[T]] = []
    for op in ops:
        keys = keys_of(op)
        index = max((next_round.get(k, 0) for k in keys), default=0)
        for k in keys:
            next_round[k] = index + 1
        while len(out) <= index:
            out.append([])
        out[index].append(op)
    return out


def _by_table(ops: Sequence[T], sql: Statements) -> list[tuple[StateStatements, list[T]]]:
    task = [op for op in ops if isinstance(op.scope, TaskScope)]  # type: ignore[attr-defined]
    asset = [op for op in ops if not isinstance(op.scope, TaskScope)]  # type: ignore[attr-defined]
    return [(st, group) for st, group in ((sql.task, task), (sql.asset, asset)) if group]


async def apply_batch(
    conn: asyncpg.Connection, sql: Statements, events: EventStatements, batch: Sequence[Op]
) -> None:
    """Apply ``batch`` inside the caller's transaction, setting each op's result or error
    (``events``: the statements of a round of event commits inside a transaction)."""
    ordered = sorted(batch, key=lambda op: op.phase)
    for op in ordered:
        if isinstance(op, CallOp) and op.phase == CATALOG:
            op.result = await op.fn(conn)
    scopes: dict[AssetScope, int | None] = {}
    for op in ordered:
        for scope in op.scopes():
            scopes.setdefault(scope, None)
    if scopes:
        wanted = list(scopes)
        rows = await conn.fetch(
            sql.resolve,
            [s.asset_id for s in wanted],
            [s.name for s in wanted],
            [s.uri for s in wanted],
        )
        scopes = {scope: row[0] for scope, row in zip(wanted, rows, strict=True)}
        for op in ordered:
            op.resolve(scopes)
    commits = [op for op in ordered if type(op) is EventsOp and op.error is None]
    rounds = _rounds(commits, lambda op: op.names)
    # Event commits check their own fences in the statement that writes them. When anything
    # else here is fenced too, or the commits take several statements, every lease is locked
    # first, in one statement and in trigger_id order: two daemons never lock them in
    # opposite orders (see Statements.lock_leases_shared).
    others = [op for op in ordered if type(op) is not EventsOp and op.error is None]
    lock_all = len(rounds) > 1 or any(op.fence_at() is not None for op in others)
    await _check_fences(conn, sql, others, also=commits if lock_all else ())
    db_clock = sql.clock_param() is None
    for round_ in rounds:
        await commit_round(conn, events, round_, db_clock)
    live = [op for op in ordered if op.error is None]
    await _compare_and_set(
        conn, sql, [op for op in live if isinstance(op, PutOp) and op.phase == CAS]
    )
    await _upsert(conn, sql, [op for op in live if isinstance(op, PutOp) and op.phase == PUT])
    await _delete(conn, sql, [op for op in live if isinstance(op, DeleteOp)])
    for op in live:
        if isinstance(op, ClearOp):
            s = op.scope
            if isinstance(s, TaskScope):
                status = await conn.execute(
                    sql.task_clear, s.dag_id, s.run_id, s.task_id, op.all_map_indices, s.map_index
                )
            else:
                status = await conn.execute(sql.asset_clear, op.asset_id)
            op.result = rowcount(status)
        elif isinstance(op, CallOp) and op.phase != CATALOG:
            op.result = await op.fn(conn)


def one_round(batch: Sequence[Op]) -> TypeGuard[Sequence[EventsOp]]:
    """Whether ``batch`` is only event commits on distinct assets: one statement does it all
    (:func:`~.commits.commit_round`), so it needs no transaction of its own around it."""
    seen: set[str] = set()
    for op in batch:
        if type(op) is not EventsOp:
            return False
        for name in op.names:
            if name in seen:
                return False
            seen.add(name)
    return True


async def _check_fences(
    conn: asyncpg.Connection, sql: Statements, ops: list[Op], also: Sequence[Op] = ()
) -> None:
    """Lock the lease rows the fenced ops (and those of ``also``) depend on (shared, until the
    commit) and refuse the ops whose lease is not live: they get :class:`LeaseLostError` and
    write nothing. ``also``'s ops are only locked for: they check their leases themselves."""
    fenced = [(op, at) for op in ops if (at := op.fence_at()) is not None]
    extra = {at[0].trigger_id for op in also if (at := op.fence_at()) is not None}
    if not fenced and not extra:
        return
    ids = sorted(extra.union(fence.trigger_id for _, (fence, _) in fenced))
    rows = await conn.fetch(sql.lock_leases_shared, ids)
    held = {r[0]: (r[1], r[2], r[3]) for r in rows}
    db_now = rows[0][4] if rows and sql.clock_param() is None else None
    for op, (fence, write_at) in fenced:
        try:  # the database's clock, unless the backend was given one of its own
            check_fence(fence, held.get(fence.trigger_id), db_now or write_at)
        except LeaseLostError as exc:
            op.error = exc


async def _compare_and_set(conn: asyncpg.Connection, sql: Statements, ops: list[PutOp]) -> None:
    for st, group in _by_table(ops, sql):
        width = len(st.spec.keys)
        for batch in _rounds(group, lambda op: (op.pk(),)):
            done: dict[tuple[Any, ...], int] = {}
            fresh = [op.row() for op in batch if op.expected == 0]
            known = [(*op.row(), op.expected) for op in batch if op.expected != 0]
            for statement, rows in ((st.insert_new, fresh), (st.update_if, known)):
                if rows:
                    got = await conn.fetch(statement, *columns(rows, len(rows[0])))
                    done.update((tuple(r)[:width], r[width]) for r in got)
            missed = [op.pk() for op in batch if op.pk() not in done]
            actual: dict[tuple[Any, ...], int] = {}
            if missed:
                got = await conn.fetch(st.versions, *columns(missed, width))
                actual = {tuple(r)[:width]: r[width] for r in got}
            for op in batch:
                row_key = op.pk()
                if row_key in done:
                    op.result = done[row_key]
                else:
                    assert op.expected is not None
                    op.error = VersionConflictError(op.key, op.expected, actual.get(row_key, 0))


async def _upsert(conn: asyncpg.Connection, sql: Statements, ops: list[PutOp]) -> None:
    for st, group in _by_table(ops, sql):
        width = len(st.spec.keys)
        for batch in _rounds(group, lambda op: (op.pk(),)):
            rows = [op.row() for op in batch]
            got = await conn.fetch(st.upsert, *columns(rows, len(rows[0])))
            versions = {tuple(r)[:width]: r[width] for r in got}
            for op in batch:
                op.result = versions[op.pk()]


async def _delete(conn: asyncpg.Connection, sql: Statements, ops: list[DeleteOp]) -> None:
    for st, group in _by_table(ops, sql):
        width = len(st.spec.keys)
        for batch in _rounds(group, lambda op: (op.pk(),)):
            keys = [op.pk() for op in batch]
            got = {tuple(r) for r in await conn.fetch(st.delete, *columns(keys, width))}
            for op, row_key in zip(batch, keys, strict=True):
                op.result = row_key in got
