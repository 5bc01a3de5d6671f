"""SQLite-specific behaviour of ``SqliteStateBackend``; the shared semantics are in test_contract*.

Everything runs against real files under ``tmp_path``; the multi-writer tests use a real worker
thread with its own ``with SqliteStateBackend(path)`` and a real second process.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import (
    NEVER_EXPIRE,
    Asset,
    AssetNotFoundError,
    AssetScope,
    BackendUnavailableError,
    LeaseLostError,
    SqliteStateBackend,
    StateStoreError,
    StoreClosedError,
    TaskScope,
    VersionConflictError,
)
from watchkeeper.store.protocols import EventBatchCommit, EventCommit, Fence, TriggerStatus, Writer
from watchkeeper.store.sqlite.schema import SQLITE_MIGRATIONS

VERSIONS = sorted(step[0] for step in SQLITE_MIGRATIONS.steps)
"""Every migration's version, as a new file records them."""
TASK = TaskScope("dag", "run_1", "task")
ORDERS = Asset("orders", uri="s3://data/orders")
INVOICES = Asset("invoices")
ORDERS_SCOPE = AssetScope(name="orders")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def store(sqlite_path: Path) -> AsyncIterator[SqliteStateBackend]:
    """An open backend on a fresh file with ``orders`` and ``invoices`` registered."""
    async with SqliteStateBackend(sqlite_path) as backend:
        await backend.events.aregister_assets([ORDERS, INVOICES])
        yield backend


def raw_rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    """Rows read with a plain sqlite3 connection, beside the backend."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def commit(*assets: str, dedup_key: str | None = None, **state: str) -> EventCommit:
    return EventCommit("orders_watch", assets, '{"n":1}', dedup_key=dedup_key, state=state)


async def increment(backend: SqliteStateBackend, scope: TaskScope, key: str) -> None:
    """Add one to a counter with compare-and-set, retrying on conflict."""
    while True:
        entry = await backend.aget_entry(scope, key)
        value, version = (0, 0) if entry is None else (entry.value, entry.version)
        try:
            await backend.aset(scope, key, value + 1, expected_version=version)
            return
        except VersionConflictError:
            continue


class TestMigrations:
    async def test_a_new_file_records_every_migration(self, sqlite_path: Path) -> None:
        """Opening a new file applies every migration in order and records each one."""
        async with SqliteStateBackend(sqlite_path) as backend:
            assert backend.applied_migrations == VERSIONS
        rows = raw_rows(sqlite_path, "SELECT version, name FROM schema_migrations ORDER BY 1")
        assert [row[0] for row in rows] == VERSIONS
        assert all(row[1] for row in rows)

    async def test_reopening_applies_nothing(self, sqlite_path: Path) -> None:
        """A second opening and amigrate() find nothing to apply."""
        async with SqliteStateBackend(sqlite_path):
            pass
        async with SqliteStateBackend(sqlite_path) as backend:
            assert backend.applied_migrations == []
            assert await backend.amigrate() == []
        assert len(raw_rows(sqlite_path, "SELECT * FROM schema_migrations")) == len(VERSIONS)

    async def test_two_backends_opening_a_new_file_at_once(self, sqlite_path: Path) -> None:
        """Two openings racing on a new file apply each migration exactly once between them."""
        applied: list[list[int]] = []

        async def open_one() -> None:
            async with SqliteStateBackend(sqlite_path) as backend:
                applied.append(backend.applied_migrations)

        async with anyio.create_task_group() as tg:
            tg.start_soon(open_one)
            tg.start_soon(open_one)
        assert sorted(applied) == [[], VERSIONS]
        assert len(raw_rows(sqlite_path, "SELECT * FROM schema_migrations")) == len(VERSIONS)

    async def test_a_version_4_file_gets_the_event_retention_index(self, sqlite_path: Path) -> None:
        """A file from before event retention (version 4) is upgraded by migration 5 alone,
        its events kept, and the GC's scan of old events then uses the new index."""
        async with SqliteStateBackend(sqlite_path) as backend:
            await backend.events.aregister_assets([ORDERS])
            await backend.events.acommit(commit("orders", dedup_key="m1"))
        conn = sqlite3.connect(sqlite_path)
        conn.execute("DROP INDEX asset_events_created")
        conn.execute("DELETE FROM schema_migrations WHERE version = 5")
        conn.commit()
        conn.close()
        async with SqliteStateBackend(sqlite_path) as backend:
            assert backend.applied_migrations == [5]
            assert [e.dedup_key for e in await backend.events.alist_events()] == ["m1"]
        plan = raw_rows(
            sqlite_path,
            "EXPLAIN QUERY PLAN DELETE FROM asset_events "
            "WHERE created_at < '' AND (dedup_key IS NULL OR created_at < '')",
        )
        assert "USING INDEX asset_events_created" in str(plan)

    async def test_a_newer_schema_is_refused(self, sqlite_path: Path) -> None:
        """A file migrated by a newer watchkeeper fails to open with a clear error."""
        async with SqliteStateBackend(sqlite_path):
            pass
        conn = sqlite3.connect(sqlite_path)
        conn.execute("INSERT INTO schema_migrations VALUES (99, 'future', '2030')")
        conn.commit()
        conn.close()
        with pytest.raises(BackendUnavailableError, match="schema version 99"):
            async with SqliteStateBackend(sqlite_path):
                pass


class TestSettings:
    async def test_wal_and_synchronous_full_are_in_effect(
        self, store: SqliteStateBackend, sqlite_path: Path
    ) -> None:
        """The writer's connection runs WAL with synchronous=FULL and the busy timeout."""
        pragmas = await store.apragmas()
        assert pragmas["journal_mode"] == "wal"
        assert pragmas["synchronous"] == "FULL"
        assert pragmas["busy_timeout"] == 30.0
        assert raw_rows(sqlite_path, "PRAGMA journal_mode") == [("wal",)]

    async def test_synchronous_and_busy_timeout_are_configurable(self, sqlite_path: Path) -> None:
        """synchronous and busy_timeout given to the constructor reach the connection."""
        async with SqliteStateBackend(
            sqlite_path, synchronous="NORMAL", busy_timeout=2.5
        ) as backend:
            pragmas = await backend.apragmas()
        assert (pragmas["synchronous"], pragmas["busy_timeout"]) == ("NORMAL", 2.5)

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"synchronous": "EXTRA"}, ValueError, "synchronous must be one of"),
            ({"busy_timeout": -1}, ValueError, "busy_timeout must be >= 0"),
            ({"busy_timeout": "5"}, TypeError, "busy_timeout must be a number"),
            ({"max_value_bytes": 0}, ValueError, "max_value_bytes must be positive"),
        ],
    )
    def test_bad_arguments_are_refused(
        self, sqlite_path: Path, kwargs: dict[str, object], error: type[Exception], match: str
    ) -> None:
        """A bad constructor argument raises an error naming it."""
        with pytest.raises(error, match=match):
            SqliteStateBackend(sqlite_path, **kwargs)  # type: ignore[arg-type]

    def test_an_in_memory_database_is_refused(self) -> None:
        """':memory:' is refused: the reader and the writer need one shared file."""
        with pytest.raises(ValueError, match="must name a file"):
            SqliteStateBackend(":memory:")


class TestLifecycle:
    async def test_repr_shows_path_and_state(self, sqlite_path: Path) -> None:
        """repr() names the path and whether the backend is open."""
        backend = SqliteStateBackend(sqlite_path)
        assert repr(backend) == f"<SqliteStateBackend path={sqlite_path} open=False>"
        async with backend:
            assert repr(backend) == f"<SqliteStateBackend path={sqlite_path} open=True>"
        assert repr(SqliteStateBackend("state.db")) == (
            "<SqliteStateBackend path=state.db open=False>"
        )

    async def test_closed_backend_raises_store_closed(self, sqlite_path: Path) -> None:
        """Every call on a closed (or never opened) backend raises StoreClosedError."""
        backend = SqliteStateBackend(sqlite_path)
        with pytest.raises(StoreClosedError):
            await backend.aget(TASK, "k")
        async with backend:
            await backend.aset(TASK, "k", 1)
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: backend.aget(TASK, "k"),
            lambda: backend.aset(TASK, "k", 2),
            lambda: backend.events.acommit(commit("orders")),
            lambda: backend.events.alist_events(),
            lambda: backend.events.aregister_assets([ORDERS]),
            lambda: backend.gc.acollect_garbage(),
        ]
        for call in calls:
            with pytest.raises(StoreClosedError):
                await call()

    async def test_data_survives_close_and_reopen(self, sqlite_path: Path) -> None:
        """State, assets, events and trigger status are all there after reopening."""
        status = TriggerStatus("t1", "pkg.Trigger", ("orders",), ("w",), "running", events=3)
        async with SqliteStateBackend(sqlite_path) as backend:
            await backend.events.aregister_assets([ORDERS])
            await backend.aset(TASK, "k", {"a": [1, 2]}, writer=Writer("task", "t", 2))
            await backend.aset(ORDERS_SCOPE, "wm", 41)
            await backend.events.acommit(commit("orders", dedup_key="m1", wm="42"))
            await backend.status.asave_trigger_status([status])
        async with SqliteStateBackend(sqlite_path) as backend:
            entry = await backend.aget_entry(TASK, "k")
            assert entry is not None
            assert (entry.value, entry.writer) == ({"a": [1, 2]}, Writer("task", "t", 2))
            assert await backend.aget(ORDERS_SCOPE, "wm") == 42
            assert [e.dedup_key for e in await backend.events.alist_events()] == ["m1"]
            assert [a.name for a in await backend.events.alist_assets()] == ["orders"]
            assert await backend.status.alist_trigger_status() == [status]

    async def test_close_flushes_queued_writes(self, sqlite_path: Path) -> None:
        """Writes still queued when the backend closes are committed before it closes."""
        async with anyio.create_task_group() as tg, SqliteStateBackend(sqlite_path) as backend:
            for i in range(200):
                tg.start_soon(backend.aset, TASK, f"k{i}", i)
            await anyio.wait_all_tasks_blocked()
        assert raw_rows(sqlite_path, "SELECT count(*) FROM task_state") == [(200,)]

    async def test_timestamps_are_stored_in_utc_from_the_clock(
        self, store: SqliteStateBackend
    ) -> None:
        """Rows carry the backend clock's time, stored as UTC text."""
        store.clock = lambda: datetime(2026, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
        await store.aset(TASK, "k", 1)
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None
        assert entry.updated_at == datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
        assert raw_rows(Path(store.path), "SELECT updated_at FROM task_state") == [
            ("2026-03-01T10:00:00.000000+00:00",)
        ]

    def test_sync_mode_works(self, sqlite_path: Path) -> None:
        """'with' opens the backend on a private loop thread for plain synchronous use."""
        with SqliteStateBackend(sqlite_path) as backend:
            assert backend.set(TASK, "k", 1) == 1
            assert backend.set(TASK, "k", 2) == 2
            assert backend.get(TASK, "k") == 2
        assert not backend.is_open


class TestGroupCommit:
    async def test_1000_concurrent_writes_land_with_correct_versions(
        self, store: SqliteStateBackend
    ) -> None:
        """1000 concurrent asets on 100 keys all land; each key reaches version 10."""
        versions: dict[str, list[int]] = {f"k{i}": [] for i in range(100)}
        before = store.commit_stats

        async def write(key: str, value: int) -> None:
            versions[key].append(await store.aset(TASK, key, value))

        async with anyio.create_task_group() as tg:
            for n in range(1000):
                tg.start_soon(write, f"k{n % 100}", n)
        assert all(sorted(v) == list(range(1, 11)) for v in versions.values())
        entries = await store.alist(TASK)
        assert len(entries) == 100
        assert {e.version for e in entries} == {10}
        after = store.commit_stats
        assert after.writes - before.writes == 1000
        assert after.batches - before.batches < 100  # the writes shared transactions

    async def test_a_failing_write_does_not_affect_its_batch(
        self, store: SqliteStateBackend
    ) -> None:
        """In one shared batch a failing compare-and-set and a failing event commit roll back
        alone: the other writes commit and only the failing callers get the errors."""
        await store.aset(TASK, "cas", "v1")
        start = anyio.Event()
        outcomes: dict[str, object] = {}

        async def run(name: str, call: Callable[[], Awaitable[object]]) -> None:
            await start.wait()
            try:
                outcomes[name] = await call()
            except Exception as exc:  # noqa: BLE001 - the outcome under test
                outcomes[name] = exc

        before = store.commit_stats
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(run, f"set{i}", lambda i=i: store.aset(TASK, f"k{i}", i))
            tg.start_soon(run, "stale", lambda: store.aset(TASK, "cas", "x", expected_version=5))
            tg.start_soon(run, "ghost", lambda: store.events.acommit(commit("orders", "ghost")))
            tg.start_soon(run, "event", lambda: store.events.acommit(commit("invoices")))
            tg.start_soon(run, "fresh", lambda: store.aset(TASK, "cas", "v2", expected_version=1))
            await anyio.wait_all_tasks_blocked()
            start.set()
        assert store.commit_stats.batches - before.batches == 1  # they did share one batch
        stale = outcomes.pop("stale")
        assert isinstance(stale, VersionConflictError)
        assert (stale.expected, stale.actual) == (5, 1)  # it ran before "fresh"
        assert isinstance(outcomes.pop("ghost"), AssetNotFoundError)
        assert outcomes.pop("fresh") == 2
        assert len(outcomes.pop("event")) == 1  # type: ignore[arg-type]
        assert outcomes == {f"set{i}": 1 for i in range(20)}
        assert await store.aget(TASK, "cas") == "v2"
        assert [e.asset for e in await store.events.alist_events()] == ["invoices"]

    async def test_writes_in_one_batch_apply_in_call_order(self, store: SqliteStateBackend) -> None:
        """Plain writes and compare-and-sets of one key released together apply in the order
        they were made: versions 1..5 and the last value wins."""
        start = anyio.Event()
        versions: list[int] = []

        async def write(value: str, expected: int | None) -> None:
            await start.wait()
            versions.append(await store.aset(TASK, "k", value, expected_version=expected))

        before = store.commit_stats
        async with anyio.create_task_group() as tg:
            for value, expected in [("a", None), ("b", 1), ("c", None), ("d", None), ("e", 4)]:
                tg.start_soon(write, value, expected)
            await anyio.wait_all_tasks_blocked()
            start.set()
        assert store.commit_stats.batches - before.batches == 1
        assert versions == [1, 2, 3, 4, 5]
        assert await store.aget(TASK, "k") == "e"

    async def test_a_constraint_failure_fails_only_its_write(
        self, store: SqliteStateBackend, sqlite_path: Path
    ) -> None:
        """A write refused by the database (here a trigger raising on one key) fails alone,
        with a store error chained from the driver's; its batch-mates commit."""
        conn = sqlite3.connect(sqlite_path)
        for table in ("task_state", "asset_state"):
            conn.execute(
                f"CREATE TRIGGER poison_{table} BEFORE INSERT ON {table} "
                "WHEN NEW.key = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned key'); END"
            )
        conn.close()
        start = anyio.Event()
        outcomes: dict[str, object] = {}

        async def run(name: str, call: Callable[[], Awaitable[object]]) -> None:
            await start.wait()
            try:
                outcomes[name] = await call()
            except StateStoreError as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:
            # First, so it shares a multi-row statement with k0..k2 that has to be re-run.
            tg.start_soon(run, "poison", lambda: store.aset(TASK, "poison", 1))
            for i in range(10):
                tg.start_soon(run, f"k{i}", lambda i=i: store.aset(TASK, f"k{i}", i))
            tg.start_soon(
                run, "event", lambda: store.events.acommit(commit("orders", poison="1", wm="2"))
            )
            await anyio.wait_all_tasks_blocked()
            start.set()
        for name in ("poison", "event"):
            error = outcomes.pop(name)
            assert isinstance(error, StateStoreError), error
            assert "poisoned key" in str(error)
            assert isinstance(error.__cause__, sqlite3.Error)
        assert outcomes == {f"k{i}": 1 for i in range(10)}
        assert await store.events.alist_events() == []  # the event went with its state
        assert await store.aget(ORDERS_SCOPE, "wm") is None

    async def test_cancelled_callers_do_not_break_the_writer(
        self, store: SqliteStateBackend, sqlite_path: Path
    ) -> None:
        """Callers cancelled while their writes wait (the writer is held up by another
        connection's lock) leave the writer working, and their queued writes still commit."""
        holder = sqlite3.connect(sqlite_path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the writer's next batch has to wait
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    for i in range(300):
                        tg.start_soon(store.aset, TASK, f"k{i}", i)
                    await anyio.wait_all_tasks_blocked()
                    scope.cancel()
            assert scope.cancelled_caught
            holder.execute("COMMIT")
        finally:
            holder.close()
        assert await store.aset(TASK, "after", 1) == 1  # queued behind the cancelled ones
        assert len(await store.alist(TASK)) == 301

    async def test_reads_see_awaited_writes(self, store: SqliteStateBackend) -> None:
        """A read issued after an awaited write (on the other connection) sees it."""
        for i in range(50):
            await store.aset(ORDERS_SCOPE, "wm", i)
            assert await store.aget(ORDERS_SCOPE, "wm") == i


class TestSeveralWriters:
    async def test_sync_thread_and_coroutines_share_the_file(self, sqlite_path: Path) -> None:
        """A worker thread with its own sync backend and coroutines on an async one increment
        the same counter at once: no write is lost and no error surfaces."""
        rounds = 100

        def sync_side() -> None:
            with SqliteStateBackend(sqlite_path) as other:
                for _ in range(rounds):
                    while True:
                        entry = other.get_entry(TASK, "n")
                        value, version = (0, 0) if entry is None else (entry.value, entry.version)
                        try:
                            other.set(TASK, "n", value + 1, expected_version=version)
                            break
                        except VersionConflictError:
                            continue
                    other.set(TASK, f"sync{value}", value)

        async with SqliteStateBackend(sqlite_path) as backend:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(anyio.to_thread.run_sync, sync_side)
                    for _ in range(4):
                        tg.start_soon(self._bump, backend, rounds // 4)
            assert await backend.aget(TASK, "n") == 2 * rounds
            keys = [e.key for e in await backend.alist(TASK)]
            assert len([k for k in keys if k.startswith("sync")]) == rounds

    @staticmethod
    async def _bump(backend: SqliteStateBackend, times: int) -> None:
        for _ in range(times):
            await increment(backend, TASK, "n")

    async def test_a_second_process_writes_the_same_file(self, sqlite_path: Path) -> None:
        """A second process using the sync API and this one increment one counter at once;
        both finish without error and every increment is counted."""
        rounds = 150
        script = textwrap.dedent(
            f"""
            import sys
            from watchkeeper.store import SqliteStateBackend, TaskScope, VersionConflictError
            scope = TaskScope("dag", "run_1", "task")
            with SqliteStateBackend({str(sqlite_path)!r}) as backend:
                print("ready", flush=True)
                sys.stdin.readline()
                for _ in range({rounds}):
                    while True:
                        entry = backend.get_entry(scope, "n")
                        value, version = (0, 0) if entry is None else (entry.value, entry.version)
                        try:
                            backend.set(scope, "n", value + 1, expected_version=version)
                            break
                        except VersionConflictError:
                            continue
            print("done", flush=True)
            """
        )
        async with SqliteStateBackend(sqlite_path) as backend:
            process = await anyio.open_process(
                [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            async with process:
                assert process.stdin is not None and process.stdout is not None
                with anyio.fail_after(60):
                    assert (await process.stdout.receive()).startswith(b"ready")
                    await process.stdin.send(b"go\n")
                    await self._bump(backend, rounds)
                    assert await process.wait() == 0
            assert await backend.aget(TASK, "n") == 2 * rounds

    async def test_deactivation_elsewhere_is_seen_at_once(self, sqlite_path: Path) -> None:
        """An asset deactivated through another connection is refused by the next write here,
        even though this backend had just resolved (and cached) it."""
        async with (
            SqliteStateBackend(sqlite_path) as first,
            SqliteStateBackend(sqlite_path) as second,
        ):
            await first.events.aregister_assets([ORDERS])
            await first.aset(ORDERS_SCOPE, "wm", 1)
            assert await second.events.adeactivate_asset("orders")
            with pytest.raises(AssetNotFoundError):
                await first.aset(ORDERS_SCOPE, "wm", 2)
            with pytest.raises(AssetNotFoundError):
                await first.aget(ORDERS_SCOPE, "wm")
            await second.events.aregister_assets([ORDERS])
            assert await first.aset(ORDERS_SCOPE, "wm", 3) == 2

    async def test_a_lock_held_too_long_is_backend_unavailable(self, sqlite_path: Path) -> None:
        """A write lock held past busy_timeout gives BackendUnavailableError chained from the
        sqlite3 error, never a raw "database is locked"; once released, writes go through."""
        async with SqliteStateBackend(sqlite_path, busy_timeout=0.2) as backend:
            holder = sqlite3.connect(sqlite_path, isolation_level=None)
            try:
                holder.execute("BEGIN IMMEDIATE")
                with pytest.raises(BackendUnavailableError) as info:
                    await backend.aset(TASK, "k", 1)
                assert isinstance(info.value.__cause__, sqlite3.OperationalError)
                assert "locked" in str(info.value)
                holder.execute("ROLLBACK")
            finally:
                holder.close()
            assert await backend.aset(TASK, "k", 1) == 1

    async def test_a_briefly_held_lock_is_waited_out(self, sqlite_path: Path) -> None:
        """A write that meets another connection's lock waits for it instead of failing."""
        async with SqliteStateBackend(sqlite_path) as backend:
            holder = sqlite3.connect(sqlite_path, isolation_level=None)
            try:
                holder.execute("BEGIN IMMEDIATE")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(backend.aset, TASK, "k", 1)
                    await anyio.wait_all_tasks_blocked()
                    holder.execute("COMMIT")
            finally:
                holder.close()
            assert await backend.aget(TASK, "k") == 1


class TestEventsAndAssets:
    async def test_dedup_is_per_asset_and_a_duplicate_moves_no_state(
        self, store: SqliteStateBackend
    ) -> None:
        """A redelivered dedup_key writes nothing for the asset that has it, and the event
        plus state for an asset that does not."""
        first = await store.events.acommit(commit("orders", dedup_key="m1", wm="10"))
        again = await store.events.acommit(commit("orders", "invoices", dedup_key="m1", wm="5"))
        assert [e.asset for e in first] == ["orders"]
        assert [e.asset for e in again] == ["invoices"]
        assert again[0].id > first[0].id
        assert await store.aget(ORDERS_SCOPE, "wm") == 10
        assert await store.aget(AssetScope(name="invoices"), "wm") == 5
        rows = raw_rows(
            Path(store.path), "SELECT asset_name, dedup_key FROM asset_events ORDER BY id"
        )
        assert rows == [("orders", "m1"), ("invoices", "m1")]

    async def test_an_unknown_asset_writes_neither_event_nor_state(
        self, store: SqliteStateBackend
    ) -> None:
        """A commit naming an unknown asset fails whole: no event and no state anywhere."""
        with pytest.raises(AssetNotFoundError, match="ghost"):
            await store.events.acommit(commit("orders", "ghost", wm="1"))
        assert await store.events.alist_events() == []
        assert await store.aget(ORDERS_SCOPE, "wm") is None
        assert raw_rows(Path(store.path), "SELECT count(*) FROM asset_state") == [(0,)]

    async def test_scopes_resolve_by_id_name_and_uri(self, store: SqliteStateBackend) -> None:
        """An asset's state is reachable by its id, its name and its URI alike."""
        (orders,) = [a for a in await store.events.alist_assets() if a.name == "orders"]
        await store.aset(AssetScope(uri="s3://data/orders"), "wm", 1)
        assert await store.aget(AssetScope(asset_id=orders.asset_id), "wm") == 1
        assert await store.aset(ORDERS_SCOPE, "wm", 2) == 2
        with pytest.raises(AssetNotFoundError):
            await store.aset(AssetScope(uri="s3://elsewhere"), "wm", 1)

    async def test_a_deactivated_asset_is_never_served_from_the_cache(
        self, store: SqliteStateBackend
    ) -> None:
        """After deactivation every read and write of the asset fails, though it was cached."""
        await store.aset(ORDERS_SCOPE, "wm", 1)
        assert await store.events.adeactivate_asset("orders")
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.aset(ORDERS_SCOPE, "wm", 2),
            lambda: store.aget(ORDERS_SCOPE, "wm"),
            lambda: store.alist(ORDERS_SCOPE),
            lambda: store.adelete(ORDERS_SCOPE, "wm"),
            lambda: store.events.acommit(commit("orders")),
        ]
        for call in calls:
            with pytest.raises(AssetNotFoundError):
                await call()
        await store.events.aregister_assets([ORDERS])
        assert await store.aget(ORDERS_SCOPE, "wm") == 1  # not yet swept by GC


def grouped_commits() -> list[EventCommit]:
    """Commits that exercise the grouped path: same and different assets, with and without
    dedup keys (repeated inside the group and across it), overlapping state keys."""
    commits: list[EventCommit] = []
    for n in range(60):
        assets = [("orders",), ("invoices",), ("orders", "invoices")][n % 3]
        dedup = None if n % 2 else f"m{n % 7}"
        state = {"wm": str(n), f"k{n % 4}": f'"v{n}"'}
        if n % 5 == 0:
            state = {}
        commits.append(EventCommit(f"w{n % 3}", assets, f'{{"n":{n}}}', dedup, state))
    return commits


def ranked(results: dict[int, list[tuple[object, ...]]]) -> dict[int, list[tuple[object, ...]]]:
    """``results`` with each event id replaced by its rank: a commit one by one spends an id
    on a duplicate (``ON CONFLICT DO NOTHING`` under AUTOINCREMENT), a grouped one does not;
    ids only promise to grow in commit order."""
    order = sorted(int(str(row[0])) for rows in results.values() for row in rows)
    rank = {event_id: n for n, event_id in enumerate(order)}
    return {n: [(rank[int(str(row[0]))], *row[1:]) for row in rows] for n, rows in results.items()}


async def outcome_of(backend: SqliteStateBackend) -> tuple[object, ...]:
    """Everything the commits left behind: events (ids ranked, no timestamps), state with
    versions."""
    events = [
        (n, e.asset, e.watcher, e.payload, e.dedup_key)
        for n, e in enumerate(await backend.events.alist_events())
    ]
    state = {
        name: [(e.key, e.value, e.version) for e in await backend.alist(AssetScope(name=name))]
        for name in ("orders", "invoices")
    }
    return events, state


class TestGroupedEventCommits:
    async def test_concurrent_commits_equal_sequential_ones(
        self, store: SqliteStateBackend, tmp_path: Path
    ) -> None:
        """Commits released together in one batch return, store and version exactly what the
        same commits awaited one by one do."""
        await store.events.acommit(EventCommit("w0", ("orders",), "0", "m3", {"wm": "-1"}))
        start = anyio.Event()
        results: dict[int, list[tuple[object, ...]]] = {}
        commits = grouped_commits()

        async def run(n: int, item: EventCommit) -> None:
            await start.wait()
            written = await store.events.acommit(item)
            results[n] = [(e.id, e.asset, e.payload, e.dedup_key) for e in written]

        before = store.commit_stats
        async with anyio.create_task_group() as tg:
            for n, item in enumerate(commits):
                tg.start_soon(run, n, item)
            await anyio.wait_all_tasks_blocked()
            start.set()
        assert store.commit_stats.batches - before.batches == 1  # they did share one batch

        async with SqliteStateBackend(tmp_path / "sequential.db") as alone:
            await alone.events.aregister_assets([ORDERS, INVOICES])
            await alone.events.acommit(EventCommit("w0", ("orders",), "0", "m3", {"wm": "-1"}))
            expected: dict[int, list[tuple[object, ...]]] = {}
            for n, item in enumerate(commits):
                written = await alone.events.acommit(item)
                expected[n] = [(e.id, e.asset, e.payload, e.dedup_key) for e in written]
            assert ranked(results) == ranked(expected)
            assert await outcome_of(store) == await outcome_of(alone)
        assert any(not written for written in results.values())  # some were duplicates
        events = await store.events.alist_events()
        assert len({e.created_at for e in events[1:]}) == 1  # one batch, one timestamp

    async def test_the_ids_a_group_returns_are_the_ids_it_stored(
        self, store: SqliteStateBackend
    ) -> None:
        """A group of more rows than one statement takes (single commits on one or two
        assets, duplicates skipped, a batch of 600 events in the middle) returns each event
        with the id it was stored under."""
        await store.events.acommit(commit("orders", dedup_key="seen"))
        start = anyio.Event()
        returned: list[tuple[int, str, object]] = []

        async def run(item: EventCommit | EventBatchCommit) -> None:
            await start.wait()
            if isinstance(item, EventBatchCommit):
                written = await store.events.acommit_batch(item)
            else:
                written = await store.events.acommit(item)
            returned.extend((e.id, e.asset, e.payload) for e in written)

        items: list[EventCommit | EventBatchCommit] = []
        for n in range(300):
            assets = ("orders", "invoices") if n % 3 == 0 else ("orders",)
            key = "seen" if n % 50 == 0 else (f"k{n % 7}" if n % 5 == 0 else None)
            items.append(EventCommit("w", assets, str(n), key, {"wm": str(n)}))
            if n == 150:
                events = tuple((f'"b{i}"', None) for i in range(600))
                items.append(EventBatchCommit("b", ("invoices",), events, {"wm": "0"}))
        before = store.commit_stats
        async with anyio.create_task_group() as tg:
            for item in items:
                tg.start_soon(run, item)
            await anyio.wait_all_tasks_blocked()
            start.set()
        assert store.commit_stats.batches - before.batches == 1  # one group
        stored = {e.id: (e.asset, e.payload) for e in await store.events.alist_events()}
        assert len(returned) > 256 + 600
        assert {event_id: (asset, payload) for event_id, asset, payload in returned} == {
            event_id: row for event_id, row in stored.items() if event_id > 1
        }

    async def test_a_bad_commit_in_a_group_fails_alone(self, store: SqliteStateBackend) -> None:
        """In one batch, commits naming an unknown asset or carrying a stale fence fail with
        their own errors and write nothing; the commits around them land."""
        token = (await store.leases.aclaim_leases("daemon", ["w"], 60))["w"]
        start = anyio.Event()
        outcomes: dict[str, object] = {}

        async def run(name: str, item: EventCommit) -> None:
            await start.wait()
            try:
                outcomes[name] = [e.asset for e in await store.events.acommit(item)]
            except Exception as exc:  # noqa: BLE001 - the outcome under test
                outcomes[name] = exc

        live, stale = Fence("w", "daemon", token), Fence("w", "daemon", token + 1)
        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(run, f"ok{i}", commit("orders", wm=str(i)))
            tg.start_soon(run, "ghost", commit("orders", "ghost", wm="100"))
            tg.start_soon(
                run, "stale", EventCommit("w", ("orders",), "1", state={"wm": "200"}, fence=stale)
            )
            tg.start_soon(
                run, "live", EventCommit("w", ("invoices",), "1", state={"wm": "7"}, fence=live)
            )
            await anyio.wait_all_tasks_blocked()
            start.set()
        assert isinstance(outcomes.pop("ghost"), AssetNotFoundError)
        assert isinstance(outcomes.pop("stale"), LeaseLostError)
        assert outcomes.pop("live") == ["invoices"]
        assert outcomes == {f"ok{i}": ["orders"] for i in range(10)}
        entry = await store.aget_entry(ORDERS_SCOPE, "wm")
        assert entry is not None
        assert (entry.value, entry.version) == (9, 10)
        assert await store.aget(AssetScope(name="invoices"), "wm") == 7
        assert len(await store.events.alist_events()) == 11

    async def test_a_statement_failure_reruns_the_group_one_by_one(
        self, store: SqliteStateBackend, sqlite_path: Path
    ) -> None:
        """A commit whose state the database refuses fails alone, chained from the driver's
        error; the other commits of its group land with their state."""
        conn = sqlite3.connect(sqlite_path)
        conn.execute(
            "CREATE TRIGGER poison BEFORE INSERT ON asset_state "
            "WHEN NEW.key = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned key'); END"
        )
        conn.close()
        start = anyio.Event()
        outcomes: dict[str, object] = {}

        async def run(name: str, item: EventCommit) -> None:
            await start.wait()
            try:
                outcomes[name] = len(await store.events.acommit(item))
            except StateStoreError as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(run, f"ok{i}", commit("orders", wm=str(i)))
            tg.start_soon(run, "bad", commit("invoices", poison="1", wm="50"))
            await anyio.wait_all_tasks_blocked()
            start.set()
        error = outcomes.pop("bad")
        assert isinstance(error, StateStoreError)
        assert isinstance(error.__cause__, sqlite3.Error)
        assert outcomes == {f"ok{i}": 1 for i in range(5)}
        assert [e.asset for e in await store.events.alist_events()] == ["orders"] * 5
        assert await store.aget(AssetScope(name="invoices"), "wm") is None
        entry = await store.aget_entry(ORDERS_SCOPE, "wm")
        assert entry is not None
        assert (entry.value, entry.version) == (4, 5)


class TestGarbageCollection:
    async def _fill(self, store: SqliteStateBackend) -> None:
        store.clock = lambda: T0
        for i in range(5):
            await store.aset(TASK, f"expired{i}", i, retention=timedelta(hours=1))
        await store.aset(TASK, "stale", 1)
        await store.aset(TASK, "kept", 1, retention=NEVER_EXPIRE)
        await store.aset(TASK, "fresh", 1, retention=timedelta(days=365))
        await store.aset(ORDERS_SCOPE, "wm", 1)
        await store.events.adeactivate_asset("orders")

    async def test_collects_expired_stale_and_orphaned_rows(
        self, store: SqliteStateBackend
    ) -> None:
        """Expired rows, rows past default retention and state of inactive assets go; a
        NEVER_EXPIRE row and an unexpired one stay."""
        await self._fill(store)
        report = await store.gc.acollect_garbage(
            default_retention_days=30, now=T0 + timedelta(days=31)
        )
        assert [key for _, key in report.expired] == [f"expired{i}" for i in range(5)]
        assert [key for _, key in report.retention] == ["stale"]
        assert report.orphaned == [("orders", "wm")]
        assert sorted(e.key for e in await store.alist(TASK)) == ["fresh", "kept"]
        assert raw_rows(Path(store.path), "SELECT count(*) FROM asset_state") == [(0,)]

    async def test_batches_delete_everything_in_several_writes(
        self, store: SqliteStateBackend
    ) -> None:
        """batch_size=2 deletes the five expired rows in three writes and reports them all."""
        await self._fill(store)
        before = store.commit_stats.writes
        report = await store.gc.acollect_garbage(
            default_retention_days=0, batch_size=2, now=T0 + timedelta(days=2)
        )
        # expired: 2 + 2 + 1 rows; retention is disabled; orphaned: 1 row; events and the
        # runs' logs: none (one write each).
        assert store.commit_stats.writes - before == 6
        assert len(report.expired) == 5 and report.retention == [] and len(report.orphaned) == 1
        assert sorted(e.key for e in await store.alist(TASK)) == ["fresh", "kept", "stale"]

    async def test_one_statement_when_batch_size_is_zero(self, store: SqliteStateBackend) -> None:
        """batch_size=0 deletes each kind (three of state, events, runs' logs) in one write."""
        await self._fill(store)
        before = store.commit_stats.writes
        report = await store.gc.acollect_garbage(now=T0 + timedelta(days=31))
        assert store.commit_stats.writes - before == 5
        assert report.total == 7

    async def test_dry_run_reports_the_same_rows_and_deletes_nothing(
        self, store: SqliteStateBackend
    ) -> None:
        """A dry run reports exactly what the real run then deletes, and deletes nothing."""
        await self._fill(store)
        now = T0 + timedelta(days=31)
        dry = await store.gc.acollect_garbage(dry_run=True, now=now)
        assert len(await store.alist(TASK)) == 8
        real = await store.gc.acollect_garbage(now=now)
        assert dry.dry_run and not real.dry_run
        assert (dry.expired, dry.retention, dry.orphaned) == (
            real.expired,
            real.retention,
            real.orphaned,
        )

    @pytest.mark.parametrize(("days", "batch"), [(30, -1), (-3, 0)])
    async def test_bad_arguments_change_nothing(
        self, store: SqliteStateBackend, days: int, batch: int
    ) -> None:
        """A negative batch size or retention is refused before anything is deleted."""
        await self._fill(store)
        with pytest.raises(ValueError, match="must be an int >= 0"):
            await store.gc.acollect_garbage(
                default_retention_days=days, batch_size=batch, now=T0 + timedelta(days=31)
            )
        assert len(await store.alist(TASK)) == 8


class TestRunQueries:
    """The queries that find runs by state read an index: a claim (one per run finished) and
    the worker's heartbeat listing must not scan every run ever made."""

    @staticmethod
    async def plan(tmp_path: Path, sql: str, params: tuple[object, ...]) -> str:
        path = tmp_path / "state.db"
        async with SqliteStateBackend(path):
            pass
        with sqlite3.connect(path) as conn:
            plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
        return " | ".join(str(row[-1]) for row in plan)

    @pytest.mark.parametrize(
        ("task", "state", "index"),
        [
            (None, "running", "task_runs_state"),
            (None, "queued", "task_runs_state"),
            ("report", None, "task_runs_task"),
            ("report", "queued", "task_runs_"),
        ],
    )
    async def test_a_filtered_listing_reads_an_index(
        self, tmp_path: Path, task: str | None, state: str | None, index: str
    ) -> None:
        from watchkeeper.store.sql.dialects import SQLITE
        from watchkeeper.store.sql.runs import RunStatements

        stmt = RunStatements(SQLITE, "").listing(task is not None, state, False)
        params = stmt.bind({"task": task, "limit": 10}, None, lambda ttl: None)
        plan = await self.plan(tmp_path, stmt.sql, params)
        assert f"USING INDEX {index}" in plan and "SCAN task_runs" not in plan, plan

    @pytest.mark.parametrize("name", ["lapsed", "claim", "anything"])
    async def test_what_a_claim_reads_uses_the_state_index(self, tmp_path: Path, name: str) -> None:
        """The statements a claim reads open runs with find them by the state index."""
        from watchkeeper.store.sql.dialects import SQLITE
        from watchkeeper.store.sql.run_steps import StepStatements

        found = getattr(StepStatements(SQLITE, ""), name)
        stmt = found if name == "anything" else found[1]  # with the task filter
        params = {"tasks": ["t"], "owner": "w", "limit": 1, "create": 1, "ttl": 1.0}
        now = "2026-01-01T00:00:00.000000+00:00"
        plan = await self.plan(tmp_path, stmt.sql, stmt.bind(params, now, lambda ttl: now))
        assert "USING INDEX task_runs_state" in plan, plan
        assert "SCAN r" not in plan.split(" | ") and "SCAN task_runs" not in plan, plan

    async def test_a_refused_finish_in_a_group_fails_alone(self, tmp_path: Path) -> None:
        """Among grouped plain successes, one with a stale token gets the reason its finish
        was refused and its run is left as it was; the others finish."""
        from watchkeeper.store import RunLeaseLostError
        from watchkeeper.store.protocols import RunOutcome, TaskSpec
        from watchkeeper.store.sql.run_steps import StepItem
        from watchkeeper.store.sqlite.tasks import RUN_STEPS
        from watchkeeper.store.sqlite.writer import Tx

        path = tmp_path / "state.db"
        ttl = timedelta(seconds=30)
        async with SqliteStateBackend(path) as store:
            await store.events.aregister_assets([Asset("a")])
            await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
            for i in range(3):
                await store.events.acommit(EventCommit("w", ("a",), str(i)))
            await store.tasks.acreate_runs("t", 3)
            held = await store.tasks.aclaim_runs("w1", limit=3, ttl=ttl)
        stale = held[1]
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            tx = Tx(conn, lambda: datetime.now(UTC))
            conn.execute("BEGIN IMMEDIATE")
            tx.begin()
            tokens = [r.lease_token + (r.id == stale.id) for r in held]
            outcomes = RUN_STEPS.run(
                tx,
                [StepItem("w1", RunOutcome(r.id, token, True), 0, ttl, ("t",), 0)
                 for r, token in zip(held, tokens, strict=True)],
            )  # fmt: skip
            conn.execute("COMMIT")
        finally:
            conn.close()
        assert isinstance(outcomes[1], RunLeaseLostError) and "w1" in str(outcomes[1])
        assert [outcomes[0].finished.state, outcomes[2].finished.state] == ["success"] * 2
        async with SqliteStateBackend(path) as store:
            left = await store.tasks.aget_run(stale.id)
        assert (left.state, left.lease_owner, left.lease_token) == ("running", "w1", 1)

    async def test_neighbouring_steps_share_one_claim(self, tmp_path: Path) -> None:
        """Steps that land in one batch run as one group: one statement for their plain
        successes, then one claim statement (and one lapsed-lease check) for all of them,
        each run claimed once."""
        from watchkeeper.store.protocols import RunOutcome, TaskSpec
        from watchkeeper.store.sql.run_steps import StepItem
        from watchkeeper.store.sqlite.tasks import RUN_STEPS
        from watchkeeper.store.sqlite.writer import Tx

        path = tmp_path / "state.db"
        ttl = timedelta(seconds=30)
        async with SqliteStateBackend(path) as store:
            await store.events.aregister_assets([Asset("a")])
            await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
            for i in range(6):
                await store.events.acommit(EventCommit("w", ("a",), str(i)))
            await store.tasks.acreate_runs("t", 6)
            held = await store.tasks.aclaim_runs("w1", limit=3, ttl=ttl)
        conn = sqlite3.connect(path, isolation_level=None)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            tx = Tx(conn, lambda: datetime.now(UTC))
            conn.execute("BEGIN IMMEDIATE")
            tx.begin()
            outcomes = RUN_STEPS.run(
                tx,
                [StepItem("w1", RunOutcome(r.id, r.lease_token, True), 1, ttl, ("t",), 0)
                 for r in held],
            )  # fmt: skip
            conn.execute("COMMIT")
        finally:
            conn.close()
        assert [o.finished.state for o in outcomes] == ["success"] * 3
        claimed = [run.id for o in outcomes for run in o.claimed]
        assert len(claimed) == len(set(claimed)) == 3
        assert not set(claimed) & {r.id for r in held}
        assert sum("SET state = 'running'" in s for s in statements) == 1, statements
        assert sum("SET state = 'success'" in s for s in statements) == 1, statements
        assert sum(s.startswith("SELECT r.id, r.try_number") for s in statements) == 1
