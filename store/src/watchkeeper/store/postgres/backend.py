"""``PostgresStateBackend``: task and asset state, assets, events and GC in PostgreSQL (asyncpg).

For several daemons on several machines sharing one database. Semantics are the memory
backend's, hook for hook. Reads go through an asyncpg pool; writes go through one group-commit
writer (:mod:`watchkeeper.store.postgres.writer`) that turns every batch of concurrent writes into one
transaction of a few set-based statements on a dedicated connection.

asyncpg is imported when the backend opens, so ``import watchkeeper.store`` works without the
``postgres`` extra. Connections, their bounds and the pool's release are
:mod:`watchkeeper.store.postgres.connections`'.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc

from .._backend import BaseStateBackend
from .._batch_sizes import BatchSizes
from .._builtin import builtin_services
from .._commit_queue import CommitStats
from .._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    EventBatchCommit,
    EventCommit,
    Put,
    RawEntry,
    StateScope,
    TaskScope,
    Writer,
)
from .._values import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_VALUE_BYTES
from ..errors import (
    AssetNotFoundError,
    BackendImportError,
    InvalidSettingError,
    StateStoreError,
    StoreClosedError,
    StoreUnavailableError,
)
from ..sql import SqlControls, SqlGc, SqlLeases, SqlLogs, SqlRuns, SqlStatus, SqlTaskSpecs, migrate
from .connections import (
    DEFAULT_STATEMENT_TIMEOUT,
    GC_TIMEOUT,
    MIGRATION_TIMEOUT,
    Freshness,
    check_timeout,
    close_quietly,
    connect,
    describe_dsn,
    discard,
    keep_session,
    pooled,
    session_settings,
    transaction,
)
from .consumers import events_lock, events_prelude
from .controls import PostgresControls
from .executor import PostgresRunner, run_job
from .leases import PostgresLeases
from .ops import CATALOG, LATE, CallOp, ClearOp, DeleteOp, EventsOp, PutOp
from .schema import POSTGRES_MIGRATIONS, check_schema_name, prelude, table_prefix
from .sql import (
    Statements,
    database_clock,
    is_connection_error,
    is_unavailable,
    map_error,
    raw_entry,
)
from .tasks import PostgresTasks
from .writer import GroupWriter

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresStateBackend"]

T = TypeVar("T")


class PostgresStateBackend(BaseStateBackend):
    """State in PostgreSQL: ``async with PostgresStateBackend("postgresql://...") as store:``.

    ``schema`` puts every table in that schema (created when missing); without it the tables
    go where the server's search path puts them. The pool holds ``min_size`` to ``max_size``
    connections for reads; the writer has one more of its own. ``statement_timeout`` bounds
    every statement (seconds; a schema migration's have a bound of their own): one that
    gets no answer by then raises :class:`StoreUnavailableError`, and its connection is
    terminated, so a network that silently drops a connection's bytes stalls nothing for
    longer.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        server_settings: Mapping[str, str] | None = None,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
    ) -> None:
        super().__init__(max_value_bytes=max_value_bytes, max_payload_bytes=max_payload_bytes)
        leases, controls = PostgresLeases(self), PostgresControls(self)
        pool = PostgresRunner(controls)
        self._leases, self._tasks, self._controls = leases, PostgresTasks(self), controls
        self.services = builtin_services(  # the leases' wait: a NOTIFY wakes other machines too
            self, events=self, feed=controls, runs=SqlRuns(pool, self._tasks), leases=SqlLeases(leases),
            tasks=SqlTaskSpecs(pool, events_lock=self._events_lock),
            gc=SqlGc(pool, bound=GC_TIMEOUT), status=SqlStatus(pool), controls=SqlControls(pool),
            keepalive=leases, logs=SqlLogs(pool),
            wait_for_release=leases._await_lease_release,
        )  # fmt: skip
        #: Session settings of its connections (``application_name``...); set until it opens.
        self.server_settings: dict[str, str] = dict(server_settings or {})
        if not isinstance(dsn, str) or not dsn:
            raise InvalidSettingError(
                "dsn", f"must be a non-empty postgresql:// URL, got {type(dsn).__name__}"
            )
        for name, value, low in (("min_size", min_size, 0), ("max_size", max_size, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidSettingError(name, f"must be an int >= {low}, got {value!r}")
        if min_size > max_size:
            raise InvalidSettingError(
                f"min_size ({min_size})", f"must not exceed max_size ({max_size})"
            )
        self.statement_timeout = check_timeout("statement_timeout", statement_timeout)
        self._freshness = Freshness()
        self.schema = check_schema_name(schema)
        self.min_size, self.max_size = min_size, max_size
        self._dsn = dsn
        self._sql = Statements(table_prefix(self.schema))
        self._sql.clock_param = self._clock_param
        self._pool: asyncpg.Pool | None = None
        self._writer: GroupWriter | None = None
        self._last_writer: GroupWriter | None = None  # its counters stay readable after closing

    # -- lifecycle ---------------------------------------------------------------------------

    def _events_lock(self) -> str:
        """The events lock of this store's schema (what reading past a task's or a consumer's
        cursor waits for: see :mod:`.tasks`)."""
        return events_lock(self.schema)

    def _where(self) -> str:
        """``host=… db=… schema=…`` from the DSN, never its password."""
        return describe_dsn(self._dsn, self.schema)

    def _session(self) -> dict[str, str] | None:
        return dict(self.server_settings) or None

    def _connect_args(self) -> dict[str, Any]:
        """The arguments of every connection this backend opens: its session settings and the
        bound of each statement."""
        return {
            "server_settings": self._session(),
            "command_timeout": self.statement_timeout,
            "freshness": self._freshness,
        }

    async def _migrate(self) -> list[int]:
        """Apply the pending migrations on a connection with their own, longer, bound."""
        session = self._session()
        conn = await connect(self._dsn, server_settings=session, command_timeout=MIGRATION_TIMEOUT)
        try:
            job = migrate(POSTGRES_MIGRATIONS, table_prefix(self.schema), prelude(self.schema))
            return await run_job(job, conn, clock=self._clock_param(), channel=str)
        finally:
            await close_quietly(conn)

    def configure_sessions(self, name: str, lease_seconds: float) -> None:
        session_settings(self.server_settings, name, lease_seconds)

    def _describe(self) -> str:
        pool = self._pool
        size = pool.get_size() if pool is not None else 0
        return f"{self._where()} pool={size}/{self.max_size}"

    async def _connect(self) -> tuple[asyncpg.Connection, asyncpg.Pool]:
        """The writer's connection (schema migrated) and the read pool."""
        try:
            import asyncpg
        except ImportError as exc:  # pragma: no cover - the extra is part of the dev group
            raise BackendImportError(
                "PostgresStateBackend", "needs asyncpg: install 'watchkeeper-store[postgres]'"
            ) from exc
        conn: asyncpg.Connection | None = None
        try:
            self.applied_migrations = await self._migrate()
            conn = await connect(self._dsn, **self._connect_args())
            pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self.min_size,
                max_size=self.max_size,
                reset=keep_session,
                connect=connect,
                **self._connect_args(),
            )
        except BaseException as exc:
            discard(conn, None)
            if isinstance(exc, Exception) and not isinstance(exc, StateStoreError):
                raise map_error(exc, f"opening {self._where()}") from exc
            raise
        return conn, pool

    async def _aopen(self, task_group: anyio.abc.TaskGroup) -> None:
        conn, pool = await self._connect()
        dsn, args = self._dsn, self._connect_args()

        async def reconnect() -> asyncpg.Connection:
            return await connect(dsn, **args)

        writer = GroupWriter(
            self,
            self._sql,
            reconnect,
            conn,
            events_sql=events_prelude(self.schema),
            freshness=self._freshness,
        )
        try:
            await task_group.start(writer.run)
        except BaseException:
            writer.discard()
            discard(conn, pool)
            raise
        self._pool, self._writer, self._last_writer = pool, writer, writer

    async def _aclose(self) -> None:
        writer, pool = self._writer, self._pool
        self._writer = None
        try:
            await self._controls._close_listener()
            await self._leases._close_lease_listener()
            await self._leases._close_lease_conn()
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
    def commit_stats(self) -> CommitStats:
        """How many batches the group-commit writer ran for how many writes since the backend
        opened (readable after closing)."""
        writer = self._last_writer
        return CommitStats(0, 0) if writer is None else writer.queue.stats

    @property
    def horizon_waits(self) -> int:
        """How many times a run step waited for an earlier event's writer still in flight."""
        return self._tasks.horizon_waits

    @property
    def commit_batch_sizes(self) -> BatchSizes | None:
        """The histogram of operations per committed batch (None before the first opening)."""
        writer = self._last_writer
        return None if writer is None else writer.queue.batch_sizes

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
        """Run a read on a pooled connection; a lost connection (or one whose statement timed
        out: it is terminated) is retried once on a new one."""
        for attempt in (1, 2):
            pool = self._pool_or_closed()
            try:
                async with pooled(pool, self._freshness) as conn:
                    rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
                    return rows
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
        that met the server unavailable (lost, read-only after a failover, or a statement
        that timed out) is dropped, so the pool replaces it instead of handing it out again,
        and ``fn`` is tried once more on another connection, as :meth:`_fetch` does. A
        cancelled ``fn`` drops its connection too.
        """
        for attempt in (1, 2):
            pool = self._pool_or_closed()
            try:
                async with pooled(pool, self._freshness) as conn, transaction(conn):
                    return await fn(conn)
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

    async def _aput(self, put: Put) -> int:
        version: int = await self._submit(PutOp(put, updated_at=self.clock()))
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
        self._pool_or_closed()
        try:
            return await self._migrate()
        except StateStoreError:
            raise
        except Exception as exc:
            raise map_error(exc, "migrating") from exc

    async def _aregister_assets(self, assets: list[Asset]) -> None:
        now, names, uris = self.clock(), [a.name for a in assets], [a.uri for a in assets]

        async def register(conn: asyncpg.Connection) -> None:
            await conn.execute(self._sql.register_assets, names, uris, now)

        await self._submit(CallOp(register, phase=CATALOG))

    async def _adeactivate_asset(self, name: str) -> bool:
        now = self.clock()

        async def deactivate(conn: asyncpg.Connection) -> bool:
            return await conn.fetchval(self._sql.deactivate_asset, name, now) is not None

        changed: bool = await self._submit(CallOp(deactivate, phase=CATALOG))
        return changed

    async def _alist_assets(self, active_only: bool) -> list[AssetInfo]:
        rows = await self._fetch("listing assets", self._sql.list_assets, active_only)
        return [AssetInfo(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    async def _acommit_event(self, commit: EventCommit) -> list[AssetEvent]:
        events: list[AssetEvent] = await self._submit(EventsOp.of(commit, self.clock()))
        return events

    async def _acommit_events(self, batch: EventBatchCommit) -> list[AssetEvent]:
        events: list[AssetEvent] = await self._submit(EventsOp.of(batch, self.clock()))
        return events

    async def _alist_events(
        self,
        asset: str | None,
        since_id: int,
        limit: int | None,
        before_id: int | None,
        newest_first: bool,
    ) -> list[AssetEvent]:
        sql = self._sql.list_events_desc if newest_first else self._sql.list_events
        rows = await self._fetch("listing events", sql, since_id, asset, limit, before_id)
        event = AssetEvent.from_json  # each payload decoded when it is read
        return [event(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def _clock_param(self) -> datetime | None:
        """The time to pass to lease statements: None (the database's ``now()``) unless the
        backend was given a clock of its own."""
        return database_clock(self.clock)
