"""``PostgresStateBackend``: task and asset state, assets, events and GC in PostgreSQL (asyncpg).

For several daemons on several machines sharing one database. Semantics are the memory
backend's, hook for hook. Reads go through an asyncpg pool; writes go through one group-commit
writer (:mod:`._postgres_writer`) that turns every batch of concurrent writes into one
transaction of a few set-based statements on a dedicated connection.

asyncpg is imported when the backend opens, so ``import watchkeeper.store`` works without the
``postgres`` extra.

The pool does not run asyncpg's reset query (``SELECT pg_advisory_unlock_all(); CLOSE ALL;
UNLISTEN *; RESET ALL``) when a connection is released: it costs a round trip per read, about a
third of the throughput. That is safe because this backend never leaves session state on a
pooled connection: it uses no ``SET``, no ``LISTEN``, no cursors outside a transaction and only
transaction-scoped advisory locks, and names tables by their schema instead of a search path.
asyncpg still rolls back a transaction left open and drops listeners on release.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc

from ._backend import BaseStateBackend
from ._daemons import check_daemon_status, check_owners, decode_refused, encode_refused
from ._gc import event_cutoffs
from ._leases import check_owner, check_trigger_ids, check_ttl
from ._postgres_consumers import PostgresConsumers, events_hook
from ._postgres_ops import CATALOG, LATE, CallOp, ClearOp, CommitOp, DeleteOp, PutOp
from ._postgres_schema import apply_migrations, check_schema_name, table_prefix
from ._postgres_sql import (
    Statements,
    is_connection_error,
    is_unavailable,
    map_error,
    raw_entry,
    rowcount,
)
from ._postgres_tasks import PostgresTasks
from ._postgres_writer import GroupWriter
from ._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    DaemonStatus,
    EventCommit,
    GcReport,
    Lease,
    RawEntry,
    StateScope,
    TaskScope,
    TriggerStatus,
    Writer,
)
from ._values import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    check_events_query,
    check_name,
    decode_value,
)
from .errors import AssetNotFoundError, StateStoreError, StoreClosedError, StoreUnavailableError

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresStateBackend"]

T = TypeVar("T")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset hook: nothing to undo (see the module docstring)."""


def _discard(conn: asyncpg.Connection | None, pool: asyncpg.Pool | None) -> None:
    """Drop what a failed open left behind (abruptly: this cleanup must neither hang nor raise)."""
    if pool is not None:
        pool.terminate()
    if conn is not None:
        conn.terminate()


class PostgresStateBackend(PostgresTasks, PostgresConsumers, BaseStateBackend):
    """State in PostgreSQL: ``async with PostgresStateBackend("postgresql://...") as store:``.

    ``schema`` puts every table in that schema (created when missing); without it the tables
    go where the server's search path puts them. The pool holds ``min_size`` to ``max_size``
    connections for reads; the writer has one more of its own.
    """

    supports_events = True

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(max_value_bytes=max_value_bytes, max_payload_bytes=max_payload_bytes)
        if not isinstance(dsn, str) or not dsn:
            raise ValueError(f"dsn must be a non-empty postgresql:// URL, got {type(dsn).__name__}")
        for name, value, low in (("min_size", min_size, 0), ("max_size", max_size, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if min_size > max_size:
            raise ValueError(f"min_size ({min_size}) must not exceed max_size ({max_size})")
        self.schema = check_schema_name(schema)
        self.min_size, self.max_size = min_size, max_size
        self._dsn = dsn
        self._sql = Statements(table_prefix(self.schema))
        self._pool: asyncpg.Pool | None = None
        self._writer: GroupWriter | None = None
        self._last_writer: GroupWriter | None = None  # its counters stay readable after closing

    # -- lifecycle ---------------------------------------------------------------------------

    def _where(self) -> str:
        """``host=… db=… schema=…`` from the DSN, never its password."""
        schema = self.schema or "(search_path)"
        try:
            url = urllib.parse.urlsplit(self._dsn)
            if url.scheme not in ("postgresql", "postgres"):
                return f"dsn=(not a postgresql:// URL) schema={schema}"
            query = urllib.parse.parse_qs(url.query)
            host = url.hostname or query.get("host", ["localhost"])[0]
            port = url.port or int(query.get("port", ["5432"])[0])
            db = url.path.lstrip("/") or query.get("dbname", ["(default)"])[0]
        except ValueError:
            return f"dsn=(unparsed) schema={schema}"
        return f"host={host}:{port} db={db} schema={schema}"

    def _describe(self) -> str:
        pool = self._pool
        size = pool.get_size() if pool is not None else 0
        return f"{self._where()} pool={size}/{self.max_size}"

    async def _connect(self) -> tuple[asyncpg.Connection, asyncpg.Pool]:
        """The writer's connection (schema migrated) and the read pool."""
        try:
            import asyncpg
        except ImportError as exc:  # pragma: no cover - the extra is part of the dev group
            raise ImportError(
                "PostgresStateBackend needs asyncpg: install 'watchkeeper-store[postgres]'"
            ) from exc
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(self._dsn)
            self.applied_migrations = await apply_migrations(conn, self.schema)
            pool = await asyncpg.create_pool(
                self._dsn, min_size=self.min_size, max_size=self.max_size, reset=_keep_session
            )
        except BaseException as exc:
            _discard(conn, None)
            if isinstance(exc, Exception) and not isinstance(exc, StateStoreError):
                raise map_error(exc, f"opening {self._where()}") from exc
            raise
        return conn, pool

    async def _aopen(self, task_group: anyio.abc.TaskGroup) -> None:
        conn, pool = await self._connect()
        dsn = self._dsn

        async def reconnect() -> asyncpg.Connection:
            import asyncpg

            return await asyncpg.connect(dsn)

        writer = GroupWriter(self, self._sql, reconnect, conn, on_events=events_hook(self.schema))
        try:
            await task_group.start(writer.run)
        except BaseException:
            writer.discard()
            _discard(conn, pool)
            raise
        self._pool, self._writer, self._last_writer = pool, writer, writer

    async def _aclose(self) -> None:
        writer, pool = self._writer, self._pool
        self._writer = None
        try:
            await self._close_listener()
            if writer is not None:
                await writer.aclose()
        finally:
            self._pool = None
            if pool is not None:
                closed = False
                try:
                    with anyio.move_on_after(5):
                        await pool.close()
                        closed = True
                finally:
                    if not closed:
                        pool.terminate()

    @property
    def write_batches(self) -> int:
        """How many transactions the group-commit writer has committed since the backend opened."""
        return self._last_writer.batches if self._last_writer is not None else 0

    def _pool_or_closed(self) -> asyncpg.Pool:
        if self._pool is None or not self._open:
            raise StoreClosedError(self)
        return self._pool

    async def _submit(self, op: Any) -> Any:
        writer = self._writer
        if writer is None or not self._open:
            raise StoreClosedError(self)
        return await writer.submit(op)

    async def _fetch(self, what: str, sql: str, *args: Any) -> list[asyncpg.Record]:
        """Run a read on a pooled connection; a lost connection is retried once on a new one."""
        for attempt in (1, 2):
            pool = self._pool_or_closed()
            try:
                return await pool.fetch(sql, *args)
            except Exception as exc:
                if not self._open:
                    raise StoreClosedError(self) from exc
                if attempt == 1 and is_connection_error(exc):
                    continue
                raise map_error(exc, what) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _transact(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``fn(conn)`` in its own transaction on a pooled connection (not the writer's).

        ``fn`` must be safe to run twice (claims and releases of leases are): a connection
        that met the server unavailable (lost, or read-only after a failover) is dropped, so
        the pool replaces it instead of handing it out again, and ``fn`` is tried once more
        on another connection, as :meth:`_fetch` does.
        """
        for attempt in (1, 2):
            pool = self._pool_or_closed()
            try:
                async with pool.acquire() as conn:
                    try:
                        async with conn.transaction():
                            return await fn(conn)
                    except Exception as exc:
                        if is_unavailable(exc) and not conn.is_closed():
                            conn.terminate()
                        raise
            except StateStoreError:
                raise
            except Exception as exc:
                if not self._open:
                    raise StoreClosedError(self) from exc
                if attempt == 1 and is_unavailable(exc):
                    continue
                raise map_error(exc, what) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def aping(self) -> None:
        """One transaction through the writer: the connection it commits on answers, and is
        not read-only (a standby, or a primary demoted by a failover)."""
        self._check_open()

        where = self._where()

        async def check_writable(conn: asyncpg.Connection) -> None:
            if await conn.fetchval("SHOW transaction_read_only") == "on":
                # Raised inside the batch: the writer drops this connection and tries a new one.
                raise StoreUnavailableError(
                    f"PostgreSQL is read-only at {where} (a standby, or a failover)"
                )

        await self._submit(CallOp(check_writable, phase=LATE))

    # -- key/value hooks ---------------------------------------------------------------------

    async def _aget(self, scope: StateScope, key: str) -> RawEntry | None:
        if isinstance(scope, TaskScope):
            s = scope
            rows = await self._fetch(
                "reading", self._sql.task_get, s.dag_id, s.run_id, s.task_id, s.map_index, key
            )
            return raw_entry(rows[0], task=True) if rows else None
        rows = await self._fetch(
            "reading", self._sql.asset_get, scope.asset_id, scope.name, scope.uri, key
        )
        if not rows or rows[0][0] is None:
            raise AssetNotFoundError(str(scope))
        return None if rows[0][1] is None else raw_entry(rows[0], 1, task=False)

    async def _alist(self, scope: StateScope) -> list[RawEntry]:
        if isinstance(scope, TaskScope):
            s = scope
            rows = await self._fetch(
                "listing", self._sql.task_list, s.dag_id, s.run_id, s.task_id, s.map_index
            )
            return [raw_entry(row, task=True) for row in rows]
        rows = await self._fetch(
            "listing", self._sql.asset_list, scope.asset_id, scope.name, scope.uri
        )
        if not rows or rows[0][0] is None:
            raise AssetNotFoundError(str(scope))
        return [raw_entry(row, 1, task=False) for row in rows if row[1] is not None]

    async def _aput(
        self,
        scope: StateScope,
        key: str,
        value_json: str,
        *,
        expires_at: datetime | None,
        never_expire: bool,
        expected_version: int | None,
        writer: Writer | None,
    ) -> int:
        op = PutOp(
            scope,
            key,
            value_json,
            updated_at=self.clock(),
            writer=writer,
            expires_at=expires_at,
            never_expire=never_expire,
            expected=expected_version,
        )
        version: int = await self._submit(op)
        return version

    async def _adelete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        existed: bool = await self._submit(DeleteOp(scope, key, writer, self.clock()))
        return existed

    async def _aclear(
        self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None
    ) -> int:
        count: int = await self._submit(ClearOp(scope, all_map_indices, writer, self.clock()))
        return count

    # -- metastore ---------------------------------------------------------------------------

    async def amigrate(self) -> list[int]:
        """Apply pending schema migrations; return the versions applied (opening does this)."""
        pool = self._pool_or_closed()
        try:
            async with pool.acquire() as conn:
                return await apply_migrations(conn, self.schema)
        except StateStoreError:
            raise
        except Exception as exc:
            raise map_error(exc, "migrating") from exc

    async def aregister_assets(self, assets: Sequence[Asset]) -> None:
        self._check_open()
        latest: dict[str, str | None] = {}
        for asset in assets:
            if not isinstance(asset, Asset):
                raise TypeError(f"assets must hold Asset objects, got {type(asset).__name__}")
            latest[asset.name] = asset.uri  # a name given twice: the last URI wins, as in memory
        if not latest:
            return
        now, names, uris = self.clock(), list(latest), list(latest.values())

        async def register(conn: asyncpg.Connection) -> None:
            await conn.execute(self._sql.register_assets, names, uris, now)

        await self._submit(CallOp(register, phase=CATALOG))

    async def adeactivate_asset(self, name: str) -> bool:
        self._check_open()
        check_name(name, what="asset name")
        now = self.clock()

        async def deactivate(conn: asyncpg.Connection) -> bool:
            return await conn.fetchval(self._sql.deactivate_asset, name, now) is not None

        changed: bool = await self._submit(CallOp(deactivate, phase=CATALOG))
        return changed

    async def alist_assets(self, *, active_only: bool = False) -> list[AssetInfo]:
        self._check_open()
        rows = await self._fetch("listing assets", self._sql.list_assets, active_only)
        return [AssetInfo(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    async def acommit_event(self, commit: EventCommit) -> list[AssetEvent]:
        self._check_open()
        if not isinstance(commit, EventCommit):
            raise TypeError(f"commit must be an EventCommit, got {type(commit).__name__}")
        events: list[AssetEvent] = await self._submit(CommitOp(commit, self.clock()))
        return events

    async def alist_events(
        self, *, asset: str | None = None, since_id: int = 0, limit: int | None = None
    ) -> list[AssetEvent]:
        self._check_open()
        check_events_query(asset, since_id, limit)
        rows = await self._fetch("listing events", self._sql.list_events, since_id, asset, limit)
        return [AssetEvent(r[0], r[1], r[2], decode_value(r[3]), r[4], r[5]) for r in rows]

    async def acollect_garbage(
        self,
        *,
        default_retention_days: int = 30,
        batch_size: int = 0,
        dry_run: bool = False,
        now: datetime | None = None,
        event_retention_days: int = 30,
        dedup_retention_days: int = 7,
    ) -> GcReport:
        self._check_open()
        if not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(
                f"batch_size must be an int >= 0 (0: one statement), got {batch_size!r}"
            )
        now = now or self.clock()
        events_due = event_cutoffs(now, event_retention_days, dedup_retention_days)
        event_args = () if events_due is None else (events_due.events, events_due.dedup)
        events = 0
        cutoff = now - timedelta(days=default_retention_days) if default_retention_days else None
        bounds: dict[str, tuple[Any, ...]] = {"expired": (now,), "orphaned": ()}
        if cutoff is not None:
            bounds["retention"] = (cutoff,)
        gc = self._sql.gc
        found: dict[str, list[tuple[Any, ...]]] = {kind: [] for kind in bounds}
        if dry_run:
            for kind, args in bounds.items():
                found[kind] = [tuple(r) for r in await self._fetch("GC", gc.select[kind], *args)]
            if event_args:
                (row,) = await self._fetch("GC", gc.events_count, *event_args)
                events = row[0]
        elif batch_size == 0:

            async def collect(conn: asyncpg.Connection) -> int:
                for kind, args in bounds.items():
                    found[kind] = [tuple(r) for r in await conn.fetch(gc.delete[kind], *args)]
                if not event_args:
                    return 0
                return rowcount(await conn.execute(gc.events_delete, *event_args))

            events = await self._submit(CallOp(collect, phase=LATE))
        else:
            for kind, args in bounds.items():
                while True:
                    sql, params = gc.delete_batch[kind], (*args, batch_size)

                    async def collect_batch(
                        conn: asyncpg.Connection, sql: str = sql, params: tuple[Any, ...] = params
                    ) -> list[tuple[Any, ...]]:
                        return [tuple(r) for r in await conn.fetch(sql, *params)]

                    rows: list[tuple[Any, ...]] = await self._submit(
                        CallOp(collect_batch, phase=LATE)
                    )
                    found[kind].extend(rows)
                    if len(rows) < batch_size:
                        break
            while event_args:

                async def delete_events(conn: asyncpg.Connection) -> int:
                    return rowcount(
                        await conn.execute(gc.events_delete_batch, *event_args, batch_size)
                    )

                deleted: int = await self._submit(CallOp(delete_events, phase=LATE))
                events += deleted
                if deleted < batch_size:
                    break
        report = GcReport(dry_run=dry_run, events=events)
        report.expired = [(TaskScope._from_row(*r[:4]), r[4]) for r in sorted(found["expired"])]
        report.retention = [
            (TaskScope._from_row(*r[:4]), r[4]) for r in sorted(found.get("retention", []))
        ]
        report.orphaned = [(r[0], r[1]) for r in sorted(found["orphaned"])]
        return report

    async def asave_trigger_status(self, statuses: Sequence[TriggerStatus]) -> None:
        self._check_open()
        rows: list[tuple[Any, ...]] = []
        for s in statuses:
            if not isinstance(s, TriggerStatus):
                raise TypeError(f"statuses must hold TriggerStatus objects, got {type(s).__name__}")
            rows.append(
                (s.trigger_id, s.classpath, list(s.assets), list(s.watchers), s.state, s.failures,
                 s.last_error, s.last_event_at, s.events, s.updated_at, s.owner)
            )  # fmt: skip
        if not rows:
            return

        async def save(conn: asyncpg.Connection) -> None:
            await conn.executemany(self._sql.save_status, rows)

        await self._submit(CallOp(save, phase=LATE))

    async def adelete_trigger_status(self, trigger_ids: Sequence[str]) -> None:
        self._check_open()
        ids = list(trigger_ids)
        if not all(isinstance(i, str) for i in ids):
            raise TypeError("trigger_ids must hold str trigger ids")
        if not ids:
            return

        async def delete(conn: asyncpg.Connection) -> int:
            return rowcount(await conn.execute(self._sql.delete_status, ids))

        await self._submit(CallOp(delete, phase=LATE))

    async def alist_trigger_status(self) -> list[TriggerStatus]:
        self._check_open()
        rows = await self._fetch("listing trigger status", self._sql.list_status)
        return [
            TriggerStatus(
                trigger_id=r[0], classpath=r[1], assets=tuple(r[2]), watchers=tuple(r[3]),
                state=r[4], failures=r[5], last_error=r[6], last_event_at=r[7], events=r[8],
                updated_at=r[9], owner=r[10],
            )
            for r in rows
        ]  # fmt: skip

    async def asave_daemon_status(self, status: DaemonStatus) -> None:
        self._check_open()
        s = check_daemon_status(status)
        row = (s.owner, s.started_at, s.heartbeat_at, float(s.lease_ttl), s.watchers_path,
               encode_refused(s.refused))  # fmt: skip

        async def save(conn: asyncpg.Connection) -> None:
            await conn.execute(self._sql.save_daemon, *row)

        await self._submit(CallOp(save, phase=LATE))

    async def adelete_daemon_status(self, owners: Sequence[str]) -> None:
        self._check_open()
        names = check_owners(owners)
        if not names:
            return

        async def delete(conn: asyncpg.Connection) -> int:
            return rowcount(await conn.execute(self._sql.delete_daemons, names))

        await self._submit(CallOp(delete, phase=LATE))

    async def alist_daemon_status(self) -> list[DaemonStatus]:
        self._check_open()
        rows = await self._fetch("listing daemon status", self._sql.list_daemons)
        return [
            DaemonStatus(
                owner=r[0], started_at=r[1], heartbeat_at=r[2], lease_ttl=r[3],
                watchers_path=r[4], refused=decode_refused(r[5]),
            )
            for r in rows
        ]  # fmt: skip

    # -- trigger leases ------------------------------------------------------------------------
    #
    # Claims and releases run in their own short transactions on a pooled connection, not in
    # the writer's batches: a batch holds the lease rows it fences on (FOR SHARE) until it
    # commits, and a claim that shared its transaction could deadlock with another daemon's.

    async def aclaim_leases(
        self, owner: str, trigger_ids: Sequence[str], ttl: timedelta | float
    ) -> dict[str, int]:
        self._check_open()
        owner, ids, span = check_owner(owner), check_trigger_ids(trigger_ids), check_ttl(ttl)
        if not ids:
            return {}
        now = self.clock()

        async def claim(conn: Any) -> dict[str, int]:
            await conn.execute(self._sql.lock_leases, ids)
            rows = await conn.fetch(self._sql.claim_leases, ids, owner, now + span, now)
            return {r[0]: r[1] for r in rows}

        return await self._transact("claiming leases", claim)

    async def arelease_leases(self, owner: str, trigger_ids: Sequence[str]) -> None:
        self._check_open()
        owner, ids = check_owner(owner), check_trigger_ids(trigger_ids)
        if not ids:
            return
        now = self.clock()

        async def release(conn: Any) -> None:
            await conn.execute(self._sql.lock_leases, ids)
            await conn.execute(self._sql.release_leases, ids, owner, now)

        await self._transact("releasing leases", release)

    async def alist_leases(self) -> list[Lease]:
        self._check_open()
        rows = await self._fetch("listing leases", self._sql.list_leases)
        return [Lease(r[0], r[1], r[2], r[3]) for r in rows]
