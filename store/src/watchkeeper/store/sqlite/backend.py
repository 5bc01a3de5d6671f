"""``SqliteStateBackend``: the embedded default backend, one SQLite file in WAL mode.

How it is built, and why (the measurements behind these choices are in BENCHMARKS.md,
"SQLite backend design measurements"):

- **Writes** go through group commit (:mod:`watchkeeper.store.sqlite.writer` over the shared
  :mod:`watchkeeper.store._commit_queue`): one writer task drains a bounded anyio stream, each
  batch run as a single function call in a worker thread on a plain ``sqlite3`` connection
  (``BEGIN IMMEDIATE`` ... ``COMMIT``, savepoints only around multi-statement operations,
  plain upserts coalesced into multi-row statements). Not aiosqlite for writes: every
  statement there is its own hop to its thread and back, and coroutines sharing one
  aiosqlite connection share its open transaction. Batches are as large as the queue allows:
  smaller ones, to overlap the loop with the batch thread, lose to the GIL switch interval.
- **Reads** go through aiosqlite on a second, ``query_only`` connection: one hop per read
  (``execute_fetchall``), beside the writer thanks to WAL. A read issued after an awaited
  write returns sees that write (the write has committed).
- Durability: ``synchronous=FULL`` by default, so every awaited write has been fsynced when it
  returns; ``NORMAL`` is faster and may lose the last commits on a power cut.
- Asset scopes are resolved among active assets on every read (a join: no extra hop) and
  through the writer's cache on writes, emptied whenever ``assets`` may have changed
  (:class:`.writer.Tx`).
- Several processes (the daemon, task processes) may open the same file: ``busy_timeout``,
  ``BEGIN IMMEDIATE`` and a retry with backoff keep "database is locked" from surfacing; when
  the lock cannot be had in time the caller gets :class:`StoreUnavailableError`.
- A database file removed (or replaced) under a running backend is noticed before every
  commit and by :meth:`SqliteStateBackend.averify` (the daemon's heartbeat): SQLite itself would
  keep committing into the removed inode. From then on every call raises
  :class:`DatabaseFileRemovedError`.

Cancellation: a caller cancelled while its write is queued or running stops waiting, but the
write may still commit (a statement another thread runs cannot be taken back, and a half-applied
batch is never an option). Re-read after a cancelled write to learn which.
"""

from __future__ import annotations

import os
import sqlite3
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Final, TypeVar, cast

import aiosqlite
import anyio
import anyio.abc

from .._backend import BaseStateBackend
from .._batch_sizes import BatchSizes
from .._builtin import builtin_services
from .._commit_queue import CommitStats
from .._leases import check_owner, check_ttl
from .._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    EventBatchCommit,
    EventCommit,
    Put,
    RawEntry,
    StateScope,
    Writer,
)
from .._values import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_VALUE_BYTES
from ..errors import (
    ArgumentTypeError,
    BackendUnavailableError,
    DatabaseFileRemovedError,
    InvalidSettingError,
    StoreClosedError,
)
from ..sql import SqlControls, SqlGc, SqlLeases, SqlLogs, SqlRuns, SqlStatus, SqlTaskSpecs
from . import leases, meta, ops
from .controls import SqliteControls
from .events import COMMIT_BATCH, EVENT_COMMITS
from .executor import SqliteRunner
from .schema import Synchronous, connect, is_busy, migrate, unavailable
from .tasks import SqliteTasks
from .writer import GroupCommitWriter, Op, Tx

__all__ = ["CommitStats", "SqliteStateBackend"]

T = TypeVar("T")

_SYNCHRONOUS: Final = ("FULL", "NORMAL", "OFF")


def _nothing(tx: Tx) -> None:
    """The operation of :meth:`SqliteStateBackend.aping`: the transaction is the test."""


def _fresh(error: DatabaseFileRemovedError) -> DatabaseFileRemovedError:
    """A new instance per raise, so concurrent callers do not share one traceback."""
    return DatabaseFileRemovedError(error.path, error.reason)


class SqliteStateBackend(BaseStateBackend):
    """Task and asset state, asset events, trigger status and leases in one SQLite file.

    Open it with ``async with SqliteStateBackend(path) as backend:`` (or ``with`` for purely
    synchronous use). Opening creates the file if needed, switches it to WAL and applies the
    pending schema migrations (:attr:`applied_migrations` lists them).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 30.0,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(max_value_bytes=max_value_bytes, max_payload_bytes=max_payload_bytes)
        tasks, controls = SqliteTasks(self), SqliteControls(self)
        self.services = builtin_services(
            self, events=self, feed=controls, tasks=SqlTaskSpecs(SqliteRunner(self)), runs=SqlRuns(SqliteRunner(self), tasks),
            leases=SqlLeases(SqliteRunner(self)),
            controls=SqlControls(SqliteRunner(self)),
            status=SqlStatus(SqliteRunner(self)), gc=SqlGc(SqliteRunner(self)), keepalive=self,
            logs=SqlLogs(SqliteRunner(self)),
        )  # fmt: skip
        text = os.fspath(path)
        if not isinstance(text, str):
            raise ArgumentTypeError("path", path, "a str or os.PathLike[str]")
        if text in ("", ":memory:"):
            raise InvalidSettingError(
                "path",
                f"must name a file on disk, got {text!r} (the reader and the writer "
                "use separate connections, so an in-memory database cannot work)",
            )
        if synchronous not in _SYNCHRONOUS:
            raise InvalidSettingError(
                "synchronous", f"must be one of {_SYNCHRONOUS}, got {synchronous!r}"
            )
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float):
            raise ArgumentTypeError("busy_timeout", busy_timeout, "a number of seconds")
        if not busy_timeout >= 0:
            raise InvalidSettingError("busy_timeout", f"must be >= 0 seconds, got {busy_timeout!r}")
        self.path = text
        self.synchronous: Synchronous = synchronous
        self.busy_timeout = float(busy_timeout)
        self._writer: GroupCommitWriter | None = None
        self._wconn: sqlite3.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._file: tuple[str, int, int] | None = None  # absolute path, st_dev, st_ino
        self._removed: DatabaseFileRemovedError | None = None

    def _describe(self) -> str:
        return f"path={self.path}"

    def missing_database(self) -> str | None:
        return None if os.path.isfile(self.path) else self.path

    @property
    def commit_stats(self) -> CommitStats:
        """How many transactions (batches) the writer committed for how many writes."""
        writer = self._writer
        if writer is None:
            return CommitStats(0, 0)
        return writer.queue.stats

    @property
    def commit_batch_sizes(self) -> BatchSizes | None:
        """The histogram of operations per committed batch (None while closed)."""
        writer = self._writer
        return None if writer is None else writer.queue.batch_sizes

    def __del__(self) -> None:
        if getattr(self, "_wconn", None) is not None:
            warnings.warn(
                f"{self!r} was garbage-collected while open; use 'async with' or 'with'",
                ResourceWarning,
                stacklevel=1,
            )

    # -- lifecycle ---------------------------------------------------------------------------

    def _connect_writer(self) -> None:
        conn = connect(self.path, synchronous=self.synchronous, busy_timeout=self.busy_timeout)
        self._wconn = conn  # set here, in the thread: a cancelled opener still closes it
        self._removed = None
        where = os.path.abspath(self.path)
        opened = os.stat(where)
        self._file = (where, opened.st_dev, opened.st_ino)
        self.applied_migrations = migrate(conn, self.clock(), busy_timeout=self.busy_timeout)

    def _check_file(self) -> None:
        """Raise :class:`DatabaseFileRemovedError` unless the path still names the file the
        connections opened (same device and inode). Blocking: worker threads only.

        SQLite keeps writing into a removed file's inode without an error, so this is what
        stands between an ``rm -rf`` of the directory and commits that nobody can read back.
        Once it failed, it fails for good (the backend refuses everything, see ``_removed``).
        """
        if self._removed is not None:
            raise _fresh(self._removed)
        file = self._file
        if file is None:
            return
        where, device, inode = file
        try:
            now = os.stat(where)
        except (FileNotFoundError, NotADirectoryError):
            reason = "was removed"
        except OSError:
            return  # unreadable for another reason (permissions): not proof it is gone
        else:
            if (now.st_dev, now.st_ino) == (device, inode) or inode == 0:
                return
            reason = "was replaced by another file"
        self._removed = DatabaseFileRemovedError(where, reason)
        raise _fresh(self._removed)

    async def _aopen(self, task_group: anyio.abc.TaskGroup) -> None:
        self._writer = None
        try:
            await anyio.to_thread.run_sync(self._connect_writer)
            assert self._wconn is not None
            self._reader = await aiosqlite.connect(
                self.path, timeout=self.busy_timeout, isolation_level=None
            )
            await self._reader.execute_fetchall("PRAGMA query_only = ON")
            writer = GroupCommitWriter(
                self._wconn,
                self,
                lambda: self.clock(),
                busy_timeout=self.busy_timeout,
                check=self._check_file,
            )
            await task_group.start(writer.run)
            self._writer = writer
        except sqlite3.Error as exc:
            await self._close_connections()
            raise BackendUnavailableError(f"cannot open {self.path!r}: {exc}") from exc
        except BaseException:
            await self._close_connections()
            raise

    async def _aclose(self) -> None:
        writer = self._writer  # kept: commit_stats stays readable after closing
        try:
            if writer is not None:
                await writer.aclose()  # every queued write has committed or failed
        finally:
            await self._close_connections()

    async def _close_connections(self) -> None:
        with anyio.move_on_after(5, shield=True):
            reader, self._reader = self._reader, None
            wconn, self._wconn = self._wconn, None
            try:
                if reader is not None:
                    await reader.close()
            finally:
                if wconn is not None:
                    # The last connection to close checkpoints the WAL: file I/O, so a thread;
                    # the writer's, so never while a batch still runs on it.
                    writer = self._writer
                    if writer is None:
                        await anyio.to_thread.run_sync(wconn.close)
                    else:
                        try:
                            await writer.thread.call(wconn.close, abandon=False)
                        finally:
                            writer.thread.close()

    # -- plumbing ----------------------------------------------------------------------------

    async def _write(self, fn: Callable[[Tx], T], *, savepoint: bool = True) -> T:
        result: T = await self._live_writer().submit(fn, savepoint=savepoint)
        return result

    def _live_writer(self) -> GroupCommitWriter:
        """The writer, or the error a write gets now (closed, or the file removed)."""
        writer = self._writer
        if writer is None or not self._open:
            raise StoreClosedError(self)
        if self._removed is not None:
            raise _fresh(self._removed)
        return writer

    async def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        reader = self._reader
        if reader is None or not self._open:
            raise StoreClosedError(self)
        if self._removed is not None:
            raise _fresh(self._removed)
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.002
        while True:
            try:
                rows = await reader.execute_fetchall(sql, params)
                return cast("list[tuple[Any, ...]]", rows)  # plain tuples: no row_factory
            except sqlite3.Error as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise unavailable(exc, f"SQLite read failed: {exc}") from exc
            except ValueError as exc:  # aiosqlite: "Connection closed" while closing
                if self._reader is None:
                    raise StoreClosedError(self) from exc
                raise
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.25)

    # -- health ------------------------------------------------------------------------------

    async def aping(self) -> None:
        """An empty transaction through the writer: the write lock can be had in time, and
        the file is still the one opened."""
        self._check_open()
        await self._write(_nothing, savepoint=False)

    async def averify(self) -> None:
        """Raise :class:`DatabaseFileRemovedError` when the database's path no longer names the
        file this backend opened (removed, or replaced); ``os.stat`` runs in a worker thread.
        From then on every read and write of this backend raises it too."""
        self._check_open()
        await anyio.to_thread.run_sync(self._check_file)

    # -- key/value hooks ---------------------------------------------------------------------

    async def _aget(self, scope: StateScope, key: str) -> RawEntry | None:
        sql, params = ops.get_query(scope, key)
        rows = await self._read(sql, params)
        return ops.get_result(scope, rows)

    async def _alist(self, scope: StateScope) -> list[RawEntry]:
        sql, params = ops.list_query(scope)
        rows = await self._read(sql, params)
        return ops.list_result(scope, rows)

    async def _aput(self, put: Put) -> int:
        # One write statement (the checks before it write nothing): no savepoint. A plain
        # upsert may share a multi-row statement with its neighbours (coalesce).
        op = Op(
            ops.put,
            put,
            savepoint=False,
            coalesce=ops.upsert if put.expected_version is None else None,
        )
        self._live_writer().put(op)
        await op.done
        version: int = op.outcome()
        return version

    async def _adelete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        # The fence check before its one write statement writes nothing: no savepoint needed.
        return await self._write(lambda tx: ops.delete(tx, scope, key, writer), savepoint=False)

    async def _aclear(
        self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None
    ) -> int:
        return await self._write(
            lambda tx: ops.clear(tx, scope, all_map_indices, writer), savepoint=False
        )

    # -- metastore ---------------------------------------------------------------------------

    async def amigrate(self) -> list[int]:
        """Apply pending schema migrations (opening already did); return the versions applied."""
        self._check_open()
        return await self._write(meta.migrate_in)

    async def apragmas(self) -> dict[str, object]:
        """The settings in force on the writer's connection: journal mode, synchronous, ..."""
        self._check_open()
        return await self._write(meta.pragmas, savepoint=False)

    async def _aregister_assets(self, assets: list[Asset]) -> None:
        await self._write(lambda tx: meta.register_assets(tx, assets))

    async def _adeactivate_asset(self, name: str) -> bool:
        return await self._write(lambda tx: meta.deactivate_asset(tx, name), savepoint=False)

    async def _alist_assets(self, active_only: bool) -> list[AssetInfo]:
        sql, params = meta.assets_query(active_only)
        return meta.assets_result(await self._read(sql, params))

    async def _acommit_event(self, commit: EventCommit) -> list[AssetEvent]:
        # Neighbouring commits of a batch run together (EVENT_COMMITS), this one alone
        # if that fails.
        op = Op(meta.commit_event, commit, group=EVENT_COMMITS)
        self._live_writer().put(op)
        await op.done
        events: list[AssetEvent] = op.outcome()
        return events

    async def _acommit_events(self, batch: EventBatchCommit) -> list[AssetEvent]:
        # One operation of the event group; alone, the group's code on it, in a savepoint.
        op = Op(COMMIT_BATCH, batch, group=EVENT_COMMITS)
        self._live_writer().put(op)
        await op.done
        events: list[AssetEvent] = op.outcome()
        return events

    async def _alist_events(
        self,
        asset: str | None,
        since_id: int,
        limit: int | None,
        before_id: int | None,
        newest_first: bool,
    ) -> list[AssetEvent]:
        sql, params = meta.events_query(asset, since_id, limit, before_id, newest_first)
        return meta.events_result(await self._read(sql, params))

    def open_node_keepalive(self, owner: str, ttl: timedelta | float) -> leases.SqliteKeepAlive:
        """See :class:`~watchkeeper.store.protocols.NodeKeepAlive` (a connection of its own)."""
        return leases.SqliteKeepAlive(
            self.path, lambda: self.clock(), check_owner(owner), check_ttl(ttl)
        )
