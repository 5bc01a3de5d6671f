"""Group commit for :class:`~watchkeeper.store.PostgresStateBackend`: one writer, one transaction
per batch of concurrent writes, several batches in flight.

Callers submit an :class:`~watchkeeper.store.postgres.ops.Op` to the shared
:class:`~watchkeeper.store._commit_queue.CommitQueue` and wait; its writer task takes everything
queued and hands the batch to :meth:`GroupWriter._run_batch`, which applies it with
:func:`~watchkeeper.store.postgres.batch.apply_batch` in one transaction on one of the
writer's own connections and commits; only then are the callers woken. A worker's usual steps
(:class:`~.steps.StepOp`) queue here too and go after the batch's transaction, one statement
per group (:mod:`.steps`). So an awaited write is durable
when it returns, and a thousand concurrent writers share one commit.

Batches overlap: while one waits for the server, the next (on another connection, up to
``connections`` of them, opened as they are first needed) is sent, if it holds at least a few
dozen writes. Only batches of event commits on disjoint sets of assets and watchers overlap
(:func:`batch_keys`), and a batch of steps with them (not with another); a batch with any
other write runs alone. So the writes of one watcher
commit in the order they were queued, and two transactions in flight never wait for each
other's rows.

Each op stays atomic on its own. If a statement fails (data PostgreSQL refuses, a race with
another daemon), the transaction is rolled back and its ops are replayed one per transaction,
so the error reaches only the op that caused it. A connection lost before ``COMMIT`` was sent
is replaced and the batch retried once (nothing of it was applied); one lost during the commit
gives every op of the batch :class:`StoreUnavailableError` (it may have committed), and the
next batch reconnects. A batch that is only one round of event commits (the usual one) is a
single statement in a transaction of its own (:mod:`.commits`): one round trip, and once it is
sent a lost connection counts as lost during the commit.

A caller cancelled while its op is queued or in flight gets the cancellation; the op itself is
not withdrawn and may still commit. Nothing else is disturbed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._commit_queue import CommitQueue
from ..errors import BackendUnavailableError
from .batch import apply_batch, one_round
from .commits import EventStatements, commit_round
from .connections import Freshness, breaks_connection, close_quietly, drop_if_broken, roll_back
from .ops import EventsOp, Op
from .puts import alone, put_alone_sql, upsert_alone
from .sql import Statements, is_unavailable, map_error
from .steps import StepOp, step_groups

if TYPE_CHECKING:
    import asyncpg

__all__ = ["GroupWriter", "batch_keys"]


class GroupWriter:
    """How one PostgreSQL backend runs a batch, over the shared commit queue."""

    def __init__(
        self,
        owner: object,
        sql: Statements,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        conn: asyncpg.Connection,
        *,
        max_batch: int = 2048,
        max_batch_bytes: int = 8 << 20,
        connections: int = 4,
        events_sql: str | None = None,
        freshness: Freshness | None = None,
    ) -> None:
        self._owner, self._sql, self._connect = owner, sql, connect
        self._freshness = Freshness() if freshness is None else freshness
        # Sent with the BEGIN of every batch that commits events, single or batched, in one
        # message (the commit-order lock and the one NOTIFY of the batch: see .consumers).
        self._begin_events = "BEGIN" if events_sql is None else f"BEGIN; {events_sql}"
        # A round of event commits inside a batch's transaction; a batch that is one round:
        # the same lock and NOTIFY, in one statement.
        self._events = EventStatements(sql.prefix)
        self._one_round = None if events_sql is None else EventStatements(sql.prefix, events_sql)
        self._put_alone = put_alone_sql(sql.prefix)
        # One slot per batch in flight; a slot's connection is opened when first needed.
        self._conns: list[asyncpg.Connection | None] = [conn] + [None] * (connections - 1)
        self._tuned: list[asyncpg.Connection | None] = [None] * connections
        self._free = list(range(connections - 1, -1, -1))  # slot 0 (the open one) first
        self.queue: CommitQueue[Op] = CommitQueue(
            owner,
            self._run_batch,
            in_flight_error=lambda: BackendUnavailableError(
                "the PostgreSQL writer stopped while this write was in flight; "
                "it may or may not have committed"
            ),
            max_batch=max_batch,
            max_batch_bytes=max_batch_bytes,
            concurrency=connections,
            keys_of=batch_keys,
        )

    async def submit(self, op: Op) -> Any:
        """Queue ``op``, wait until its batch has committed, and return its result (the
        queue's ``submit`` inline: one coroutine fewer per write)."""
        self.queue.put(op)
        await op.done  # cancelling this cancels only the waiting: the write stays queued
        return op.outcome()

    def discard(self) -> None:
        """Close both ends of the queue of a writer that never ran."""
        self.queue.discard()

    async def aclose(self) -> None:
        """Stop taking ops, let the writer commit what is queued, then close the connection."""
        try:
            self.queue.close()
            await self.queue.wait_stopped()
        finally:
            conns, self._conns = self._conns, [None] * len(self._conns)
            async with anyio.create_task_group() as tg:  # at once: each may take its 2 s
                for conn in conns:
                    tg.start_soon(close_quietly, conn)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Take batches off the queue until it is closed and empty."""
        await self.queue.run(task_status=task_status)

    async def _connection(self, slot: int) -> asyncpg.Connection:
        conn = self._conns[slot]
        if conn is None or conn.is_closed() or self._freshness.stale(conn):
            if conn is not None:
                conn.terminate()  # stale: on the network a statement timed out on, maybe
            self._conns[slot] = None
            conn = self._conns[slot] = await self._connect()
        if self._tuned[slot] is not conn:
            # Without JIT: the planner cannot know how many rows the JSON of an event round
            # holds, guesses thousands, and compiling that plan cost a hundred times running it.
            # The writer's connections are its own (never pooled), so the setting stays here.
            await conn.execute("SET jit = off")
            self._tuned[slot] = conn
        await self._freshness.fence(conn)  # no write before in-doubt sessions are ended
        return conn

    async def _run_batch(self, batch: list[Op]) -> None:
        # The queue never has more batches in flight than slots, so one is free.
        slot = self._free.pop()
        try:
            writes = [op for op in batch if type(op) is not StepOp]
            if writes:
                await self._run_on(slot, writes)
            if len(writes) < len(batch):
                await self._run_steps(slot, [op for op in batch if type(op) is StepOp])
        finally:
            self._free.append(slot)

    async def _run_steps(self, slot: int, steps: list[StepOp]) -> None:
        """Each group of the batch's steps, one statement (a transaction of its own) each; a
        failed statement gives its error to its group's steps only. Not retried: once sent,
        a statement whose connection was lost may have committed."""
        for (runner, group), members in step_groups(steps).items():
            conn: asyncpg.Connection | None = None
            try:
                conn = await self._connection(slot)
                await runner(conn, group, members)
            except BaseException as exc:
                if conn is not None:
                    drop_if_broken(conn, exc)
                if not isinstance(exc, Exception):
                    raise
                self._freshness.saw(exc)
                self._broken(slot, conn, exc)
                for step in members:
                    step.fail(map_error(exc, "finishing and claiming runs"))
        for step in steps:
            step.settle()

    async def _run_on(self, slot: int, batch: list[Op], *, retry: bool = True) -> None:
        conn: asyncpg.Connection | None = None
        applied = False
        try:
            conn = await self._connection(slot)
            if self._one_round is not None and one_round(batch):
                # One statement, a transaction of its own: once it is sent, a lost connection
                # may have committed it, so the batch is not tried again (its ops get the error).
                applied = True
                db_clock = self._sql.clock_param() is None
                await self._alone(conn, commit_round(conn, self._one_round, batch, db_clock))
            elif alone(batch):  # plain upserts of asset state: the same, one statement
                applied = True
                await self._alone(conn, upsert_alone(conn, self._put_alone, batch))
            else:
                events = any(type(op) is EventsOp for op in batch)
                try:
                    # One round trip for BEGIN (and the events' lock and NOTIFY), then the batch.
                    await conn.execute(self._begin_events if events else "BEGIN")
                    await apply_batch(conn, self._sql, self._events, batch)
                    applied = True
                    await conn.execute("COMMIT")
                except BaseException as exc:
                    await _end_failed(conn, exc)
                    raise
        except Exception as exc:  # noqa: BLE001 - any failure goes to the ops, never kills the writer
            self._freshness.saw(exc)
            if retry and not applied and self._broken(slot, conn, exc):
                # Lost before COMMIT was sent, so nothing was applied: once more, reconnected.
                for op in batch:
                    op.reset()
                await self._run_on(slot, batch, retry=False)
                return
            await self._recover(slot, batch, exc)
            return
        for op in batch:
            op.settle()

    async def _alone(self, conn: asyncpg.Connection, statement: Awaitable[None]) -> None:
        """Await a batch's one statement (a transaction of its own)."""
        try:
            await statement
        except BaseException as exc:
            await _end_failed(conn, exc)  # nothing to end unless it was cut half-way
            raise

    def _broken(self, slot: int, conn: asyncpg.Connection | None, exc: Exception) -> bool:
        """Drop the slot's connection if ``exc`` means it is lost; True when so."""
        # A read-only transaction counts: the connection may point at a demoted primary.
        if conn is not None and not conn.is_closed() and not is_unavailable(exc):
            return False
        if conn is not None:
            conn.terminate()
        self._conns[slot] = None
        return True

    async def _recover(self, slot: int, batch: list[Op], exc: Exception) -> None:
        if self._broken(slot, self._conns[slot], exc) or len(batch) == 1:
            for op in batch:
                op.fail(map_error(exc, "writing"))
                op.settle()
            return
        # One op made the batch fail: replay them one per transaction, so only it fails.
        for op in batch:
            op.reset()
            await self._run_on(slot, [op], retry=False)


def batch_keys(batch: Sequence[Op]) -> frozenset[object] | None:
    """What a batch of event commits and steps writes, for the writer to overlap only batches
    that share nothing: the watched assets (their events, their state rows) and the watchers;
    the runs (one batch of steps at a time). None (the batch runs alone) when it holds any
    other write."""
    keys: set[object] = set()
    for op in batch:
        if type(op) is EventsOp:
            keys.add(("watcher", op.watcher))
            keys.update(op.names)
        elif type(op) is StepOp:
            keys.add(_STEPS)
        else:
            return None
    return frozenset(keys)


_STEPS = ("steps",)


async def _end_failed(conn: asyncpg.Connection, exc: BaseException) -> None:
    """End the failed batch's transaction: a connection whose statement timed out or was
    cancelled is terminated at once (its answer may never come), any other rolls back (and is
    terminated if it cannot), so no transaction is ever left open on it."""
    if breaks_connection(exc):
        drop_if_broken(conn, exc)
    else:
        await roll_back(conn)
