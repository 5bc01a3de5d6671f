"""Node leases and trigger leases on PostgreSQL (the rules are :mod:`watchkeeper.store._leases`').

Times are the database's clock (``now()``), so daemons on several machines need no agreement
of their clocks; a backend given a ``clock`` of its own (the tests) passes it instead.

- **Renewal** updates one row, ``WHERE owner = $1 AND alive``, in a statement that commits
  alone (the row's lock is never held while the daemon's loop is busy). **Reaping** another
  node is ``UPDATE ... SET alive = false WHERE expires_at <= now()``: both take the row's lock,
  so they serialise and each re-reads the row the other committed (READ COMMITTED): either
  the renewal wins and the reaper finds the row unexpired, or the reaping wins and the
  renewal finds it dead and starts the node afresh, freeing what it held.
- **Claims** lock the free trigger leases ``FOR UPDATE SKIP LOCKED``, in an order of their own
  (``md5(trigger_id || owner)``), so daemons claiming at once take different rows and none
  waits; a row a fenced commit holds ``FOR SHARE`` is skipped now and taken by a later claim,
  after that commit, so the new holder reads what the old one wrote.
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

Each runs in its own short transaction on a connection of its own (opened on first use,
closed with the backend), never in the writer's batches nor behind the read pool: with
thousands of watchers reading at once, a renewal queued for a pooled connection could wait
past the node lease's time to live.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import anyio

from .._leases import check_owner, check_ttl
from .._types import Lease, NodeHeartbeat, NodeLease
from ..errors import StateStoreError, StoreClosedError
from .connections import (
    CONNECT_TIMEOUT,
    Freshness,
    close_quietly,
    connect,
    connection_class,
    transaction,
)
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


class _Sql:
    """The statements, for one table prefix. ``$2`` is the clock: NULL for ``now()``."""

    def __init__(self, p: str) -> None:
        at = "coalesce($2::timestamptz, now())"
        self.renew = (
            f"UPDATE {p}trigger_nodes SET expires_at = {at} + $3 * interval '1 second' "
            "WHERE owner = $1 AND alive"
        )
        self.free_own = (
            f"UPDATE {p}trigger_leases SET owner = NULL, expires_at = {at} WHERE owner = $1"
        )
        self.join = (
            f"INSERT INTO {p}trigger_nodes (owner, alive, expires_at, joined_at) "
            f"VALUES ($1, true, {at} + $3 * interval '1 second', {at}) "
            "ON CONFLICT (owner) DO UPDATE SET alive = true, expires_at = EXCLUDED.expires_at, "
            "joined_at = EXCLUDED.joined_at"
        )
        self.reap = (
            f"UPDATE {p}trigger_nodes SET alive = false "
            f"WHERE alive AND owner <> $1 AND expires_at <= {at} RETURNING owner"
        )
        self.forget_dead = (
            f"DELETE FROM {p}trigger_nodes n WHERE NOT n.alive AND NOT EXISTS "
            f"(SELECT 1 FROM {p}trigger_leases l WHERE l.owner = n.owner)"
        )
        self.nodes = (
            "SELECT n.owner, n.alive, n.expires_at, "
            f"(SELECT count(*) FROM {p}trigger_leases l WHERE l.owner = n.owner), "
            f"coalesce($1::timestamptz, now()) FROM {p}trigger_nodes n ORDER BY n.owner"
        )
        # Free: released, or held by a node lease that is dead or gone. SKIP LOCKED passes
        # over rows another claim, a release or a fenced commit holds right now.
        self.take = f"""
            WITH free AS (
                SELECT l.trigger_id FROM {p}trigger_leases l
                WHERE l.trigger_id = ANY($2::text[]) AND (l.owner IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {p}trigger_nodes n WHERE n.owner = l.owner AND n.alive))
                ORDER BY md5(l.trigger_id || $1) LIMIT $3
                FOR UPDATE OF l SKIP LOCKED
            )
            UPDATE {p}trigger_leases l SET owner = $1, token = l.token + 1, expires_at = now()
            FROM free WHERE l.trigger_id = free.trigger_id
            RETURNING l.trigger_id
        """
        self.insert = f"""
            INSERT INTO {p}trigger_leases (trigger_id, owner, token, expires_at)
            SELECT t, $1, 1, now() FROM (
                SELECT t FROM unnest($2::text[]) AS t
                WHERE NOT EXISTS (SELECT 1 FROM {p}trigger_leases l WHERE l.trigger_id = t)
                ORDER BY md5(t || $1) LIMIT $3
            ) AS mine ORDER BY t
            ON CONFLICT (trigger_id) DO NOTHING
        """  # chosen in this daemon's spread order, inserted in one order for all: two
        # daemons inserting the same new rows wait for each other, never in a cycle
        self.held = (
            f"SELECT trigger_id, token FROM {p}trigger_leases "
            "WHERE trigger_id = ANY($2::text[]) AND owner = $1"
        )
        self.lock = (
            f"SELECT trigger_id FROM {p}trigger_leases "
            "WHERE trigger_id = ANY($1::text[]) AND owner = $2 ORDER BY trigger_id FOR UPDATE"
        )
        self.lock_all = (
            f"SELECT trigger_id FROM {p}trigger_leases "
            "WHERE owner = $1 ORDER BY trigger_id FOR UPDATE"
        )
        self.release = (
            f"UPDATE {p}trigger_leases SET owner = NULL, expires_at = now() "
            "WHERE trigger_id = ANY($1::text[]) AND owner = $2"
        )
        self.leave = f"DELETE FROM {p}trigger_nodes WHERE owner = $1"
        self.break_node = (
            f"UPDATE {p}trigger_nodes SET alive = false WHERE owner = $1 AND alive RETURNING owner"
        )
        self.list = (
            "SELECT l.trigger_id, l.owner, l.token, n.expires_at "
            f"FROM {p}trigger_leases l LEFT JOIN {p}trigger_nodes n "
            "ON n.owner = l.owner AND n.alive ORDER BY l.trigger_id"
        )


class PostgresKeepAlive:
    """A :class:`~watchkeeper.store.protocols.NodeKeepAliveChannel` on PostgreSQL: one
    connection, on an event loop private to the one thread that calls :meth:`renew` (asyncpg
    needs an asyncio loop; the daemon's own is the one that may be too busy)."""

    def __init__(
        self,
        connect: Callable[[float], Awaitable[Any]],
        statement: str,
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
            status = await self._conn.execute(
                self._statement, owner, self._clock(), seconds, timeout=left
            )
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
    """The leases driver of :class:`~watchkeeper.store.PostgresStateBackend`
    (:class:`~watchkeeper.store.protocols.LeasesDriver`) and its keep-alive."""

    @property
    def _lease_sql(self) -> _Sql:
        sql: _Sql | None = self.__dict__.get("_lease_sql_cache")
        if sql is None:
            sql = self.__dict__["_lease_sql_cache"] = _Sql(self._prefix)
        return sql

    async def _lease_transact(
        self,
        what: str,
        fn: Callable[[Any], Awaitable[T]],
        *,
        lane: str = "claims",
        in_transaction: bool = True,
    ) -> T:
        """Run ``fn(conn)`` in a transaction (unless ``in_transaction`` is False: then ``fn``
        opens its own) on the lease connection of ``lane``, one at a time; a lost or read-only
        connection is replaced and ``fn`` tried once more (it must be idempotent, as renewals,
        claims and releases are). Renewals have a lane of their own, so that they never wait
        for a claim of thousands of leases."""
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
                    if not in_transaction:
                        return await fn(conn)
                    async with transaction(conn):
                        return await fn(conn)
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

    async def _close_lease_conn(self) -> None:
        for state in self.__dict__.get("_lease_conn", {}).values():
            await close_quietly(state.pop("conn", None))

    async def _renew_in(self, conn: Any, owner: str, ttl: timedelta) -> NodeHeartbeat:
        sql, at, secs = self._lease_sql, self._clock_param(), ttl.total_seconds()
        # Each statement has half the lease's time to live at most (a second at least): one
        # that hangs (a dead network) fails in time for the next try, on a new connection, to
        # renew the lease.
        bound = min(self.statement_timeout, max(secs / 2, 1.0))
        # The renewal commits on its own: the node row's lock is not held while this daemon's
        # loop (busy, perhaps, for seconds) sends the rest, so neither its keep-alive thread
        # nor another daemon's reaping ever waits for it.
        renewed = (await conn.execute(sql.renew, owner, at, secs, timeout=bound)) != "UPDATE 0"
        async with transaction(conn):
            if not renewed:  # new, or reaped: whatever it held before is free
                await conn.execute(sql.free_own, owner, at, timeout=bound)
                await conn.execute(sql.join, owner, at, secs, timeout=bound)
                channel = lease_channel(self.schema)
                await conn.execute("SELECT pg_notify($1, $2)", channel, owner, timeout=bound)
            reaped = [r[0] for r in await conn.fetch(sql.reap, owner, at, timeout=bound)]
            await conn.execute(sql.forget_dead, timeout=bound)
            rows = await conn.fetch(sql.nodes, at, timeout=bound)
        now = rows[0][4] if rows else (at or datetime.now().astimezone())
        nodes = tuple(NodeLease(r[0], r[1], r[2], r[3]) for r in rows)
        return NodeHeartbeat(renewed, nodes, tuple(sorted(reaped)), now)

    async def _arenew_node(self, owner: str, ttl: timedelta) -> NodeHeartbeat:
        async def renew(conn: Any) -> NodeHeartbeat:
            return await self._renew_in(conn, owner, ttl)

        result: NodeHeartbeat = await self._lease_transact(
            "renewing a node lease", renew, lane="renewals", in_transaction=False
        )
        return result

    async def _aclaim_leases(
        self, owner: str, ids: builtins.list[str], ttl: timedelta, limit: int | None
    ) -> dict[str, int]:
        sql = self._lease_sql

        # The node lease is renewed in a transaction of its own first: a claim of thousands
        # of rows must not hold the node row (a reaper would wait for it, and find it expired).
        await self._arenew_node(owner, ttl)

        async def claim(conn: Any) -> dict[str, int]:
            if ids and limit != 0:
                taken = len(await conn.fetch(sql.take, owner, ids, limit))
                if limit is None or taken < limit:
                    rest = None if limit is None else limit - taken
                    await conn.execute(sql.insert, owner, ids, rest)
            return {r[0]: r[1] for r in await conn.fetch(sql.held, owner, ids)}

        result: dict[str, int] = await self._lease_transact("claiming leases", claim)
        return result

    async def _arelease_leases(self, owner: str, ids: builtins.list[str], leave: bool) -> None:
        sql = self._lease_sql

        async def release(conn: Any) -> None:
            # Locked in trigger_id order, as the writer's fence check locks them: no deadlock.
            if leave:
                gone = [r[0] for r in await conn.fetch(sql.lock_all, owner)]
                await conn.execute(sql.release, gone, owner)
                await conn.execute(sql.leave, owner)
            else:
                await conn.fetch(sql.lock, ids, owner)
                await conn.execute(sql.release, ids, owner)
            await conn.execute("SELECT pg_notify($1, $2)", lease_channel(self.schema), owner)

        await self._lease_transact("releasing leases", release)

    async def _abreak_node(self, owner: str) -> bool:
        async def brk(conn: Any) -> bool:
            return bool(await conn.fetch(self._lease_sql.break_node, owner))

        result: bool = await self._lease_transact("reaping a node lease", brk)
        return result

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

        return PostgresKeepAlive(
            connect, self._lease_sql.renew, owner, seconds, self._clock_param, self._freshness
        )

    async def _alist_leases(self) -> builtins.list[Lease]:
        rows = await self._fetch("listing leases", self._lease_sql.list)
        return [Lease(r[0], r[1], r[2], r[3]) for r in rows]

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
