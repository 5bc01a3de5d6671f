"""The writes :class:`~watchkeeper.store.PostgresStateBackend` queues, and how a batch of them
is applied: resolved, ordered by kind, and turned into a few set-based statements.

Ops that share a batch were all in flight at the same moment (none of their callers has had an
answer yet), so any serial order of them is a correct one. :func:`apply_batch` picks the order
that needs the fewest round trips: asset registrations first, then every asset scope is
resolved with one query, then event commits, compare-and-sets, upserts, deletes, clears, and
the rest (status rows, garbage collection), each kind set-based (one ``unnest`` statement for
all of them). Two ops on the same row go in successive rounds of statements, so the second
sees the first.

Ops that can fail for a reason of their own (an asset that is not registered, a lease the
daemon no longer holds, a version that does not match) are checked inside the transaction
before they write, so a failure touches nothing and records its error on that op alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeGuard, TypeVar

from .._commit_queue import WRITE_OVERHEAD, QueuedWrite
from .._leases import check_fence
from .._types import (
    AssetScope,
    EventBatchCommit,
    EventCommit,
    Fence,
    Put,
    StateScope,
    TaskScope,
    Writer,
)
from ..errors import AssetNotFoundError, LeaseLostError, VersionConflictError
from .commits import commit_batches, commit_events
from .sql import (
    Statements,
    StateStatements,
    columns,
    rowcount,
    writer_fields,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "CATALOG",
    "LATE",
    "BatchCommitOp",
    "CallOp",
    "ClearOp",
    "CommitOp",
    "DeleteOp",
    "Op",
    "PutOp",
    "apply_batch",
    "one_round",
]

T = TypeVar("T")

CATALOG: Final = 0  # asset registration: first, so the scopes resolve against it
EVENTS: Final = 1
CAS: Final = 2
PUT: Final = 3
DELETE: Final = 4
CLEAR: Final = 5
LATE: Final = 6  # trigger status, garbage collection


class Op(QueuedWrite):
    """One write waiting for the writer, with the phase of the batch it runs in."""

    __slots__ = ("phase",)

    def __init__(self, phase: int) -> None:
        super().__init__()
        self.phase = phase

    def resolve(self, ids: dict[AssetScope, int | None]) -> None:
        """Take the asset ids of the scopes :meth:`scopes` named (or record a missing one)."""

    def scopes(self) -> Sequence[AssetScope]:
        return ()

    def fence_at(self) -> tuple[Fence, datetime] | None:
        """The lease this write depends on, and the write's timestamp to check it at."""
        return None


class _ScopedOp(Op):
    """An op on one state scope; an asset scope is resolved to ``asset_id`` in the batch.

    ``writer`` wrote it; when it carries a fence, the op is checked against the lease at
    ``at`` inside the batch's transaction, before anything is written.
    """

    __slots__ = ("asset_id", "at", "scope", "writer")

    def __init__(self, scope: StateScope, phase: int, writer: Writer | None, at: datetime) -> None:
        super().__init__(phase)
        self.scope = scope
        self.writer = writer
        self.at = at
        self.asset_id: int | None = None

    def fence_at(self) -> tuple[Fence, datetime] | None:
        fence = None if self.writer is None else self.writer.fence
        return None if fence is None else (fence, self.at)

    def scopes(self) -> Sequence[AssetScope]:
        return (self.scope,) if isinstance(self.scope, AssetScope) else ()

    def resolve(self, ids: dict[AssetScope, int | None]) -> None:
        if isinstance(self.scope, AssetScope):
            self.asset_id = ids[self.scope]
            if self.asset_id is None:
                self.error = AssetNotFoundError(str(self.scope))

    def row_key(self, key: str) -> tuple[Any, ...]:
        s = self.scope
        if isinstance(s, TaskScope):
            return (s.dag_id, s.run_id, s.task_id, s.map_index, key)
        return (self.asset_id, key)


class PutOp(_ScopedOp):
    """Upsert one key; with ``expected`` a compare-and-set (0: must not exist)."""

    __slots__ = ("expected", "expires_at", "key", "never_expire", "value_json")

    def __init__(self, put: Put, *, updated_at: datetime) -> None:
        expected = put.expected_version
        super().__init__(put.scope, PUT if expected is None else CAS, put.writer, updated_at)
        self.key, self.value_json = put.key, put.value_json
        self.expires_at, self.never_expire = put.expires_at, put.never_expire
        self.expected = expected

    def weight(self) -> int:
        return WRITE_OVERHEAD + len(self.value_json)

    def pk(self) -> tuple[Any, ...]:
        return self.row_key(self.key)

    def row(self) -> tuple[Any, ...]:
        data: tuple[Any, ...] = (self.value_json, self.at, *writer_fields(self.writer))
        if isinstance(self.scope, TaskScope):
            data += (self.expires_at, self.never_expire)
        return self.pk() + data


class DeleteOp(_ScopedOp):
    """Delete one key; the result says whether it existed."""

    __slots__ = ("key",)

    def __init__(self, scope: StateScope, key: str, writer: Writer | None, at: datetime) -> None:
        super().__init__(scope, DELETE, writer, at)
        self.key = key

    def pk(self) -> tuple[Any, ...]:
        return self.row_key(self.key)


class ClearOp(_ScopedOp):
    """Delete every key of a scope; the result is how many."""

    __slots__ = ("all_map_indices",)

    def __init__(
        self, scope: StateScope, all_map_indices: bool, writer: Writer | None, at: datetime
    ) -> None:
        super().__init__(scope, CLEAR, writer, at)
        self.all_map_indices = all_map_indices


_SCOPES: dict[str, AssetScope] = {}
"""The scope of each asset name events were committed to (bounded: see :func:`_name_scope`)."""


def _name_scope(name: str) -> AssetScope:
    """``AssetScope(name=name)``, built (and its name checked) once per name, not per event."""
    scope = _SCOPES.get(name)
    if scope is None:
        if len(_SCOPES) >= 65536:
            _SCOPES.clear()
        scope = _SCOPES[name] = AssetScope(name=name)
    return scope


class _EventsOp(Op):
    """What an event commit and a batch share: the watched assets resolved to ids (each once,
    in order), the fence checked at ``created_at``. Subclasses say how much they weigh."""

    __slots__ = ("_assets", "_fence", "created_at", "targets")

    def __init__(self, assets: tuple[str, ...], fence: Fence | None, created_at: datetime) -> None:
        super().__init__(EVENTS)
        self._assets, self._fence, self.created_at = assets, fence, created_at
        self.targets: list[tuple[int, str]] = []

    @property
    def asset_names(self) -> tuple[str, ...]:
        return self._assets

    def scopes(self) -> Sequence[AssetScope]:
        return [_name_scope(name) for name in self._assets]

    def fence_at(self) -> tuple[Fence, datetime] | None:
        return None if self._fence is None else (self._fence, self.created_at)

    def resolve(self, ids: dict[AssetScope, int | None]) -> None:
        self.targets = []
        for name in self._assets:
            asset_id = ids[_name_scope(name)]
            if asset_id is None:
                self.error = AssetNotFoundError(name)
                return
            if all(asset_id != seen for seen, _ in self.targets):
                self.targets.append((asset_id, name))


class CommitOp(_EventsOp):
    """One trigger event with its state; the result is the events written, in id order.

    Its assets are resolved, and its fence checked, by the statement that writes it
    (:func:`~.commits.commit_events`), not by the batch's shared steps.
    """

    __slots__ = ("commit", "names")

    def __init__(self, commit: EventCommit, created_at: datetime) -> None:
        assets = commit.assets
        super().__init__(assets, commit.fence, created_at)
        self.commit = commit
        # Each asset once, in order (an asset named twice gets one event).
        self.names = list(assets) if len(assets) < 2 else list(dict.fromkeys(assets))

    def scopes(self) -> Sequence[AssetScope]:
        return ()

    def resolve(self, ids: dict[AssetScope, int | None]) -> None:
        pass

    def weight(self) -> int:
        c = self.commit
        one = WRITE_OVERHEAD + len(c.payload_json) + sum(len(v) for v in c.state.values())
        return one * max(1, len(c.assets))


class BatchCommitOp(_EventsOp):
    """A batch of one trigger's events with one state; the result is the events written.

    Applied by one statement of its own (:func:`_commit_batches`), so it is all or nothing
    like every op: a failure rolls the writer's transaction back and replays it alone.
    """

    __slots__ = ("batch",)

    def __init__(self, batch: EventBatchCommit, created_at: datetime) -> None:
        super().__init__(tuple(batch.assets), batch.fence, created_at)
        self.batch = batch

    def weight(self) -> int:
        b = self.batch
        events = sum(WRITE_OVERHEAD + len(payload) for payload, _ in b.events)
        return (events + sum(len(v) for v in b.state.values())) * max(1, len(b.assets))


class CallOp(Op):
    """Any other write: ``fn`` runs on the writer's connection inside the batch transaction."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[asyncpg.Connection], Awaitable[Any]], *, phase: int) -> None:
        super().__init__(phase)
        self.fn = fn


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


async def apply_batch(conn: asyncpg.Connection, sql: Statements, batch: Sequence[Op]) -> None:
    """Apply ``batch`` inside the caller's transaction, setting each op's result or error."""
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
    commits = [op for op in ordered if type(op) is CommitOp and op.error is None]
    rounds = _rounds(commits, lambda op: op.names)
    # Event commits check their own fences in the statement that writes them. When anything
    # else here is fenced too, or the commits take several statements, every lease is locked
    # first, in one statement and in trigger_id order: two daemons never lock them in
    # opposite orders (see Statements.lock_leases_shared).
    others = [op for op in ordered if type(op) is not CommitOp and op.error is None]
    lock_all = len(rounds) > 1 or any(op.fence_at() is not None for op in others)
    await _check_fences(conn, sql, others, also=commits if lock_all else ())
    db_clock = sql.clock_param() is None
    for round_ in rounds:
        await commit_events(conn, sql.commit_events, round_, db_clock)
    live = [op for op in ordered if op.error is None]
    await commit_batches(
        conn,
        (sql.commit_batch, sql.commit_batch_plain),
        [op for op in live if isinstance(op, BatchCommitOp)],
    )
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


def one_round(batch: Sequence[Op]) -> TypeGuard[Sequence[CommitOp]]:
    """Whether ``batch`` is only event commits on distinct assets: one statement does it all
    (:func:`~.commits.commit_events`), so it needs no transaction of its own around it."""
    seen: set[str] = set()
    for op in batch:
        if type(op) is not CommitOp:
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
