"""Leases on PostgreSQL: how the lease jobs (:mod:`watchkeeper.store.sql.leases`, where the
statements and their rules are) run here, the keep-alive thread's connection and the wait for
a release.

- Each job runs in its own short transaction on a connection of its own (opened on first
  use, closed with the backend), one per lane, never in the writer's batches nor behind the
  read pool: with thousands of watchers reading at once, a renewal queued for a pooled
  connection could wait past the node lease's time to live. Renewals have a lane of their
  own, so a claim of thousands of rows never delays one.
- **Fencing** (in the writer's commit transaction, see :mod:`.ops`) reads the trigger leases
  ``FOR SHARE``, which conflicts with a claim's update; ``FOR KEY SHARE`` would not.
- The **keep-alive** (:meth:`~PostgresLeases.open_node_keepalive`) runs the renewal's
  ``UPDATE`` alone, in autocommit, on a connection of its own that a thread of the daemon
  drives on a private event loop: it extends a live node lease and does nothing else (a
  reaped node is rejoined by the daemon's loop, which frees what it held first).
- A **release** (and a node joining) notifies ``<schema>_watchkeeper_leases`` in its
  transaction, once per call (never per lease): daemons waiting
  in :meth:`~PostgresLeases._await_lease_release` (on a LISTEN connection of their own) claim
  at once instead of at their next heartbeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import anyio

from .._leases import check_owner, check_ttl
from ..errors import StateStoreError, StoreClosedError
from ..sql.dialects import POSTGRES
from ..sql.engine import Dialect, Job, Stmt
from ..sql.leases import LeaseStatements
from .connections import (
    CONNECT_TIMEOUT,
    Freshness,
    close_quietly,
    connect,
    connection_class,
)
from .executor import PostgresRunner, no_expiry, run_job
from .part import PostgresPart
from .sql import is_connection_error, is_unavailable, map_error

__all__ = ["PostgresKeepAlive", "PostgresLeases", "lease_channel"]

T = TypeVar("T")


def lease_channel(schema: str | None) -> str:
    """The NOTIFY channel of a schema's lease releases."""
    return f"{schema or 'public'}_watchkeeper_leases"


_LISTENER_CHECK = 10.0
"""Seconds without a notification after which the LISTEN connection is checked."""

_RETRYABLE = ("40P01", "40001")
"""SQLSTATEs of a transaction the server rolled back to break a conflict (deadlock detected,
serialization failure): tried again at once."""


class PostgresKeepAlive:
    """A :class:`~watchkeeper.store.protocols.NodeKeepAliveChannel` on PostgreSQL: one
    connection, on an event loop private to the one thread that calls :meth:`renew` (asyncpg
    needs an asyncio loop; the daemon's own is the one that may be too busy)."""

    def __init__(
        self,
        connect: Callable[[float], Awaitable[Any]],
        statement: Stmt,
        owner: str,
        seconds: float,
        clock: Callable[[], datetime | None],
        freshness: Freshness | None = None,
    ) -> None:
        self._connect, self._statement, self._clock = connect, statement, clock
        # The backend's: a statement timed out on the daemon's loop makes this thread's
        # connection, if older, stale too (read here, never written).
        self._freshness = Freshness() if freshness is None else freshness
        self._args = (owner, seconds)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Any = None

    def __repr__(self) -> str:
        return f"<PostgresKeepAlive owner={self._args[0]!r}>"

    def renew(self, timeout: float) -> bool:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            return self._loop.run_until_complete(self._renew(limit=timeout))
        except Exception as exc:
            # Whatever state the connection is in now (a statement cut by the timeout), it
            # is not reused: the next renewal connects afresh.
            self._drop()
            raise map_error(exc, "keeping a node lease alive") from exc

    async def _renew(self, *, limit: float) -> bool:
        # Each step is bounded by asyncpg's own timeouts (a connect cut by a cancellation
        # would leave an error nobody reads); the cancel scope only backs them up.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        with anyio.fail_after(limit + 1):
            if self._conn is not None and self._freshness.stale(self._conn):
                self._drop()  # made before a statement timed out: as silent, maybe
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._connect(limit)
            owner, seconds = self._args
            left = max(0.001, deadline - loop.time())
            args = self._statement.bind({"owner": owner, "ttl": seconds}, self._clock(), no_expiry)
            status = await self._conn.execute(self._statement.sql, *args, timeout=left)
        return bool(status != "UPDATE 0")

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.run_until_complete(close_quietly(self._conn))
        except Exception:  # noqa: BLE001 - closing: the server ends the session anyway
            self._drop()
        finally:
            self._conn = None
            loop.close()


class PostgresLeases(PostgresPart):
    """How lease jobs run on PostgreSQL (:class:`~watchkeeper.store.sql.leases.LeaseRunner`):
    on connections of their own, one per lane; and the keep-alive and the release listener."""

    dialect: Dialect = POSTGRES

    @property
    def prefix(self) -> str:
        return self._prefix

    def _channel(self, topic: str) -> str:
        return lease_channel(self.schema)

    async def write(
        self,
        job: Callable[[], Job[T]],
        *,
        what: str,
        lane: str = "writes",
        bound: float | None = None,
    ) -> T:
        """Run ``job()`` on the lease connection of ``lane``, one at a time; a lost or
        read-only connection is replaced and a fresh ``job()`` tried once more (it must be
        idempotent, as renewals, claims and releases are). Renewals have a lane of their own,
        so that they never wait for a claim of thousands of leases."""
        limit = None if bound is None else min(self.statement_timeout, bound)
        lanes: dict[str, dict[str, Any]] = self.__dict__.setdefault("_lease_conn", {})
        state = lanes.setdefault(lane, {})
        lock: anyio.Lock | None = state.get("lock")
        if lock is None:
            lock = state["lock"] = anyio.Lock()
        async with lock:
            for attempt in (1, 2, 3):
                if not self._open:
                    raise StoreClosedError(self)
                conn = state.get("conn")
                try:
                    stale = conn is not None and self._freshness.stale(conn)
                    if conn is None or conn.is_closed() or conn.is_in_transaction() or stale:
                        if conn is not None:
                            conn.terminate()  # never reused inside a transaction (see below)
                        conn = await connect(self._dsn, **self._connect_args())
                        state["conn"] = conn
                    return await run_job(
                        job(), conn, clock=self._clock_param(), channel=self._channel,
                        bound=limit,
                    )  # fmt: skip
                except StateStoreError:
                    raise
                except Exception as exc:
                    self._freshness.saw(exc)
                    if not self._open:
                        raise StoreClosedError(self) from exc
                    if getattr(exc, "sqlstate", None) in _RETRYABLE and attempt < 3:
                        continue  # rolled back: a deadlock or a serialization failure
                    if is_unavailable(exc) or is_connection_error(exc):
                        if conn is not None and not conn.is_closed():
                            conn.terminate()
                        state.pop("conn", None)
                        if attempt < 3:
                            continue
                    raise map_error(exc, what) from exc
                except BaseException:
                    # Cancelled half-way (a daemon's start-up renewals are): a BEGIN may have
                    # gone out without its ROLLBACK. Reused, the connection would run every
                    # later renewal inside that transaction, commit none, and the watchers'
                    # writes would be refused as if the node lease had lapsed. Dropped, the
                    # server rolls back.
                    if conn is not None:
                        conn.terminate()
                    state.pop("conn", None)
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def read(self, job: Callable[[], Job[T]], *, what: str) -> T:
        return await PostgresRunner(self).read(job, what=what)

    async def _close_lease_conn(self) -> None:
        for state in self.__dict__.get("_lease_conn", {}).values():
            await close_quietly(state.pop("conn", None))

    def open_node_keepalive(self, owner: str, ttl: timedelta | float) -> PostgresKeepAlive:
        """See :class:`~watchkeeper.store.protocols.NodeKeepAlive`: the renewal's ``UPDATE``
        alone (no join, no reaping), with this backend's session settings and clock."""
        owner, seconds = check_owner(owner), check_ttl(ttl).total_seconds()
        dsn, args = self._dsn, self._connect_args()
        args.pop("freshness")  # its connection belongs to the thread's own event loop

        async def connect(limit: float) -> Any:
            import asyncpg

            timeout = min(limit, CONNECT_TIMEOUT)
            return await asyncpg.connect(
                dsn, timeout=timeout, connection_class=connection_class(), **args
            )

        renew = LeaseStatements(POSTGRES, self._prefix).renew
        return PostgresKeepAlive(connect, renew, owner, seconds, self._clock_param, self._freshness)

    # -- wake-ups ------------------------------------------------------------------------------

    async def _await_lease_release(self) -> None:
        """Return once a daemon released leases or joined: a NOTIFY on a LISTEN connection of
        our own (opened on first use, closed with the backend). Also returns once as soon as
        a new connection listens, for what was released before. Without one (refused) it
        returns every 5 s: the daemon's renewals claim anyway."""
        state: dict[str, Any] = self.__dict__.setdefault("_lease_listen", {})
        conn = state.get("conn")
        if conn is None or conn.is_closed():
            try:
                conn = await connect(self._dsn, **self._connect_args())
                event = anyio.Event()
                state.update(conn=conn, event=event)

                def notified(*_: object) -> None:
                    state["event"].set()

                def lost(*_: object) -> None:
                    state["event"].set()  # the caller calls again, which reconnects

                conn.add_termination_listener(lost)
                await conn.add_listener(lease_channel(self.schema), notified)
            except Exception:  # noqa: BLE001 - no listener: the heartbeat claims anyway
                state.pop("conn", None)
                await anyio.sleep(5)
                return
            return  # listening from now on: what was released before is looked at now
        while True:
            with anyio.move_on_after(_LISTENER_CHECK):
                await state["event"].wait()
                state["event"] = anyio.Event()
                return
            # Quiet for a while: make sure the connection still answers (a network that
            # drops its bytes would leave it silent for ever); if not, it is dropped and the
            # caller's next call listens on a new one.
            try:
                await conn.execute("SELECT 1")
            except BaseException as exc:
                conn.terminate()
                state.pop("conn", None)
                if not isinstance(exc, Exception):
                    raise
                return  # the renewals claim anyway; this connection only wakes them

    async def _close_lease_listener(self) -> None:
        state: dict[str, Any] = self.__dict__.get("_lease_listen", {})
        await close_quietly(state.pop("conn", None))
