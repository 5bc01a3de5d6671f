"""A store that stops answering fails no watcher; a removed SQLite file stops the daemon.

The outage tests block a real PostgreSQL database (``ALLOW_CONNECTIONS false`` and every session
of it terminated) or hold a real SQLite file's write lock from another connection, observe the
runtime through its logs and statuses, give the store back, and then count the committed rows
with raw SQL: every watcher resumed by itself, none failed or counted a failure, the outage was
logged as exactly one ``store_unavailable``/``store_available`` pair, and the event streams
have no gap and no duplicate.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from pydantic import SecretStr
from watchkeeper.store import (
    Asset,
    AssetScope,
    DatabaseFileRemovedError,
    PostgresStateBackend,
    SqliteStateBackend,
    StoreUnavailableError,
)
from watchkeeper.store.settings import DatabaseSettings
from watchkeeper.triggerer import (
    BaseEventTrigger,
    Settings,
    TriggererSettings,
    TriggerEvent,
    TriggerRunner,
)
from watchkeeper.triggerer.daemon import Daemon
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers
from watchkeeper.triggerer.runtime._health import store_unavailable

from tests.support.daemons import daemon, log_events, wait_until
from tests.support.postgres import PgDatabase
from tests.support.runtime import LogWatch, Ticker, fast, spec, watch_logs

WAIT = 30.0  # bound of every wait here (the machine is shared and PostgreSQL may be slow)
QUIET = ("trigger_error", "trigger_failed", "trigger_backoff", "trigger_returned", "lease_lost")
"""Log events that an outage must not produce (a watcher blamed or stopped for it)."""
NOISY = (
    "trigger_status_save_failed",
    "lease_renewal_failed",
    "watchers_reload_failed",
    "gc_failed",
)
"""Per-try error lines of the daemon's loops that the one store_unavailable line replaces."""

OUTAGE = fast(max_failures=2, store_retry_max=0.05, backoff_max=0.05)
"""Quick retries of the store, and a watcher that failed twice for itself would stop."""


async def start_tickers(runner: TriggerRunner, prefix: str, count: int) -> list[Ticker]:
    """Register ``count`` assets ``<prefix><i>`` and run one :class:`Ticker` on each."""
    assets = [Asset(f"{prefix}{i}") for i in range(count)]
    await runner.backend.events.aregister_assets(assets)
    tickers = [Ticker() for _ in assets]
    for i, (asset, ticker) in enumerate(zip(assets, tickers, strict=True)):
        await runner.start_trigger(spec(f"{prefix}{i}", ticker, asset))
    return tickers


async def advance(tickers: list[Ticker], by: int) -> None:
    """Wait (bounded) until each ticker committed ``by`` events more than it has now."""
    counts = [t.count for t in tickers]
    with anyio.fail_after(WAIT):
        for ticker, count in zip(tickers, counts, strict=True):
            await ticker.reached(count + by).wait()


PACED_WATCHERS = '''
"""Six watchers, each yielding n = 1, 2, ... with the watermark n, a few ms apart."""

import anyio

from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent


class Paced(BaseEventTrigger):
    def __init__(self, name, pause=0.005):
        super().__init__()
        self.name = name
        self.pause = pause

    def serialize(self):
        return (self.classpath(), {"name": self.name, "pause": self.pause})

    async def run(self):
        n = await self.asset_state_store.aget("wm", default=0)
        while True:
            n += 1
            yield TriggerEvent({"n": n}, state={"wm": n})
            await anyio.sleep(self.pause)


for i in range(6):
    globals()[f"feed{i}"] = Asset(f"feed{i}", watchers=[AssetWatcher(f"feed{i}_watch", Paced(f"feed{i}"))])
'''


async def block_connections(admin_dsn: str, name: str) -> None:
    """Refuse new sessions to ``name`` and end every open one (an outage, as a failover makes one)."""
    await alter_database(admin_dsn, name, "ALLOW_CONNECTIONS false", end_sessions=True)


async def allow_connections(admin_dsn: str, name: str) -> None:
    await alter_database(admin_dsn, name, "ALLOW_CONNECTIONS true")


async def make_read_only(admin_dsn: str, name: str) -> None:
    """New sessions to ``name`` are read-only, as on a standby; every open one is ended."""
    change = "SET default_transaction_read_only = on"
    await alter_database(admin_dsn, name, change, end_sessions=True)


async def make_writable(admin_dsn: str, name: str) -> None:
    """New sessions to ``name`` may write again (open ones stay read-only until replaced)."""
    await alter_database(admin_dsn, name, "RESET default_transaction_read_only")


async def alter_database(
    admin_dsn: str, name: str, change: str, *, end_sessions: bool = False
) -> None:
    """``ALTER DATABASE name change``; with ``end_sessions``, every open session to it ends."""
    import asyncpg

    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'ALTER DATABASE "{name}" {change}')
        if end_sessions:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = $1 AND pid <> pg_backend_pid()",
                name,
            )
    finally:
        await conn.close()


async def pg_streams(
    dsn: str, field: str = "n"
) -> tuple[dict[str, list[int]], dict[str, int], dict[str, int]]:
    """Raw SQL: each asset's committed payload ``field`` in commit order, its ``wm``
    watermark, and each trigger's saved failure count."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        streams: dict[str, list[int]] = {}
        for row in await conn.fetch("SELECT asset_name, payload FROM asset_events ORDER BY id"):
            streams.setdefault(row[0], []).append(json.loads(row[1])[field])
        marks = {
            row[0]: json.loads(row[1])
            for row in await conn.fetch(
                "SELECT a.name, s.value FROM asset_state s JOIN assets a ON a.id = s.asset_id "
                "WHERE s.key = 'wm'"
            )
        }
        failures = {
            row[0]: row[1]
            for row in await conn.fetch("SELECT trigger_id, failures FROM trigger_status")
        }
    finally:
        await conn.close()
    return streams, marks, failures


async def poll(check: Callable[[], Any], what: str) -> None:
    """Poll ``check`` (sync or async) until it is truthy; fail after this module's WAIT."""
    await wait_until(check, what, within=WAIT)


def assert_one_outage(logs: LogWatch) -> None:
    """One store_unavailable/store_available pair, no watcher blamed, no per-try error line."""
    assert len(logs.named("store_unavailable")) == 1
    assert len(logs.named("store_available")) == 1
    for name in QUIET + NOISY:
        assert logs.named(name) == [], name


@pytest.mark.slow
@pytest.mark.postgres
class TestPostgresOutage:
    @pytest.fixture(autouse=True)
    def _unload(self) -> Iterator[None]:
        yield
        unload_watchers()

    async def test_daemon_watchers_wait_out_a_blocked_database_and_resume(
        self, tmp_path: Path, pg_dsn: str, pg_database: PgDatabase
    ) -> None:
        """Six watchers of a daemon on a database whose connections are refused
        and terminated past the lease time wait without failing, resume by themselves once
        it is back (leases renewed first, statuses saved again), with one logged outage and
        every event committed once."""
        watchers = tmp_path / "watchers"
        watchers.mkdir()
        (watchers / "paced.py").write_text(PACED_WATCHERS)
        name, dsn = pg_database
        settings = Settings(
            database=DatabaseSettings(url=SecretStr(dsn)),
            triggerer=TriggererSettings(
                watchers_path=watchers,
                heartbeat_interval=0.2,
                lease_renew_interval=0.2,  # leases last 0.6 s: the outage outlives them
                lease_margin=0.1,
                gc_interval=0.5,
                stop_grace=2,
                backoff_initial=0.05,
                backoff_max=0.2,
                max_failures=2,  # a watcher blamed for the outage would fail at once
            ),
        )
        with watch_logs() as logs:
            async with Daemon(settings, reload_interval=0.2) as d:
                runner = d.runner
                assert len(d.groups) == 6

                def each_committed(n: int, since: dict[str, int] | None = None) -> bool:
                    base = since or {}
                    rows = runner.statuses()
                    return len(rows) == 6 and all(
                        s.events >= base.get(s.trigger_id, 0) + n for s in rows
                    )

                await poll(lambda: each_committed(3), "events before the outage")
                await block_connections(pg_dsn, name)
                with anyio.fail_after(WAIT):
                    await logs.wait_for("store_unavailable")
                # Pings keep failing for 1.5 s and more: past the leases' 0.6 s.
                with anyio.fail_after(WAIT):
                    await logs.wait_for("store_ping_failed", count=6)

                def all_waiting() -> bool:
                    return all(
                        s.state == "backing_off"
                        and (s.last_error or "").startswith("StoreUnavailableError")
                        for s in runner.statuses()
                    )

                await poll(all_waiting, "every watcher waiting for the store")
                assert runner.store_health.available is False
                await allow_connections(pg_dsn, name)
                with anyio.fail_after(WAIT):
                    await logs.wait_for("store_available")
                at_recovery = {s.trigger_id: s.events for s in runner.statuses()}
                await poll(lambda: each_committed(3, at_recovery), "every watcher resumed")
                statuses = runner.statuses()
                assert [s.state for s in statuses] == ["running"] * 6
                assert [s.failures for s in statuses] == [0] * 6

                async def saved_after_recovery() -> bool:
                    rows = await d.backend.status.alist_trigger_status()
                    return len(rows) == 6 and all(
                        r.state == "running" and r.events > at_recovery[r.trigger_id] for r in rows
                    )

                await poll(saved_after_recovery, "the statuses saved after the outage")
        streams, marks, failures = await pg_streams(dsn)
        assert_one_outage(logs)
        assert sorted(streams) == [f"feed{i}" for i in range(6)]
        for feed, stream in streams.items():
            assert stream == list(range(1, len(stream) + 1)), f"{feed}: a gap or a duplicate"
            assert marks[feed] == len(stream)
        assert set(failures.values()) == {0}

    async def test_runner_resumes_after_a_read_only_database(
        self, pg_dsn: str, pg_database: PgDatabase
    ) -> None:
        """A database that turned read-only (as a demoted primary does) is an outage too: the
        watchers wait, and resume once writes are accepted again."""
        name, dsn = pg_database
        with watch_logs() as logs:
            async with (
                PostgresStateBackend(dsn, max_size=3) as backend,
                TriggerRunner(backend, OUTAGE) as runner,
            ):
                tickers = await start_tickers(runner, "ro", 3)
                await advance(tickers, 2)
                await make_read_only(pg_dsn, name)
                with anyio.fail_after(WAIT):
                    await logs.wait_for("store_ping_failed", count=2)
                unavailable = logs.named("store_unavailable")
                await make_writable(pg_dsn, name)
                with anyio.fail_after(WAIT):
                    await logs.wait_for("store_available")
                await advance(tickers, 2)
                assert [s.failures for s in runner.statuses()] == [0, 0, 0]
        streams, marks, _ = await pg_streams(dsn, "tick")
        assert "read-only" in unavailable[0]["error"]
        assert_one_outage(logs)
        for feed, stream in streams.items():
            assert stream == list(range(1, len(stream) + 1)), f"{feed}: a gap or a duplicate"
            assert marks[feed] == len(stream)


class TestClassification:
    @pytest.mark.postgres
    async def test_postgres_refusing_connections_is_store_unavailable(
        self, pg_dsn: str, pg_database: PgDatabase
    ) -> None:
        """Writes, reads and pings of a database that refuses connections raise
        StoreUnavailableError chained from the driver error (it was a plain StateStoreError)."""
        name, dsn = pg_database
        async with PostgresStateBackend(dsn) as backend:
            await backend.events.aregister_assets([Asset("a")])
            await block_connections(pg_dsn, name)
            scope = AssetScope(name="a")
            with pytest.raises(StoreUnavailableError) as written:
                await backend.aset(scope, "k", 1)
            with pytest.raises(StoreUnavailableError) as read:
                await backend.aget(scope, "k")
            with pytest.raises(StoreUnavailableError):
                await backend.aping()
            await allow_connections(pg_dsn, name)
            await backend.aping()
            await backend.aset(scope, "k", 2)
            assert await backend.aget(scope, "k") == 2
        for info in (written, read):
            assert info.value.__cause__ is not None
            assert "asyncpg" in type(info.value.__cause__).__module__

    @pytest.mark.postgres
    async def test_postgres_read_only_is_store_unavailable_until_writable(
        self, pg_dsn: str, pg_database: PgDatabase
    ) -> None:
        """On a database that turned read-only, writes, lease claims and pings raise
        StoreUnavailableError; once it is writable again they work on the same open backend
        (the read-only connections were dropped and replaced)."""
        name, dsn = pg_database
        async with PostgresStateBackend(dsn, max_size=2) as backend:
            await backend.events.aregister_assets([Asset("a")])
            scope = AssetScope(name="a")
            await backend.aset(scope, "k", 1)
            await make_read_only(pg_dsn, name)
            for _ in range(3):  # more tries than pooled connections: none is handed out again
                with pytest.raises(StoreUnavailableError, match="ReadOnlySQLTransaction"):
                    await backend.leases.aclaim_leases("daemon-1", ["t"], 30)
            with pytest.raises(StoreUnavailableError, match="ReadOnlySQLTransaction"):
                await backend.aset(scope, "k", 2)
            with pytest.raises(StoreUnavailableError, match="read-only"):
                await backend.aping()
            assert await backend.aget(scope, "k") == 1  # reads still work on a standby
            await make_writable(pg_dsn, name)
            await backend.aping()
            assert await backend.leases.aclaim_leases("daemon-1", ["t"], 30) == {"t": 1}
            await backend.aset(scope, "k", 2)
            assert await backend.aget(scope, "k") == 2

    async def test_sqlite_locked_past_busy_timeout_is_store_unavailable(
        self, tmp_path: Path
    ) -> None:
        """A write lock another connection holds past busy_timeout makes writes and pings raise
        StoreUnavailableError; they work again once it is released."""
        path = tmp_path / "state.db"
        async with SqliteStateBackend(path, busy_timeout=0.05) as backend:
            await backend.events.aregister_assets([Asset("a")])
            with HeldWriteLock(path):
                with pytest.raises(StoreUnavailableError, match="locked"):
                    await backend.aset(AssetScope(name="a"), "k", 1)
                with pytest.raises(StoreUnavailableError):
                    await backend.aping()
            await backend.aping()
            await backend.aset(AssetScope(name="a"), "k", 1)

    def test_a_wrapped_or_grouped_unavailability_is_still_found(self) -> None:
        """An error a watcher raised from a store outage, or one inside its own task group's
        exception group, is still the store's (and an unrelated error is not)."""
        outage = StoreUnavailableError("PostgreSQL unavailable (reading): refused")
        try:
            try:
                raise outage
            except StoreUnavailableError as exc:
                raise RuntimeError("could not read the cursor") from exc
        except RuntimeError as wrapped:
            chained = wrapped
        group = BaseExceptionGroup("watcher tasks", [ValueError("x"), chained])
        assert store_unavailable(chained) is outage
        assert store_unavailable(group) is outage
        assert store_unavailable(RuntimeError("a bug of the watcher")) is None
        assert store_unavailable(None) is None


class HeldWriteLock:
    """Hold the SQLite write lock of ``path`` from another connection while in the block."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, *exc: object) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


class TestSqliteOutage:
    async def test_runner_watchers_wait_out_a_held_write_lock(self, tmp_path: Path) -> None:
        """Watchers whose commits meet a write lock held past busy_timeout do not fail or
        count it, and resume once it is released, with one logged outage and no lost or
        duplicated event (counted with raw SQL)."""
        path = tmp_path / "state.db"
        with watch_logs() as logs:
            async with (
                SqliteStateBackend(path, busy_timeout=0.05) as backend,
                TriggerRunner(backend, OUTAGE) as runner,
            ):
                tickers = await start_tickers(runner, "s", 4)
                await advance(tickers, 3)
                lock = await anyio.to_thread.run_sync(HeldWriteLock, path)
                try:
                    await anyio.to_thread.run_sync(lock.__enter__)
                    with anyio.fail_after(WAIT):
                        await logs.wait_for("store_unavailable")
                        await logs.wait_for("store_ping_failed", count=3)
                    await poll(
                        lambda: {s.state for s in runner.statuses()} == {"backing_off"},
                        "every watcher waiting for the lock",
                    )
                finally:
                    await anyio.to_thread.run_sync(lock.__exit__, None, None, None)
                with anyio.fail_after(WAIT):
                    await logs.wait_for("store_available")
                await advance(tickers, 3)
                statuses = runner.statuses()
                assert [(s.state, s.failures) for s in statuses] == [("running", 0)] * 4
                assert all((s.last_error or "").startswith("StoreUnavailable") for s in statuses)
        assert_one_outage(logs)
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT asset_name, payload FROM asset_events ORDER BY id")
            streams: dict[str, list[int]] = {}
            for asset, payload in rows:
                streams.setdefault(asset, []).append(json.loads(payload)["tick"])
        assert sorted(streams) == ["s0", "s1", "s2", "s3"]
        for feed, stream in streams.items():
            assert stream == list(range(1, len(stream) + 1)), f"{feed}: a gap or a duplicate"


class TestDatabaseFileRemoved:
    async def test_backend_refuses_everything_once_its_file_is_removed(
        self, tmp_path: Path
    ) -> None:
        """After ``rm -rf`` of its directory, the SQLite backend's averify, writes, reads and
        pings raise DatabaseFileRemovedError naming the path (SQLite alone keeps committing)."""
        directory = tmp_path / "data"
        directory.mkdir()
        path = directory / "state.db"
        async with SqliteStateBackend(path) as backend:
            await backend.events.aregister_assets([Asset("a")])
            await backend.aset(AssetScope(name="a"), "k", 1)
            await backend.averify()
            await anyio.to_thread.run_sync(shutil.rmtree, directory)
            with pytest.raises(DatabaseFileRemovedError, match="was removed") as info:
                await backend.aset(AssetScope(name="a"), "k", 2)
            assert info.value.path == str(path)
            with pytest.raises(DatabaseFileRemovedError):
                await backend.averify()
            with pytest.raises(DatabaseFileRemovedError):
                await backend.aget(AssetScope(name="a"), "k")
            with pytest.raises(DatabaseFileRemovedError):
                await backend.aping()

    async def test_a_replaced_file_is_refused_too(self, tmp_path: Path) -> None:
        """A file put in place of the open one (another inode) is not written to either."""
        path = tmp_path / "state.db"
        async with SqliteStateBackend(path) as backend:
            await backend.events.aregister_assets([Asset("a")])
            moved = tmp_path / "moved.db"
            await anyio.to_thread.run_sync(path.rename, moved)
            await anyio.to_thread.run_sync(shutil.copyfile, moved, path)
            with pytest.raises(DatabaseFileRemovedError, match="replaced by another file"):
                await backend.averify()
            with pytest.raises(DatabaseFileRemovedError):
                await backend.aset(AssetScope(name="a"), "k", 1)

    async def test_event_yielded_after_removal_is_not_reported_committed(
        self, tmp_path: Path
    ) -> None:
        """The generator is not resumed past an event yielded once the file is gone (the code
        after ``yield``, an acknowledgement, never runs for it): its commit is refused, the
        watcher stops without counting a failure, and the removal is logged once."""
        directory = tmp_path / "data"
        directory.mkdir()
        asset = Asset("a")
        trigger = AckAfterYield()
        with watch_logs() as logs:
            async with (
                SqliteStateBackend(directory / "state.db") as backend,
                TriggerRunner(backend, fast()) as runner,
            ):
                await backend.events.aregister_assets([asset])
                await runner.start_trigger(spec("t", trigger, asset))
                with anyio.fail_after(WAIT):
                    await trigger.waiting.wait()
                await anyio.to_thread.run_sync(shutil.rmtree, directory)
                trigger.go.set()
                with anyio.fail_after(WAIT):
                    await logs.wait_for("database_file_removed")
                await poll(lambda: runner.statuses()[0].state == "stopped", "the watcher to stop")
                (slot,) = runner.statuses()
        assert trigger.acked == [1]  # event 2 was yielded, refused, and never acknowledged
        assert trigger.yielded == 2
        assert (slot.events, slot.failures) == (1, 0)
        assert (slot.last_error or "").startswith("DatabaseFileRemovedError")
        (removed,) = logs.named("database_file_removed")
        assert removed["path"] == str(directory / "state.db")
        assert logs.named("trigger_error") == []


class AckAfterYield(BaseEventTrigger):
    """Yields n = 1, 2, ...; after each yield (its event committed) records n as acknowledged,
    as a queue consumer would ack; after the first, waits for ``go``."""

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.yielded = 0
        self.waiting = anyio.Event()
        self.go = anyio.Event()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        n = 0
        while True:
            n += 1
            self.yielded = n
            yield TriggerEvent({"n": n}, state={"wm": n})
            self.acked.append(n)
            if n == 1:
                self.waiting.set()
                await self.go.wait()


@pytest.mark.slow
class TestDaemonFileRemoved:
    async def test_daemon_exits_non_zero_when_its_database_directory_is_removed(
        self, tmp_path: Path
    ) -> None:
        """``rm -rf`` of the database's directory under a running
        ``watchkeeper triggerer`` makes it log database_file_removed naming the path and exit
        1 with a one-line error, instead of committing into the removed file and exiting 0."""
        watchers = tmp_path / "watchers"
        watchers.mkdir()
        (watchers / "paced.py").write_text(PACED_WATCHERS)
        directory = tmp_path / "data"
        directory.mkdir()
        path = directory / "state.db"
        env = daemon_env(path)
        with (tmp_path / "daemon.log").open("ab") as log_file:
            async with daemon(tmp_path, watchers, env, log_file) as process:
                await wait_for_log(tmp_path, "daemon_started", process)
                await events_in(path, process)
                await anyio.to_thread.run_sync(shutil.rmtree, directory)
                with anyio.fail_after(WAIT):
                    status = await process.wait()
        assert status == 1
        events = log_events(tmp_path)
        removed = [e for e in events if e["event"] == "database_file_removed"]
        assert len(removed) == 1
        assert removed[0]["path"] == str(path)
        assert "was removed" in removed[0]["reason"]
        text = (tmp_path / "daemon.log").read_text()
        error_lines = [line for line in text.splitlines() if line.startswith("watchkeeper: error")]
        assert len(error_lines) == 1
        assert str(path) in error_lines[0]
        assert not path.exists()  # nothing recreated it


def daemon_env(path: Path) -> dict[str, str]:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    clean.update(
        WATCHKEEPER__DATABASE__URL=f"sqlite:///{path}",
        WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL="0.2",
        WATCHKEEPER__TRIGGERER__STOP_GRACE="5",
        WATCHKEEPER__LOGGING__FORMAT="json",
    )
    return clean


async def wait_for_log(tmp_path: Path, name: str, process: Any) -> None:
    with anyio.fail_after(WAIT):
        while not any(e["event"] == name for e in log_events(tmp_path)):
            if process.returncode is not None:
                pytest.fail(f"the daemon exited ({process.returncode}) before logging {name}")
            await anyio.sleep(0.05)


async def events_in(path: Path, process: Any) -> None:
    """Wait until the daemon has committed events into ``path`` (read with raw SQL)."""

    def count() -> int:
        with sqlite3.connect(path) as conn:
            return int(conn.execute("SELECT count(*) FROM asset_events").fetchone()[0])

    with anyio.fail_after(WAIT):
        while await anyio.to_thread.run_sync(count) < 12:
            if process.returncode is not None:
                pytest.fail(f"the daemon exited ({process.returncode}) before committing")
            await anyio.sleep(0.05)
