"""PostgresChangesWatcher against a real PostgreSQL with ``wal_level=logical`` (a throwaway
cluster of this session, see ``tests/support/pg_logical.py``)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import structlog
from watchkeeper.store import (
    Asset,
    AssetStateStoreAccessors,
    BaseStateBackend,
    MemoryStateBackend,
    SqliteStateBackend,
)
from watchkeeper.triggerer import TriggerEventBatch
from watchkeeper.triggerer.testing import WatcherHarness
from watchkeeper.watchers import PostgresChangesError, PostgresChangesWatcher
from watchkeeper.watchers._pgoutput import parse_lsn

from tests.support.brokers import run_through_a_break
from tests.support.pg_logical import PASSWORD, LogicalCluster
from tests.support.proxy import open_proxy

ASSET = Asset("changes")
NAME = "cdc"
POSITION = f"{NAME}.position"
FAST: dict[str, Any] = {"poll_interval": 0.1, "timeout": 10.0}


@contextlib.asynccontextmanager
async def connected(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(dsn)
    try:
        yield connection
    finally:
        await connection.close()


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[BaseStateBackend]:
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        yield backend


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    return WatcherHarness(state, watermark_key=POSITION)


@pytest.fixture
async def db(pg_logical: LogicalCluster) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the cluster; the slots made by the test are dropped afterwards."""
    connection = await asyncpg.connect(pg_logical.dsn)
    try:
        yield connection
    finally:
        with anyio.move_on_after(10, shield=True):
            await connection.close()  # (a test may have closed it already)
            async with connected(pg_logical.dsn) as cleaner:
                await cleaner.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name LIKE 'wk_t_%' AND NOT active"
                )


@pytest.fixture
async def table(db: asyncpg.Connection) -> str:
    """A new table ``(id int primary key, name text, qty int, data jsonb)``."""
    name = unique("t")
    await db.execute(
        f"CREATE TABLE {name} (id int PRIMARY KEY, name text, qty int, price numeric, "
        "data jsonb, seen timestamptz)"
    )
    return name


def watcher(cluster: LogicalCluster, table: str, **options: Any) -> PostgresChangesWatcher:
    return PostgresChangesWatcher(cluster.dsn, f"wk_{table}", tables=[table], **{**FAST, **options})


async def start_slot(cluster: LogicalCluster, harness: WatcherHarness, table: str) -> None:
    """Make the watcher's publication and slot before the test writes (what its first start
    does; tested in TestSetUp)."""
    async with connected(cluster.dsn) as conn:
        await conn.execute(f"CREATE PUBLICATION wk_{table} FOR TABLE {table}")
        await conn.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f"wk_{table}"
        )


async def memory_store() -> AssetStateStoreAccessors:
    """The watched asset's state in a memory backend (for runs outside the harness)."""
    backend = MemoryStateBackend()
    await backend.events.aregister_assets([ASSET])
    return AssetStateStoreAccessors(backend, [ASSET])


async def batches_of(trigger: PostgresChangesWatcher, count: int) -> list[TriggerEventBatch]:
    """The first ``count`` batches ``run()`` yields (bound to a memory store, nothing
    committed): how the changes are grouped."""
    trigger.bind_asset_state_store(await memory_store())
    trigger.bind_watcher_name(NAME)
    found: list[TriggerEventBatch] = []
    with anyio.fail_after(20):
        async for batch in trigger.run():
            found.append(batch)
            if len(found) == count:
                break
    await trigger.cleanup()
    return found


def ops(payloads: list[Any]) -> list[tuple[str, Any, Any]]:
    return [(p["op"], p["new"], p["old"]) for p in payloads]


class TestChanges:
    async def test_insert_update_delete_with_the_default_identity(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """Each committed change is one event in commit order; the default replica identity
        gives the old key on a delete and on an update that moves the key, nothing else."""
        await start_slot(pg_logical, harness, table)
        await db.execute(
            f"INSERT INTO {table} (id, name, qty, price, data) "
            """VALUES (1, 'a', 5, 1.10, '{"k": [1, 2]}')"""
        )
        await db.execute(f"UPDATE {table} SET qty = 6 WHERE id = 1")
        await db.execute(f"UPDATE {table} SET id = 2 WHERE id = 1")
        await db.execute(f"DELETE FROM {table} WHERE id = 2")
        run = await harness.run(
            watcher(pg_logical, table), assets=ASSET, max_events=4, watcher_name=NAME
        )
        row = {"id": 1, "name": "a", "qty": 5, "price": "1.10", "data": {"k": [1, 2]}, "seen": None}
        assert ops(run.payloads) == [
            ("insert", row, None),
            ("update", {**row, "qty": 6}, None),
            ("update", {**row, "qty": 6, "id": 2}, {"id": 1}),
            ("delete", None, {"id": 2}),
        ]
        first = run.payloads[0]
        assert (first["schema"], first["table"], first["unchanged"]) == ("public", table, None)
        assert first["commit_time"].endswith("+00:00")
        assert run.watermark["partial"] is None
        assert parse_lsn(run.watermark["lsn"]) > parse_lsn(run.payloads[-1]["commit_lsn"])

    async def test_replica_identity_full_gives_the_old_rows(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """With REPLICA IDENTITY FULL, an update and a delete carry the whole old row."""
        await db.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        await start_slot(pg_logical, harness, table)
        await db.execute(f"INSERT INTO {table} (id, name, qty) VALUES (1, 'a', 5)")
        await db.execute(f"UPDATE {table} SET name = 'b' WHERE id = 1")
        await db.execute(f"DELETE FROM {table} WHERE id = 1")
        run = await harness.run(
            watcher(pg_logical, table), assets=ASSET, max_events=3, watcher_name=NAME
        )
        old = {"id": 1, "name": "a", "qty": 5, "price": None, "data": None, "seen": None}
        assert ops(run.payloads) == [
            ("insert", old, None),
            ("update", {**old, "name": "b"}, old),
            ("delete", None, {**old, "name": "b"}),
        ]

    async def test_a_truncate_is_one_event_without_rows(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """TRUNCATE gives one ``truncate`` event for the table."""
        await start_slot(pg_logical, harness, table)
        await db.execute(f"INSERT INTO {table} (id) VALUES (1)")
        await db.execute(f"TRUNCATE {table}")
        run = await harness.run(
            watcher(pg_logical, table), assets=ASSET, max_events=2, watcher_name=NAME
        )
        assert [(p["op"], p["table"]) for p in run.payloads] == [
            ("insert", table),
            ("truncate", table),
        ]

    async def test_an_unchanged_large_value_is_named_not_sent(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """An update that leaves a TOASTed value alone does not carry it: the column is left
        out of ``new`` and named in ``unchanged``."""
        await start_slot(pg_logical, harness, table)
        await db.execute(
            f"INSERT INTO {table} (id, name) SELECT 1, string_agg(md5(g::text), '') "
            "FROM generate_series(1, 400) g"
        )
        await db.execute(f"UPDATE {table} SET qty = 2 WHERE id = 1")
        run = await harness.run(
            watcher(pg_logical, table), assets=ASSET, max_events=2, watcher_name=NAME
        )
        inserted, updated = run.payloads
        assert len(inserted["new"]["name"]) == 400 * 32
        assert "name" not in updated["new"] and updated["new"]["qty"] == 2
        assert updated["unchanged"] == ["name"]

    async def test_changes_of_one_transaction_share_a_batch(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """Whole source transactions go into a batch until it is full: 3 + 2 + 4 rows with
        batch_size 5 are batches of [3, 2] and [4]; a 12-row transaction with batch_size 5 is
        split in 5 + 5 + 2, its position saying how far in it each part got."""
        await start_slot(pg_logical, harness, table)
        for rows in ([1, 2, 3], [4, 5], [6, 7, 8, 9]):
            async with db.transaction():
                for n in rows:
                    await db.execute(f"INSERT INTO {table} (id) VALUES ($1)", n)
        found = await batches_of(watcher(pg_logical, table, batch_size=5), 2)
        ids = [[event.payload["new"]["id"] for event in batch.events] for batch in found]
        assert ids == [[1, 2, 3, 4, 5], [6, 7, 8, 9]]
        xids = [{event.payload["xid"] for event in batch.events} for batch in found]
        assert [len(x) for x in xids] == [2, 1]

        big = unique("t")
        await db.execute(f"CREATE TABLE {big} (id int PRIMARY KEY)")
        await start_slot(pg_logical, harness, big)
        await db.execute(f"INSERT INTO {big} SELECT generate_series(1, 12)")
        parts = await batches_of(watcher(pg_logical, big, batch_size=5), 3)
        assert [len(batch) for batch in parts] == [5, 5, 2]
        states = [batch.state[POSITION] for batch in parts if batch.state]
        assert [s["partial"] and s["partial"]["changes"] for s in states] == [5, 10, None]


class TestExactlyOnce:
    async def test_a_restart_resumes_after_the_position_without_repeats(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """A watcher stopped after some changes and rebuilt from serialize() emits only the
        changes after them."""
        await start_slot(pg_logical, harness, table)
        await db.execute(f"INSERT INTO {table} (id) SELECT generate_series(1, 3)")
        first = await harness.run(
            watcher(pg_logical, table), assets=ASSET, max_events=3, watcher_name=NAME
        )
        await db.execute(f"INSERT INTO {table} (id) SELECT generate_series(4, 5)")
        after = await harness.restart(
            watcher(pg_logical, table), assets=ASSET, max_events=2, watcher_name=NAME
        )
        assert [p["new"]["id"] for p in first.payloads] == [1, 2, 3]
        assert [p["new"]["id"] for p in after.payloads] == [4, 5]
        assert [p["new"]["id"] for p in after.all_payloads] == [1, 2, 3, 4, 5]

    async def test_a_crash_between_our_commit_and_the_advance_repeats_nothing(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """Killed right after its first batch committed, before the slot moved: the slot gives
        those changes again and the position in the state skips them."""
        slot = f"wk_{table}"
        await start_slot(pg_logical, harness, table)
        confirmed = await _confirmed(db, slot)
        await db.execute(f"INSERT INTO {table} (id) SELECT generate_series(1, 3)")
        crashed = await harness.crash(
            watcher(pg_logical, table), assets=ASSET, at="after_commit", event=1, watcher_name=NAME
        )
        assert [p["new"]["id"] for p in crashed.payloads] == [1, 2, 3]
        assert await _confirmed(db, slot) == confirmed  # not advanced
        peeked = await db.fetchval(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, "
            "'proto_version', '1', 'publication_names', $2)",
            slot,
            slot,
        )
        assert peeked > 3  # the slot still has them
        await db.execute(f"INSERT INTO {table} (id) VALUES (4)")
        after = await harness.restart(
            watcher(pg_logical, table), assets=ASSET, max_events=1, idle=1, watcher_name=NAME
        )
        assert [p["new"]["id"] for p in after.payloads] == [4]
        assert [p["new"]["id"] for p in after.all_payloads] == [1, 2, 3, 4]
        # A run with nothing new to emit confirms what was committed: the slot moves on.
        quiet = await harness.restart(
            watcher(pg_logical, table), assets=ASSET, timeout=3, watcher_name=NAME
        )
        assert quiet.payloads == []
        assert await _confirmed(db, slot) > confirmed

    async def test_a_crash_inside_a_large_transaction_resumes_inside_it(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """A 12-row transaction in batches of 5, killed after its second part committed:
        the restart emits the last 2 rows only."""
        await start_slot(pg_logical, harness, table)
        await db.execute(f"INSERT INTO {table} (id) SELECT generate_series(1, 12)")
        crashed = await harness.crash(
            watcher(pg_logical, table, batch_size=5),
            assets=ASSET,
            at="after_commit",
            event=2,
            watcher_name=NAME,
        )
        assert len(crashed.all_payloads) == 10
        after = await harness.restart(
            watcher(pg_logical, table, batch_size=5), assets=ASSET, max_events=2, watcher_name=NAME
        )
        assert [p["new"]["id"] for p in after.payloads] == [11, 12]
        assert [p["new"]["id"] for p in after.all_payloads] == list(range(1, 13))


async def _confirmed(db: asyncpg.Connection, slot: str) -> int:
    return int(
        await db.fetchval(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", slot
        )
    )


class TestSetUp:
    async def test_the_slot_and_publication_are_created_once(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """A first start creates the publication of the tables and a pgoutput slot; a second
        start finds them; the slot's lag is measured."""
        trigger = watcher(pg_logical, table)
        await harness.run(trigger, assets=ASSET, timeout=2, watcher_name=NAME)
        slot = await db.fetchrow(
            "SELECT plugin, slot_type FROM pg_replication_slots WHERE slot_name = $1",
            f"wk_{table}",
        )
        assert slot is not None and tuple(slot) == ("pgoutput", "logical")
        tables = await db.fetch(
            "SELECT tablename FROM pg_publication_tables WHERE pubname = $1", f"wk_{table}"
        )
        assert [r[0] for r in tables] == [table]
        assert trigger.slot_lag_bytes is not None and trigger.slot_lag_bytes >= 0
        assert trigger.source_gauges() == {"slot_lag_bytes": float(trigger.slot_lag_bytes)}
        await harness.run(watcher(pg_logical, table), assets=ASSET, timeout=1, watcher_name=NAME)

    async def test_an_existing_publication_is_used(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """Given a publication (no tables), the watcher reads what it publishes."""
        publication = unique("pub")
        await db.execute(f"CREATE PUBLICATION {publication} FOR TABLE {table}")
        trigger = PostgresChangesWatcher(pg_logical.dsn, f"wk_{table}", publication, **FAST)
        await harness.run(trigger, assets=ASSET, timeout=2, watcher_name=NAME)
        await db.execute(f"INSERT INTO {table} (id) VALUES (7)")
        run = await harness.restart(trigger, assets=ASSET, max_events=1, watcher_name=NAME)
        assert [p["new"]["id"] for p in run.payloads] == [7]

    async def test_refusals_raise_a_clear_error(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """A missing publication, a missing table, a publication of other tables and a slot of
        another plugin each end run() with PostgresChangesError saying what is wrong, and
        nothing is created."""
        missing = unique("nopub")
        cases: list[tuple[PostgresChangesWatcher, str]] = [
            (
                PostgresChangesWatcher(pg_logical.dsn, f"wk_{table}", missing, **FAST),
                "no such publication",
            ),
            (
                PostgresChangesWatcher(
                    pg_logical.dsn, f"wk_{table}", tables=[f"{table}_nope"], **FAST
                ),
                f"no such table: {table}_nope",
            ),
        ]
        other = unique("pub")
        await db.execute(f"CREATE PUBLICATION {other} FOR TABLE {table}")
        await db.execute(f"CREATE TABLE {table}_b (id int PRIMARY KEY)")
        cases.append(
            (
                PostgresChangesWatcher(
                    pg_logical.dsn, f"wk_{table}", other, tables=[f"{table}_b"], **FAST
                ),
                "not the tables given",
            )
        )
        await db.execute(
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", f"wk_{table}_td"
        )
        cases.append(
            (
                PostgresChangesWatcher(pg_logical.dsn, f"wk_{table}_td", tables=[table], **FAST),
                "plugin 'test_decoding'",
            )
        )
        for trigger, message in cases:
            with pytest.raises(PostgresChangesError, match=message) as caught:
                await harness.run(trigger, assets=ASSET, timeout=10, watcher_name=NAME)
            assert PASSWORD not in str(caught.value)
        slots = await db.fetch(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE $1", f"wk_{table}%"
        )
        assert [r[0] for r in slots] == [f"wk_{table}_td"]

    async def test_a_server_without_logical_decoding_is_refused(
        self, pg_dsn: str, harness: WatcherHarness
    ) -> None:
        """On a server with wal_level=replica, run() raises saying to set wal_level=logical."""
        async with connected(pg_dsn) as conn:
            level = await conn.fetchval("SHOW wal_level")
        if level == "logical":
            reason = "the shared server has logical decoding on: nothing to refuse"
            pytest.skip(reason)  # not a service
        trigger = PostgresChangesWatcher(pg_dsn, "wk_never", tables=["t"], **FAST)
        with pytest.raises(PostgresChangesError, match="wal_level=logical"):
            await harness.run(trigger, assets=ASSET, timeout=10, watcher_name=NAME)

    def test_bad_parameters_are_refused_by_name(self, pg_logical: LogicalCluster) -> None:
        """Bad parameters raise TypeError or ValueError naming the parameter, never the
        password."""
        dsn = pg_logical.dsn
        with pytest.raises(ValueError, match="give a publication, or tables") as caught:
            PostgresChangesWatcher(dsn, "wk_s")
        with pytest.raises(ValueError, match="slot 'Bad-Slot' must be lower-case"):
            PostgresChangesWatcher(dsn, "Bad-Slot", "p")
        with pytest.raises(ValueError, match="dsn must start with 'postgresql://'") as bad_dsn:
            PostgresChangesWatcher(f"mysql://u:{PASSWORD}@h/db", "wk_s", "p")
        assert PASSWORD not in str(bad_dsn.value)
        with pytest.raises(ValueError, match="not a plain SQL identifier"):
            PostgresChangesWatcher(dsn, "wk_s", tables=["a;drop"])
        with pytest.raises(TypeError, match="tables must be a list"):
            PostgresChangesWatcher(dsn, "wk_s", tables="t")
        with pytest.raises(ValueError, match="batch_size must be at least 1"):
            PostgresChangesWatcher(dsn, "wk_s", "p", batch_size=0)
        with pytest.raises(TypeError):
            PostgresChangesWatcher(dsn, "wk_s", "p", 5)
        assert "give a publication" in str(caught.value)
        trigger = PostgresChangesWatcher(dsn, "wk_s", tables=["public.t"])
        assert PASSWORD not in repr(trigger)
        assert trigger.serialize()[1]["tables"] == ["public.t"]


class TestUnreachable:
    async def test_a_server_that_goes_down_is_backing_off_then_recovers(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """While the server is down the watcher reports why (backing off, the password masked)
        and retries; once it is back, it reads on: nothing lost, nothing twice."""
        await start_slot(pg_logical, harness, table)
        await db.execute(f"INSERT INTO {table} (id) VALUES (1)")
        await db.close()
        trigger = watcher(pg_logical, table)
        reports: list[str | None] = []
        trigger.bind_source_status(reports.append)
        first = await harness.run(trigger, assets=ASSET, max_events=1, watcher_name=NAME)
        assert [p["new"]["id"] for p in first.payloads] == [1]
        await anyio.to_thread.run_sync(pg_logical.stop)
        try:
            with structlog.testing.capture_logs() as logs:
                down = await harness.run(trigger, assets=ASSET, timeout=3, watcher_name=NAME)
        finally:
            await anyio.to_thread.run_sync(pg_logical.start)
        assert down.payloads == []
        retries = [r for r in logs if r["event"] == "postgres_changes_reconnecting"]
        assert retries and all(PASSWORD not in str(r) for r in retries)
        reason = retries[0]["reason"]
        assert "connecting to 'postgresql://postgres:***@127.0.0.1:" in reason
        async with connected(pg_logical.dsn) as conn:
            await conn.execute(f"INSERT INTO {table} (id) VALUES (2)")
        after = await harness.run(trigger, assets=ASSET, max_events=1, watcher_name=NAME)
        assert [p["new"]["id"] for p in after.all_payloads] == [1, 2]

    async def test_backing_off_is_reported_and_cleared(
        self, pg_logical: LogicalCluster, db: asyncpg.Connection, table: str
    ) -> None:
        """The watcher's status turns backing_off with the reason while the server is down,
        and running again (None) once it answers."""
        trigger = watcher(pg_logical, table)
        reports: list[str | None] = []
        down, up = anyio.Event(), anyio.Event()

        def report(trouble: str | None) -> None:
            reports.append(trouble)
            (down if trouble is not None else up).set()

        trigger.bind_source_status(report)
        trigger.bind_asset_state_store(await memory_store())
        trigger.bind_watcher_name(NAME)
        await db.close()
        await anyio.to_thread.run_sync(pg_logical.stop)
        restarted = False
        try:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:

                    async def drive() -> None:
                        async for _ in trigger.run():
                            pass

                    tg.start_soon(drive)
                    await down.wait()
                    await anyio.to_thread.run_sync(pg_logical.start)
                    restarted = True
                    await up.wait()
                    tg.cancel_scope.cancel()
        finally:
            if not restarted:
                await anyio.to_thread.run_sync(pg_logical.start)
            await trigger.cleanup()
        assert reports[0] is not None and "connecting to" in reports[0]
        assert PASSWORD not in reports[0]
        assert reports[-1] is None

    async def test_a_silent_connection_is_dropped_and_the_watcher_reads_on(
        self,
        pg_logical: LogicalCluster,
        db: asyncpg.Connection,
        table: str,
        harness: WatcherHarness,
    ) -> None:
        """A connection that goes silent (every byte dropped, the socket kept open) fails the
        next statement within ``timeout``; the watcher reports it, reconnects and emits the
        rest: each row once."""
        await start_slot(pg_logical, harness, table)
        await db.execute(f"INSERT INTO {table} (id) VALUES (1)")
        async with open_proxy(pg_logical.port) as proxy:
            dsn = pg_logical.dsn.replace(f"127.0.0.1:{pg_logical.port}", proxy.dsn_host)
            trigger = PostgresChangesWatcher(
                dsn, f"wk_{table}", tables=[table], poll_interval=0.1, timeout=2.0
            )

            async def hole_then_insert() -> None:
                assert proxy.black_hole() == 1
                await db.execute(f"INSERT INTO {table} (id) VALUES (2)")

            with structlog.testing.capture_logs() as logs:
                run = await run_through_a_break(
                    harness,
                    trigger,
                    hole_then_insert,
                    asset=ASSET,
                    watcher_name=NAME,
                    after=1,
                    events=2,
                )
        assert [p["new"]["id"] for p in run.all_payloads] == [1, 2]
        retries = [r["reason"] for r in logs if r["event"] == "postgres_changes_reconnecting"]
        assert retries and "no answer within 2 s" in retries[0]
        assert proxy.accepted >= 2
