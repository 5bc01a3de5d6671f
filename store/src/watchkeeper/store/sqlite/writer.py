"""Group commit for SQLite: one writer drains a queue of operations into shared transactions.

Every write of :class:`~watchkeeper.store.SqliteStateBackend` is an *operation*: a plain
function ``fn(tx) -> result`` that runs SQL on the writer's connection. Callers submit
operations to the shared :class:`~watchkeeper.store._commit_queue.CommitQueue` and wait for
theirs. Its writer task takes everything queued (up to ``max_batch``) and this module runs
the whole batch as one call in the writer's own thread (a :class:`~.._threads.LoopThreads` of
one, which also closes the connection, so one thread owns the ``sqlite3`` connection):

    BEGIN IMMEDIATE
      SAVEPOINT op; <op 1>; RELEASE op        -- or ROLLBACK TO op: only op 1 fails
      <op 2: one statement, no savepoint>     -- SQLite undoes a failed statement by itself
      INSERT ... VALUES (op 3), (op 4), ...   -- plain upserts of distinct keys, coalesced
    COMMIT                                    -- one fsync for the whole batch

An operation that raises (a version conflict, an unknown asset, a constraint) is rolled back to
its savepoint (or its statement) and only its caller gets the error; the rest of the batch
commits. Plain upserts (the bulk of watermark traffic) are *coalesced*: neighbouring upserts of
distinct keys go into one multi-row ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` (several
times cheaper per row than one statement each); any other operation, or a second write of the
same key, first flushes what is pending, so the effects keep the order of the calls. If a
multi-row statement fails, its operations are re-run one by one and only the culprit fails.
Operations that name an :class:`OpGroup` (event commits) are run the same way: neighbouring
ones go to the group in one call, inside one savepoint; if that call fails it is rolled back
and each operation runs alone.
A caller's ``submit()`` returns after ``COMMIT``, so every awaited write is durable
(``synchronous=FULL``).

SQLITE_BUSY (another process holds the write lock past ``busy_timeout``, or a commit meets a
busy WAL) rolls the batch back and re-runs it with backoff; operations are pure functions of the
database, so a re-run is safe. When retries run out every operation of the batch fails with
:class:`StoreUnavailableError` chained from the sqlite3 error (so does a disk I/O error; other
driver errors are :class:`BackendUnavailableError`, constraints a :class:`StateStoreError`).

Before each ``COMMIT`` the writer calls its ``check`` (the backend's: is the file at the
database's path still the one this connection opened?); when it raises, the batch is rolled
back and every operation of it fails with that error, so nothing is reported committed into a
removed file.

Cancellation: a caller cancelled while its operation is still being handed over gives it up; a
caller cancelled once it is queued or running only stops waiting, and the operation may still
commit. The writer is never disturbed by its callers' cancellation.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, Final, NamedTuple, Protocol, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from .._commit_queue import CommitQueue, QueuedWrite
from .._threads import LoopThreads
from .._types import AssetScope
from ..errors import (
    AssetNotFoundError,
    BackendUnavailableError,
    DatabaseFileRemovedError,
    StateStoreError,
    StoreClosedError,
    StoreUnavailableError,
)
from .schema import asset_match, from_db, is_busy, retry_busy, to_db, unavailable

__all__ = ["GroupCommitWriter", "Op", "OpGroup", "Tx", "Upsert", "UpsertGroup"]

T = TypeVar("T")
R = TypeVar("R")
Row = tuple[Any, ...]

DEFAULT_MAX_BATCH: Final = 1024
_CHUNKS: Final = (256, 64, 16, 4, 1)  # rows per coalesced upsert statement


class Tx:
    """What an operation receives: the connection (inside the batch transaction), the batch's
    timestamp and the cache of resolved asset scopes.

    Every row a batch writes carries one timestamp, read from the backend's clock once per
    batch: the operations of a batch commit at the same instant, so that is also the truth.

    The cache maps an :class:`AssetScope` to ``(asset_id, name)`` of an active asset. It is
    emptied when another connection has committed since it was filled (``PRAGMA
    data_version``, checked at the start of every batch while the write lock is held, so no one
    can change ``assets`` during the batch), when an operation touches ``assets``, and when a
    batch rolls back. A deactivated asset is therefore never resolved from a stale entry.
    """

    __slots__ = ("_assets", "_by_name", "_clock", "_data_version", "_now", "conn")

    def __init__(self, conn: sqlite3.Connection, clock: Callable[[], datetime]) -> None:
        self.conn = conn
        self._clock = clock
        self._assets: dict[AssetScope, tuple[int, str]] = {}
        self._by_name: dict[str, tuple[int, str]] = {}  # scopes of a name alone, by name
        self._data_version = -1
        self._now: tuple[datetime, str] | None = None

    def begin(self) -> None:
        """Start a batch: a fresh timestamp, and no cache entry older than another's commit."""
        self._now = None
        version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._assets.clear()
            self._by_name.clear()
            self._data_version = version

    def now(self) -> tuple[datetime, str]:
        """The batch's timestamp, as an aware UTC datetime and as stored text."""
        if self._now is None:
            text = to_db(self._clock())
            self._now = (from_db(text), text)
        return self._now

    def resolve(self, scope: AssetScope) -> tuple[int, str]:
        """``(asset_id, name)`` of the active asset ``scope`` names, or :class:`AssetNotFoundError`."""
        name = scope.name
        if name is not None and scope.uri is None and scope.asset_id is None:
            hit = self._by_name.get(name)  # a str's hash is cached: no scope hashed
            if hit is None:
                hit = self._by_name[name] = self._lookup(scope)
            return hit
        hit = self._assets.get(scope)
        if hit is None:
            hit = self._assets[scope] = self._lookup(scope)
        return hit

    def _lookup(self, scope: AssetScope) -> tuple[int, str]:
        where, params = asset_match(scope)
        row = self.conn.execute(
            f"SELECT id, name FROM assets WHERE {where} ORDER BY id LIMIT 1", params
        ).fetchone()
        if row is None:
            raise AssetNotFoundError(str(scope))
        return row[0], row[1]

    def resolve_name(self, name: str) -> tuple[int, str]:
        """:meth:`resolve` of ``AssetScope(name=name)`` (an event's asset), without building
        the scope once it is cached."""
        hit = self._by_name.get(name)
        if hit is None:
            hit = self._by_name[name] = self._lookup(AssetScope(name=name))
        return hit

    def forget_assets(self) -> None:
        """Drop every cached resolution (call after changing ``assets``)."""
        self._assets.clear()
        self._by_name.clear()


class UpsertGroup(Protocol):
    """Plain upserts of one table that one multi-row statement can apply together."""

    def execute(self, conn: sqlite3.Connection, rows: Sequence[Row]) -> dict[Row, int]:
        """Apply ``rows`` (distinct keys); return each primary key's new version."""
        ...


class Upsert(NamedTuple):
    """One plain upsert, ready to share a statement with others of its ``group``."""

    group: UpsertGroup
    pk: Row
    row: Row


class OpGroup(Protocol):
    """Operations of one kind that the writer may run together, as one call.

    ``run(tx, items)`` gets the ``item`` of each neighbouring operation of the group, in call
    order, and must have the same effects as running their ``fn`` one after the other. It
    returns one outcome per item: its result, or the exception its caller gets. An item that
    fails must have written nothing. If ``run`` itself raises, the writer undoes it and runs
    each operation alone, so only the faulty one fails.
    """

    def run(self, tx: Tx, items: Sequence[Any]) -> list[Any]:
        """Apply ``items`` in order; one outcome (result or exception) per item."""
        ...


class Op(QueuedWrite):
    """One queued operation: ``fn(tx, item)`` and how the writer may combine it with its
    neighbours (``coalesce(tx, item)`` for a plain upsert, ``group`` for an :class:`OpGroup`).

    The callers on the hot paths build it with module-level functions and their argument as
    ``item`` (no closure per call), :meth:`GroupCommitWriter.put` it and await ``op.done``.
    """

    __slots__ = ("coalesce", "fn", "group", "item", "savepoint")

    def __init__(
        self,
        fn: Callable[[Tx, Any], Any],
        item: Any,
        *,
        savepoint: bool = True,
        coalesce: Callable[[Tx, Any], Upsert] | None = None,
        group: OpGroup | None = None,
    ) -> None:
        super().__init__()
        self.fn = fn
        self.item = item
        self.coalesce = coalesce
        self.group = group
        self.savepoint = savepoint


def _call(tx: Tx, fn: Callable[[Tx], Any]) -> Any:
    """The ``fn`` of an operation given as a plain ``fn(tx)``."""
    return fn(tx)


def _translate(exc: sqlite3.Error) -> StateStoreError:
    if isinstance(exc, sqlite3.IntegrityError):
        error: StateStoreError = StateStoreError(f"SQLite constraint failed: {exc}")
        error.__cause__ = exc
        return error
    return unavailable(exc, f"SQLite failed: {exc}")


def _copy(exc: BaseException) -> BaseException:
    """A fresh instance per caller, so concurrent raisers do not share one traceback."""
    fresh: BaseException
    if type(exc) in (StateStoreError, BackendUnavailableError, StoreUnavailableError):
        fresh = type(exc)(str(exc))
    elif isinstance(exc, DatabaseFileRemovedError):
        fresh = DatabaseFileRemovedError(exc.path, exc.reason)
    else:
        return exc
    fresh.__cause__ = exc.__cause__
    return fresh


class _Pending:
    """Coalesced upserts of one group waiting for their statement, with their keys."""

    __slots__ = ("keys", "ops", "ups")

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.ups: list[Upsert] = []
        self.keys: set[Row] = set()


class _BatchAborted(Exception):
    """The whole transaction was lost (SQLite rolled it back, or COMMIT failed)."""


class GroupCommitWriter:
    """The one writer of a :class:`SqliteStateBackend`; see the module docstring."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        owner: object,
        clock: Callable[[], datetime],
        *,
        busy_timeout: float,
        max_batch: int = DEFAULT_MAX_BATCH,
        check: Callable[[], None] | None = None,
    ) -> None:
        self._tx = Tx(conn, clock)
        self._check = check
        self._owner = owner
        self._busy_timeout = busy_timeout
        self._max_batch = max_batch
        self.thread = LoopThreads(1, name="watchkeeper-sqlite-writer")
        """The thread that uses the connection: each batch in turn, then its closing."""
        self.queue: CommitQueue[Op] = CommitQueue(
            owner,
            self._run_batch_in_thread,
            in_flight_error=lambda: StoreClosedError(owner),
            max_batch=max_batch,
        )

    # -- callers ---------------------------------------------------------------------------

    async def submit(self, fn: Callable[[Tx], T], *, savepoint: bool = True) -> T:
        """Queue ``fn`` and return its result once its batch has committed.

        ``savepoint=False`` is for operations of exactly one statement: SQLite undoes a failed
        statement by itself, so the two extra statements of a savepoint buy nothing. The hot
        paths build an :class:`Op` themselves (to coalesce plain upserts, or to run as a
        group) and :meth:`put` it.
        """
        op = Op(_call, fn, savepoint=savepoint)
        self.queue.put(op)
        await op.done
        result: T = op.outcome()
        return result

    def put(self, op: Op) -> None:
        """Queue ``op``; its caller awaits ``op.done``, then takes ``op.outcome()``.

        An op with ``coalesce`` is a plain upsert (``fn`` must then return its new version):
        ``coalesce`` returns its row, and the writer applies neighbouring upserts of distinct
        keys in one statement, falling back to ``fn`` alone if that statement fails. With a
        ``group``, the writer runs neighbouring operations of that group in one call
        (:class:`OpGroup`), falling back to ``fn`` for each if that call fails.
        """
        self.queue.put(op)

    async def aclose(self) -> None:
        """Accept no more operations and wait until every queued one has committed or failed."""
        self.queue.close()
        await self.queue.wait_stopped()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Drain the queue batch by batch until :meth:`aclose`; start in the backend's task group."""
        await self.queue.run(task_status=task_status)

    async def _run_batch_in_thread(self, batch: list[Op]) -> None:
        try:
            await self.thread.call(partial(self._run_batch, batch), abandon=False)
        except BaseException:
            # The thread ran to its end even if we were cancelled meanwhile: what it reached
            # has its final outcome (the rest fails as in flight: StoreClosedError). On a
            # normal return every op ran, and the queue wakes them all.
            for op in batch:
                if op.ran:
                    op.settle()
            raise

    # -- inside the worker thread ----------------------------------------------------------

    def _run_batch(self, batch: list[Op]) -> None:
        try:
            retry_busy(
                lambda: self._attempt(batch),
                timeout=self._busy_timeout,
                what=f"commit a batch of {len(batch)} writes",
            )
        except Exception as exc:  # noqa: BLE001 - every caller of the batch must get it
            failure: BaseException = exc
            if isinstance(exc, _BatchAborted) and exc.__cause__ is not None:
                failure = exc.__cause__
            if isinstance(failure, sqlite3.Error):
                failure = _translate(failure)
            for op in batch:
                op.ran, op.result, op.error = True, None, _copy(failure)

    def _attempt(self, batch: list[Op]) -> None:
        tx = self._tx
        conn = tx.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            tx.begin()
            pending: dict[UpsertGroup, _Pending] = {}
            grouped: list[Op] = []  # neighbouring operations of one OpGroup
            for op in batch:
                if op.group is not None:
                    if pending:
                        for group, queued in pending.items():  # keep the order of effects
                            self._flush(tx, group, queued)
                        pending.clear()
                    if grouped and grouped[0].group is not op.group:
                        self._run_group(tx, grouped)
                        grouped = []
                    grouped.append(op)
                    continue
                if grouped:
                    self._run_group(tx, grouped)
                    grouped = []
                if op.coalesce is None:
                    for group, queued in pending.items():  # keep the order of effects
                        self._flush(tx, group, queued)
                    pending.clear()
                    self._run_op(tx, op)
                    continue
                op.reset()
                up = self._guard(tx, op, op.coalesce)
                if up is None:
                    continue
                slot = pending.get(up.group)
                if slot is None:
                    slot = pending[up.group] = _Pending()
                elif up.pk in slot.keys:  # one key twice: the first must land first
                    self._flush(tx, up.group, slot)
                    slot = pending[up.group] = _Pending()
                slot.ops.append(op)
                slot.ups.append(up)
                slot.keys.add(up.pk)
            if grouped:
                self._run_group(tx, grouped)
            for group, queued in pending.items():
                self._flush(tx, group, queued)
            if self._check is not None:
                self._check()  # raises (and the batch rolls back) if the file is gone
            conn.execute("COMMIT")
        except BaseException:
            tx.forget_assets()
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the first error is the one worth reporting
            raise

    def _flush(self, tx: Tx, group: UpsertGroup, waiting: _Pending) -> None:
        """Apply coalesced upserts in chunks of a few fixed sizes (few distinct statements to
        prepare and cache); a chunk whose statement fails is re-run one operation at a time,
        so only the operation at fault gets the error."""
        ops, ups = waiting.ops, waiting.ups
        start = 0
        while start < len(ops):
            size = next(n for n in _CHUNKS if n <= len(ops) - start)
            chunk = ops[start : start + size]
            try:
                versions = group.execute(tx.conn, [up.row for up in ups[start : start + size]])
            except sqlite3.Error as exc:
                if is_busy(exc):
                    raise
                if not tx.conn.in_transaction:
                    raise _BatchAborted from exc
                for op in chunk:  # SQLite undid the failed statement as a whole
                    self._run_op(tx, op)
            else:
                for op, up in zip(chunk, ups[start : start + size], strict=True):
                    version = versions.get(up.pk)
                    if version is None:  # cannot happen: RETURNING names every row
                        op.error = StateStoreError(f"no version returned for {up.pk!r}")
                    op.result = version
            start += size

    def _run_group(self, tx: Tx, ops: list[Op]) -> None:
        """Run neighbouring operations of one :class:`OpGroup` in one call, inside a savepoint;
        if the call fails, undo it and run each operation alone (only the culprit fails)."""
        group = ops[0].group
        if len(ops) == 1 or group is None:
            for op in ops:
                self._run_op(tx, op)
            return
        conn = tx.conn
        for op in ops:  # reset(), inline: once per event of the batch
            op.ran, op.result, op.error = True, None, None
        conn.execute("SAVEPOINT wk_op")
        try:
            outcomes = group.run(tx, [op.item for op in ops])
            if len(outcomes) != len(ops):
                raise StateStoreError(f"{len(outcomes)} outcomes for {len(ops)} operations")
        except sqlite3.Error as exc:
            if is_busy(exc):
                raise
            if not conn.in_transaction:
                raise _BatchAborted from exc
            outcomes = None
        except Exception:  # noqa: BLE001 - the one-by-one path decides who gets which error
            outcomes = None
        if outcomes is None:
            self._undo(conn)
            for op in ops:
                self._run_op(tx, op)
            return
        conn.execute("RELEASE wk_op")
        for op, outcome in zip(ops, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                op.error = outcome
            else:
                op.result = outcome

    def _run_op(self, tx: Tx, op: Op) -> None:
        op.reset()
        if op.savepoint:
            tx.conn.execute("SAVEPOINT wk_op")
            op.result = self._guard(tx, op, op.fn)
            if op.error is None:
                tx.conn.execute("RELEASE wk_op")
            else:
                self._undo(tx.conn)
        else:
            op.result = self._guard(tx, op, op.fn)

    def _guard(self, tx: Tx, op: Op, fn: Callable[[Tx, Any], R]) -> R | None:
        """``fn(tx, op.item)``, or None with ``op.error`` set; errors that doom the batch
        propagate."""
        try:
            return fn(tx, op.item)
        except sqlite3.Error as exc:
            if is_busy(exc):
                raise  # retry_busy re-runs the whole batch
            if not tx.conn.in_transaction:
                raise _BatchAborted from exc  # SQLite gave up the whole transaction
            op.error = _translate(exc)
        except Exception as exc:  # noqa: BLE001 - the op's own error, handed to its caller
            op.error = exc
        return None

    def _undo(self, conn: sqlite3.Connection) -> None:
        self._tx.forget_assets()
        conn.execute("ROLLBACK TO wk_op")
        conn.execute("RELEASE wk_op")
