"""Group commit for :class:`~watchkeeper.store.PostgresStateBackend`: one writer, one transaction
per batch of concurrent writes.

Callers put an :class:`~._postgres_ops.Op` on a bounded memory object stream and wait for its
``done`` event; one writer task (in the backend's task group) takes everything queued, applies
it with :func:`~._postgres_ops.apply_batch` in one transaction on its own connection, commits,
and only then wakes the callers. So an awaited write is durable when it returns, and a thousand
concurrent writers share one commit.

Each op stays atomic on its own. If a statement fails (data PostgreSQL refuses, a race with
another daemon), the transaction is rolled back and its ops are replayed one per transaction,
so the error reaches only the op that caused it. A connection lost before ``COMMIT`` was sent
is replaced and the batch retried once (nothing of it was applied); one lost during the commit
gives every op of the batch :class:`StoreUnavailableError` (it may have committed), and the
next batch reconnects.

A caller cancelled while its op is queued or in flight gets the cancellation; the op itself is
not withdrawn and may still commit. Nothing else is disturbed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ._postgres_ops import CommitOp, Op, apply_batch
from ._postgres_sql import Statements, is_unavailable, map_error
from .errors import BackendUnavailableError, StoreClosedError

if TYPE_CHECKING:
    import asyncpg

__all__ = ["GroupWriter"]


class GroupWriter:
    """The single writer task of one backend and the stream that feeds it."""

    def __init__(
        self,
        owner: object,
        sql: Statements,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        conn: asyncpg.Connection,
        *,
        buffer_size: int = 4096,
        max_batch: int = 2048,
        max_batch_bytes: int = 8 << 20,
        on_events: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    ) -> None:
        self._owner, self._sql, self._connect = owner, sql, connect
        self._conn: asyncpg.Connection | None = conn
        self._send, self._receive = anyio.create_memory_object_stream[Op](buffer_size)
        self._max_batch, self._max_bytes = max_batch, max_batch_bytes
        self._stopped = anyio.Event()
        # Run first in every batch that commits events (the commit-order lock and the one
        # NOTIFY of the batch: see _postgres_tasks).
        self._on_events = on_events
        self.batches = 0
        self.ops = 0

    async def submit(self, op: Op) -> Any:
        """Queue ``op``, wait until its batch has committed, and return its result."""
        try:
            try:
                # No checkpoint when the buffer has room: waiting on ``done`` yields anyway.
                self._send.send_nowait(op)
            except anyio.WouldBlock:
                await self._send.send(op)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise StoreClosedError(self._owner) from None
        await op.done.wait()
        return op.outcome()

    def discard(self) -> None:
        """Close both ends of the stream of a writer that never ran."""
        self._send.close()
        self._receive.close()

    async def aclose(self) -> None:
        """Stop taking ops, let the writer commit what is queued, then close the connection."""
        try:
            await self._send.aclose()
            await self._stopped.wait()
        finally:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    with anyio.move_on_after(2):
                        await conn.close()
                finally:
                    if not conn.is_closed():
                        conn.terminate()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Take batches off the stream until it is closed and empty."""
        batch: list[Op] = []
        carry: Op | None = None
        try:
            task_status.started()
            while True:
                if carry is None:
                    try:
                        carry = await self._receive.receive()
                    except anyio.EndOfStream:
                        break
                batch, size, carry = [carry], carry.weight(), None
                while len(batch) < self._max_batch:
                    try:
                        op = self._receive.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    if size + op.weight() > self._max_bytes:
                        carry = op
                        break
                    batch.append(op)
                    size += op.weight()
                await self._run_batch(batch)
                batch = []
        finally:
            for op in batch:
                if not op.done.is_set():
                    op.fail(
                        BackendUnavailableError(
                            "the PostgreSQL writer stopped while this write was in flight; "
                            "it may or may not have committed"
                        )
                    )
            if carry is not None:
                carry.fail(StoreClosedError(self._owner))
            while True:
                try:
                    self._receive.receive_nowait().fail(StoreClosedError(self._owner))
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
            self._receive.close()
            self._stopped.set()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = None
            self._conn = await self._connect()
        return self._conn

    async def _run_batch(self, batch: list[Op], *, retry: bool = True) -> None:
        conn: asyncpg.Connection | None = None
        applied = False
        try:
            conn = await self._connection()
            async with conn.transaction():
                if self._on_events is not None and any(isinstance(op, CommitOp) for op in batch):
                    await self._on_events(conn)
                await apply_batch(conn, self._sql, batch)
                applied = True
        except Exception as exc:  # noqa: BLE001 - any failure goes to the ops, never kills the writer
            if retry and not applied and self._broken(conn, exc):
                # Lost before COMMIT was sent, so nothing was applied: once more, reconnected.
                for op in batch:
                    op.reset()
                await self._run_batch(batch, retry=False)
                return
            await self._recover(batch, exc)
            return
        self.batches += 1
        self.ops += len(batch)
        for op in batch:
            op.done.set()

    def _broken(self, conn: asyncpg.Connection | None, exc: Exception) -> bool:
        """Drop the connection if ``exc`` means it is lost; True when so."""
        # A read-only transaction counts: the connection may point at a demoted primary.
        if conn is not None and not conn.is_closed() and not is_unavailable(exc):
            return False
        if conn is not None:
            conn.terminate()
        self._conn = None
        return True

    async def _recover(self, batch: list[Op], exc: Exception) -> None:
        if self._broken(self._conn, exc) or len(batch) == 1:
            for op in batch:
                op.fail(map_error(exc, "writing"))
            return
        # One op made the batch fail: replay them one per transaction, so only it fails.
        for op in batch:
            op.reset()
            await self._run_batch([op], retry=False)
