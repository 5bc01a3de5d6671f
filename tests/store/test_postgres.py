"""PostgresStateBackend against the real server: migrations, group commit, events, GC, errors.

The shared semantics are covered by the contract suite; these tests cover what only this
backend has: schemas and migrations, several instances on one database, the group-commit
writer and how it isolates a failing write, and the translation of driver errors.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from watchkeeper.store import (
    NEVER_EXPIRE,
    Asset,
    AssetNotFoundError,
    AssetScope,
    BackendUnavailableError,
    InvalidValueError,
    PostgresStateBackend,
    StoreClosedError,
    TaskScope,
    VersionConflictError,
)
from watchkeeper.store.postgres.schema import POSTGRES_MIGRATIONS
from watchkeeper.store.protocols import EventBatchCommit, EventCommit, TriggerStatus, Writer

VERSIONS = sorted(step[0] for step in POSTGRES_MIGRATIONS.steps)
"""Every migration's version, as a new schema records them."""
TASK = TaskScope("dag", "run", "task")
_WAITING_ON_ME = (
    "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid' "
    "AND transactionid = pg_current_xact_id()::xid"
)
"""Sessions waiting for the asking session's open transaction (to commit or roll back)."""
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def store(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStateBackend]:
    """An open backend on a fresh schema."""
    async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
        yield backend


async def _outcome(fn: Callable[[], Awaitable[Any]]) -> Any:
    """The result of ``fn()``, or the exception it raised."""
    try:
        return await fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects whichever error it was
        return exc


async def _in_one_batch(
    store: PostgresStateBackend,
    dsn: str,
    schema: str,
    calls: dict[str, Callable[[], Any]],
    *,
    when_queued: Callable[[], object] = lambda: None,
) -> tuple[dict[str, Any], int]:
    """Run ``calls`` concurrently so that they all land in one writer batch.

    The writer is held inside a first batch (its row is locked from another connection) until
    every call is queued; ``when_queued`` runs then, and the writer is released: the queued
    calls form the next batch. Returns the outcomes and the number of transactions committed.
    """
    gate = TaskScope("gate", "run", "task")
    await store.aset(gate, "gate", 0)
    results: dict[str, Any] = {}
    conn = await asyncpg.connect(dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(
            f'SELECT 1 FROM "{schema}".task_state WHERE dag_id = $1 FOR UPDATE', "gate"
        )
        before = store.commit_stats.batches
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.aset, gate, "gate", 1)
            with anyio.fail_after(10):
                blocked = (
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
                )
                # The server's lock table has no event to wait on: poll it, bounded above.
                while not await conn.fetchval(blocked, conn.get_server_pid()):  # noqa: ASYNC110
                    await anyio.sleep(0.01)

            async def run(name: str, fn: Callable[[], Any]) -> None:
                results[name] = await _outcome(fn)

            for name, fn in calls.items():
                tg.start_soon(run, name, fn)
            await anyio.wait_all_tasks_blocked()
            when_queued()
            await tx.rollback()
    finally:
        await conn.close()
    return results, store.commit_stats.batches - before


def _run_pytest(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """This suite's own pytest, in a subprocess whose test server is ``dsn``."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["WATCHKEEPER_TEST_PG_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parents[2],
        env=env,
        timeout=120,
    )


class TestTheTestServer:
    """WATCHKEEPER_TEST_PG_DSN names the server: the probe and the tests take it from there."""

    def test_the_probe_checks_the_configured_server(self) -> None:
        """A DSN naming a port where nothing listens skips the PostgreSQL tests, naming that
        host and port (the probe used to check 127.0.0.1:5432 whatever the DSN said)."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        done = _run_pytest(
            f"postgresql://postgres@127.0.0.1:{port}/test",
            f"{__file__}::TestConstruction::test_repr_shows_where_and_pool_but_never_the_password",
        )
        assert "1 skipped" in done.stdout, done.stdout + done.stderr
        assert f"not reachable on 127.0.0.1:{port}" in done.stdout

    def test_the_tests_use_the_configured_database(self, pg_dsn: str) -> None:
        """Against another database of the same server (``postgres``), the tests that name
        the database expect that one, not a hard-coded ``test``."""
        url = urllib.parse.urlsplit(pg_dsn)
        other = urllib.parse.urlunsplit(url._replace(path="/postgres"))
        done = _run_pytest(
            other,
            f"{__file__}::TestConstruction::test_repr_shows_where_and_pool_but_never_the_password",
        )
        assert "1 passed" in done.stdout, done.stdout + done.stderr


class TestConstruction:
    """Arguments, repr and the lazy driver import."""

    @pytest.mark.parametrize("schema", ["", "1abc", "a-b", 'x"; DROP TABLE t; --', "a" * 64])
    def test_rejects_a_schema_that_is_not_a_plain_identifier(self, schema: str) -> None:
        """A schema name that is not a plain identifier is a ValueError naming it."""
        with pytest.raises(ValueError, match="not a plain identifier"):
            PostgresStateBackend("postgresql://h/db", schema=schema)

    def test_rejects_min_size_above_max_size(self) -> None:
        """min_size greater than max_size is a ValueError naming both."""
        with pytest.raises(ValueError, match=r"min_size \(5\) must not exceed max_size \(2\)"):
            PostgresStateBackend("postgresql://h/db", min_size=5, max_size=2)

    async def test_repr_shows_where_and_pool_but_never_the_password(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """The repr names host, database, schema and pool size, and hides the password."""
        dsn = pg_dsn.replace("postgres@", "postgres:s3cret-pw@")
        backend = PostgresStateBackend(dsn, schema=pg_schema, max_size=3)
        assert "s3cret" not in repr(backend)
        async with backend:
            text = repr(backend)
        url = urllib.parse.urlsplit(pg_dsn)  # the test server's, from WATCHKEEPER_TEST_PG_DSN
        assert f"host={url.hostname}:{url.port or 5432}" in text
        assert f"db={url.path.lstrip('/')}" in text
        assert f"schema={pg_schema}" in text and "pool=1/3" in text and "open=True" in text
        assert "s3cret" not in text

    def test_repr_of_a_keyword_dsn_does_not_echo_it(self) -> None:
        """A DSN that is not a URL (it may carry a password) is not shown in the repr."""
        backend = PostgresStateBackend("host=db password=s3cret dbname=x")
        assert "s3cret" not in repr(backend) and "not a postgresql:// URL" in repr(backend)

    def test_importing_the_store_does_not_import_asyncpg(self) -> None:
        """``import watchkeeper.store`` works without loading the PostgreSQL driver."""
        code = "import sys, watchkeeper.store as s; s.PostgresStateBackend; print('asyncpg' in sys.modules)"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "False"


class TestLifecycle:
    """Migrations, opening, closing, and unreachable or lost servers."""

    async def test_migrations_are_recorded_and_not_applied_twice(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """The first open applies and records every migration; later opens apply none."""
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as first:
            assert first.applied_migrations == VERSIONS
            assert await first.amigrate() == []
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as second:
            assert second.applied_migrations == []
        conn = await asyncpg.connect(pg_dsn)
        try:
            rows = await conn.fetch(
                f'SELECT version FROM "{pg_schema}".schema_migrations ORDER BY 1'
            )
        finally:
            await conn.close()
        assert [r[0] for r in rows] == VERSIONS

    async def test_a_version_4_schema_gets_the_event_retention_index(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """A schema from before event retention (version 4) is upgraded by migration 5 alone
        and keeps its events."""
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("orders")])
            await backend.events.acommit(EventCommit("w", ("orders",), "1", dedup_key="m1"))
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(f'DROP INDEX "{pg_schema}".asset_events_created')
            await conn.execute(f'DELETE FROM "{pg_schema}".schema_migrations WHERE version = 5')
            async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
                assert backend.applied_migrations == [5]
                assert [e.dedup_key for e in await backend.events.alist_events()] == ["m1"]
            indexes = await conn.fetch(
                "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = $2",
                pg_schema,
                "asset_events",
            )
        finally:
            await conn.close()
        assert "asset_events_created" in {r[0] for r in indexes}

    async def test_migration_11_drops_the_asset_references_and_keeps_the_events(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """A version-10 schema (events and state referencing assets, a B-tree on created_at)
        is upgraded by migration 11 alone: no foreign key left on either table, a BRIN index
        on created_at, every event and state row kept, and commits and the GC still work."""
        p = f'"{pg_schema}".'
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("orders")])
            await backend.events.acommit(
                EventCommit("w", ("orders",), "1", dedup_key="m1", state={"wm": "1"})
            )
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(f"DROP INDEX {p}asset_events_created")
            await conn.execute(f"CREATE INDEX asset_events_created ON {p}asset_events (created_at)")
            for table in ("asset_events", "asset_state"):
                await conn.execute(
                    f"ALTER TABLE {p}{table} ADD CONSTRAINT {table}_asset_id_fkey "
                    f"FOREIGN KEY (asset_id) REFERENCES {p}assets (id)"
                )
            await conn.execute(f"DELETE FROM {p}schema_migrations WHERE version = 11")
            async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
                assert backend.applied_migrations == [11]
                await backend.events.acommit(
                    EventCommit("w", ("orders",), "2", dedup_key="m2", state={"wm": "2"})
                )
                assert [e.dedup_key for e in await backend.events.alist_events()] == ["m1", "m2"]
                assert await backend.aget(AssetScope(name="orders"), "wm") == 2
            foreign = await conn.fetchval(
                "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
                "WHERE n.nspname = $1 AND c.contype = 'f' "
                "AND c.conrelid::regclass::text LIKE '%asset_%'",
                pg_schema,
            )
            method = await conn.fetchval(
                "SELECT am.amname FROM pg_class i JOIN pg_am am ON am.oid = i.relam "
                "JOIN pg_namespace n ON n.oid = i.relnamespace "
                "WHERE n.nspname = $1 AND i.relname = 'asset_events_created'",
                pg_schema,
            )
        finally:
            await conn.close()
        assert (foreign, method) == (0, "brin")

    async def test_payload_texts_are_stored_as_given(self, pg_dsn: str, pg_schema: str) -> None:
        """A payload's JSON text travels inside the round's document as it is and is stored
        byte for byte (spacing, escapes, a JSON null, the NUL escape the server's JSON
        functions refuse to take apart), single or in a batch."""
        texts = ['{"n": 5,  "x":"\\u00e9\\""}', "null", "[1, 2]", '"s"', '{"z":"\\u0000"}']
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("orders"), Asset("bills")])
            for text in texts:
                await backend.events.acommit(EventCommit("w", ("orders",), text))
            await backend.events.acommit_batch(
                EventBatchCommit("w", ("bills", "orders"), tuple((t, None) for t in texts))
            )
            listed = await backend.events.alist_events()
            raw = await backend.events.alist_events(raw=True)
        conn = await asyncpg.connect(pg_dsn)
        try:
            stored = [r[0] for r in await conn.fetch(
                f'SELECT payload FROM "{pg_schema}".asset_events ORDER BY id'
            )]  # fmt: skip
        finally:
            await conn.close()
        assert stored == texts + [t for t in texts for _ in range(2)]
        assert [e.payload for e in listed[:5]] == [json.loads(t) for t in texts]
        assert [json.loads(r)["payload"] for _, r in raw[:5]] == [json.loads(t) for t in texts]

    async def test_two_backends_opening_a_fresh_schema_at_once_both_work(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """Concurrent opens serialise on the advisory lock: one migrates, both then work."""
        backends = [PostgresStateBackend(pg_dsn, schema=pg_schema) for _ in range(3)]
        opened = [anyio.Event() for _ in backends]
        done = anyio.Event()

        async def serve(backend: PostgresStateBackend, ready: anyio.Event) -> None:
            async with backend:
                ready.set()
                await done.wait()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for backend, ready in zip(backends, opened, strict=True):
                    tg.start_soon(serve, backend, ready)
                for ready in opened:
                    await ready.wait()
                applied = sorted(b.applied_migrations for b in backends)
                assert applied == [[], [], VERSIONS]
                await backends[0].aset(TASK, "k", 1)
                assert await backends[2].aget(TASK, "k") == 1
                done.set()

    async def test_a_schema_that_does_not_exist_is_created(self, pg_dsn: str) -> None:
        """Opening with a schema that is missing creates it."""
        schema = f"wk_test_{uuid.uuid4().hex[:12]}"
        try:
            async with PostgresStateBackend(pg_dsn, schema=schema) as backend:
                assert await backend.aset(TASK, "k", 1) == 1
        finally:
            conn = await asyncpg.connect(pg_dsn)
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

    async def test_a_newer_schema_version_is_refused(self, pg_dsn: str, pg_schema: str) -> None:
        """A database migrated by a newer watchkeeper is refused with BackendUnavailableError."""
        async with PostgresStateBackend(pg_dsn, schema=pg_schema):
            pass
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(
                f"INSERT INTO \"{pg_schema}\".schema_migrations (version, name) VALUES (99, 'x')"
            )
        finally:
            await conn.close()
        with pytest.raises(BackendUnavailableError, match="schema version 99"):
            async with PostgresStateBackend(pg_dsn, schema=pg_schema):
                pass

    async def test_an_unreachable_server_is_backend_unavailable(self) -> None:
        """Opening against a closed port raises BackendUnavailableError with the cause chained."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        backend = PostgresStateBackend(f"postgresql://postgres:pw@127.0.0.1:{port}/test")
        with pytest.raises(BackendUnavailableError) as info:
            async with backend:
                pass
        assert info.value.__cause__ is not None
        assert f"127.0.0.1:{port}" in str(info.value) and "pw" not in str(info.value)
        assert not backend.is_open

    async def test_a_closed_backend_raises_store_closed(self, pg_dsn: str, pg_schema: str) -> None:
        """Every call before opening and after closing raises StoreClosedError."""
        backend = PostgresStateBackend(pg_dsn, schema=pg_schema)
        with pytest.raises(StoreClosedError):
            await backend.aget(TASK, "k")
        async with backend:
            await backend.aset(TASK, "k", 1)
        for call in (
            lambda: backend.aget(TASK, "k"),
            lambda: backend.aset(TASK, "k", 2),
            lambda: backend.events.alist_events(),
            lambda: backend.events.acommit(EventCommit("w", ("a",), "1")),
            lambda: backend.gc.acollect_garbage(),
        ):
            with pytest.raises(StoreClosedError):
                await call()

    async def test_reads_and_writes_survive_the_server_dropping_the_connections(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """After the server kills every connection of the backend, reads and writes reconnect."""
        tag = f"wk-{uuid.uuid4().hex[:12]}"
        dsn = f"{pg_dsn}?application_name={tag}"
        async with PostgresStateBackend(dsn, schema=pg_schema, min_size=2) as store:
            await store.aset(TASK, "k", 1)
            assert await store.aget(TASK, "k") == 1
            conn = await asyncpg.connect(pg_dsn)
            try:
                killed = await conn.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = $1",
                    tag,
                )
            finally:
                await conn.close()
            assert killed == 3  # the writer's connection and both pooled ones
            assert await store.aset(TASK, "k", 2) == 2
            assert await store.aget(TASK, "k") == 2
            assert await store.aget(TASK, "k") == 2


class TestState:
    """Values, metadata and visibility across instances."""

    async def test_json_text_round_trips_byte_for_byte(self, store: PostgresStateBackend) -> None:
        """The stored JSON text comes back exactly, key order and spacing included."""
        text = '{"z":1,"a":[1,2,{"é":"\\u0000"}],"m":1.5e300}'
        await store.aput_json(TASK, "k", text)
        raw = await store.aget_raw(TASK, "k")
        assert raw is not None and raw.value_json == text

    async def test_keys_sort_by_code_point(self, store: PostgresStateBackend) -> None:
        """Keys list in code-point order (as Python sorts them), whatever the server's locale."""
        keys = ["a", "a b", "aé", "a~", "é", "\U0001f642", "b", "B", "\u0085x"]
        for i, key in enumerate(keys):
            await store.aset(TASK, key, i)
        assert [e.key for e in await store.alist(TASK)] == sorted(keys)
        assert [await store.aget(TASK, k) for k in keys] == list(range(len(keys)))

    async def test_metadata_uses_the_backend_clock_and_writer(
        self, store: PostgresStateBackend
    ) -> None:
        """updated_at comes from backend.clock, expiry from it plus the retention, writer as given."""
        store.clock = lambda: T0
        writer = Writer("task", "dag.task", 3)
        await store.aset(TASK, "k", 1, retention=timedelta(hours=1), writer=writer)
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None
        assert (entry.updated_at, entry.expires_at, entry.writer) == (
            T0,
            T0 + timedelta(hours=1),
            writer,
        )
        await store.aset(TASK, "n", 1, retention=NEVER_EXPIRE)
        never = await store.aget_entry(TASK, "n")
        assert never is not None and never.never_expire and never.writer is None

    async def test_a_second_instance_sees_every_write(
        self, store: PostgresStateBackend, pg_dsn: str, pg_schema: str
    ) -> None:
        """A second backend on the same schema (another daemon) reads what the first wrote."""
        await store.events.aregister_assets([Asset("orders", uri="s3://b/orders")])
        await store.aset(TASK, "k", {"x": 1})
        await store.aset(AssetScope(name="orders"), "wm", 41)
        await store.events.acommit(EventCommit("w", ("orders",), '{"n":1}', state={"wm": "42"}))
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as other:
            assert await other.aget(TASK, "k") == {"x": 1}
            assert await other.aget(AssetScope(uri="s3://b/orders"), "wm") == 42
            assert [e.payload for e in await other.events.alist_events()] == [{"n": 1}]
            assert [a.name for a in await other.events.alist_assets()] == ["orders"]

    async def test_an_inactive_asset_is_not_found(self, store: PostgresStateBackend) -> None:
        """Reads and writes of a deactivated asset raise AssetNotFoundError."""
        await store.events.aregister_assets([Asset("a")])
        await store.aset(AssetScope(name="a"), "k", 1)
        assert await store.events.adeactivate_asset("a") is True
        assert await store.events.adeactivate_asset("a") is False
        with pytest.raises(AssetNotFoundError):
            await store.aget(AssetScope(name="a"), "k")
        with pytest.raises(AssetNotFoundError):
            await store.aset(AssetScope(name="a"), "k", 2)

    def test_the_sync_api_works_on_a_private_loop(self, pg_dsn: str) -> None:
        """Opened with ``with``, the sync methods run against PostgreSQL from plain code."""
        schema = f"wk_test_{uuid.uuid4().hex[:12]}"
        try:
            with PostgresStateBackend(pg_dsn, schema=schema) as backend:
                assert backend.set(TASK, "k", [1, 2]) == 1
                assert backend.get(TASK, "k") == [1, 2]
                assert [e.key for e in backend.list(TASK)] == ["k"]
        finally:

            async def drop() -> None:
                conn = await asyncpg.connect(pg_dsn)
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                await conn.close()

            anyio.run(drop, backend="asyncio")


class TestGroupCommit:
    """Concurrent writes share transactions, and each stays atomic on its own."""

    async def test_a_thousand_concurrent_writes_all_land_in_few_transactions(
        self, store: PostgresStateBackend
    ) -> None:
        """1000 concurrent asets each return version 1, all are stored, in far fewer commits."""
        versions: list[int] = []

        async def put(i: int) -> None:
            versions.append(await store.aset(TaskScope("d", "r", f"t{i}"), "k", i))

        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(put, i)
        assert versions == [1] * 1000
        assert store.commit_stats.batches < 100
        assert await store.aget(TaskScope("d", "r", "t999"), "k") == 999

    async def test_concurrent_writes_to_one_key_get_distinct_versions(
        self, store: PostgresStateBackend, pg_dsn: str, pg_schema: str
    ) -> None:
        """Writes to the same key in one batch are applied one after another."""
        calls: dict[str, Callable[[], Any]] = {
            str(i): functools.partial(store.aset, TASK, "same", i) for i in range(50)
        }
        results, batches = await _in_one_batch(store, pg_dsn, pg_schema, calls)
        assert batches == 2
        assert sorted(results.values()) == list(range(1, 51))
        entry = await store.aget_entry(TASK, "same")
        assert entry is not None and entry.version == 50

    async def test_a_failing_write_in_a_batch_fails_alone(
        self, store: PostgresStateBackend, pg_dsn: str, pg_schema: str
    ) -> None:
        """A CAS conflict and an unknown asset fail only their own callers within one batch."""
        await store.events.aregister_assets([Asset("a")])
        await store.aset(TASK, "cas", "v1")
        calls: dict[str, Callable[[], Any]] = {
            f"put{i}": functools.partial(store.aset, TASK, f"p{i}", i) for i in range(20)
        }
        calls["bad_cas"] = lambda: store.aset(TASK, "cas", "no", expected_version=7)
        calls["good_cas"] = lambda: store.aset(TASK, "new", "yes", expected_version=0)
        calls["missing"] = lambda: store.aset(AssetScope(name="nope"), "k", 1)
        calls["asset"] = lambda: store.aset(AssetScope(name="a"), "k", 1)
        calls["event"] = lambda: store.events.acommit(
            EventCommit("w", ("a",), "1", state={"e": "2"})
        )
        results, batches = await _in_one_batch(store, pg_dsn, pg_schema, calls)
        assert batches == 2
        assert isinstance(results.pop("bad_cas"), VersionConflictError)
        assert isinstance(results.pop("missing"), AssetNotFoundError)
        assert [e.asset for e in results.pop("event")] == ["a"]
        assert results == {**{f"put{i}": 1 for i in range(20)}, "good_cas": 1, "asset": 1}
        assert await store.aget(TASK, "cas") == "v1"
        assert await store.aget(AssetScope(name="a"), "e") == 2

    async def test_data_the_server_refuses_fails_only_its_own_write(
        self, store: PostgresStateBackend, pg_dsn: str, pg_schema: str
    ) -> None:
        """A row the server refuses (a data exception, from a trigger here) fails that write
        alone, as InvalidValueError; the batch is replayed."""
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(
                f"""
                CREATE FUNCTION "{pg_schema}".poison() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.key = 'poison' THEN
                        RAISE EXCEPTION 'poisoned key' USING ERRCODE = 'data_exception';
                    END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER poison BEFORE INSERT ON "{pg_schema}".task_state
                FOR EACH ROW EXECUTE FUNCTION "{pg_schema}".poison();
                """
            )
        finally:
            await conn.close()
        calls: dict[str, Callable[[], Any]] = {
            f"ok{i}": functools.partial(store.aset, TASK, f"k{i}", i) for i in range(10)
        }
        calls["poison"] = lambda: store.aset(TaskScope("dag", "r", "t"), "poison", 1)
        results, _ = await _in_one_batch(store, pg_dsn, pg_schema, calls)
        assert isinstance(results.pop("poison"), InvalidValueError)
        assert results == {f"ok{i}": 1 for i in range(10)}
        assert len(await store.alist(TASK)) == 10

    async def test_a_caller_cancelled_while_queued_does_not_disturb_the_writer(
        self, store: PostgresStateBackend, pg_dsn: str, pg_schema: str
    ) -> None:
        """Cancelling a queued write leaves the writer and the other writes unharmed."""
        scope = anyio.CancelScope()

        async def abandoned() -> str:
            with scope:
                await store.aset(TASK, "abandoned", 1)
            return "cancelled" if scope.cancelled_caught else "finished"

        calls = {"abandoned": abandoned, "other": lambda: store.aset(TASK, "other", 1)}
        results, batches = await _in_one_batch(
            store, pg_dsn, pg_schema, calls, when_queued=scope.cancel
        )
        assert results == {"abandoned": "cancelled", "other": 1}
        assert batches == 2
        assert await store.aset(TASK, "after", 1) == 1
        # The cancelled caller's write was already queued: it is not withdrawn, and committed.
        assert await store.aget(TASK, "abandoned") == 1


class TestEvents:
    """acommit_event and alist_events."""

    async def test_a_duplicate_dedup_key_writes_neither_event_nor_state(
        self, store: PostgresStateBackend
    ) -> None:
        """A redelivered event is suppressed per asset, and its state does not move."""
        await store.events.aregister_assets([Asset("a"), Asset("b")])
        first = await store.events.acommit(
            EventCommit("w", ("a",), '{"m":1}', dedup_key="m1", state={"wm": "1"})
        )
        again = await store.events.acommit(
            EventCommit("w", ("a", "b"), '{"m":1}', dedup_key="m1", state={"wm": "0"})
        )
        assert [e.asset for e in first] == ["a"] and [e.asset for e in again] == ["b"]
        assert await store.aget(AssetScope(name="a"), "wm") == 1
        assert await store.aget(AssetScope(name="b"), "wm") == 0
        assert [e.id for e in await store.events.alist_events()] == [first[0].id, again[0].id]

    async def test_a_dedup_key_inserted_by_an_open_transaction_suppresses_the_commit(
        self, store: PostgresStateBackend, pg_dsn: str, pg_schema: str
    ) -> None:
        """A commit whose dedup key another transaction has inserted but not yet committed
        waits for it, then returns no event and writes no state (the duplicate check cannot
        see an uncommitted row: only the insert's conflict handling catches it)."""
        await store.events.aregister_assets([Asset("a")])
        other = await asyncpg.connect(pg_dsn)
        try:
            asset_id = await other.fetchval(
                f'SELECT id FROM "{pg_schema}".assets WHERE name = $1', "a"
            )
            tx = other.transaction()
            await tx.start()
            await other.execute(
                f'INSERT INTO "{pg_schema}".asset_events '
                "(asset_id, asset_name, watcher, payload, dedup_key, created_at) "
                "VALUES ($1, 'a', 'elsewhere', '1', 'k', now())",
                asset_id,
            )
            commit = EventCommit("w", ("a",), "2", dedup_key="k", state={"wm": "9"})
            result: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def racing() -> None:
                    result.append(await _outcome(lambda: store.events.acommit(commit)))

                tg.start_soon(racing)
                with anyio.fail_after(10):  # the commit waits on the open insert's index entry
                    while not await other.fetchval(_WAITING_ON_ME):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                await tx.commit()
        finally:
            await other.close()
        assert result == [[]], result
        assert await store.aget(AssetScope(name="a"), "wm") is None
        assert [e.watcher for e in await store.events.alist_events()] == ["elsewhere"]

    async def test_an_unknown_asset_makes_the_whole_commit_fail(
        self, store: PostgresStateBackend
    ) -> None:
        """A commit naming an unregistered asset writes nothing for any of its assets."""
        await store.events.aregister_assets([Asset("a")])
        with pytest.raises(AssetNotFoundError, match="ghost"):
            await store.events.acommit(EventCommit("w", ("a", "ghost"), "1", state={"wm": "5"}))
        assert await store.events.alist_events() == []
        assert await store.aget(AssetScope(name="a"), "wm") is None

    async def test_concurrent_commits_get_ordered_ids_and_state_versions(
        self, store: PostgresStateBackend
    ) -> None:
        """Many watchers committing at once each get their event, ids in commit order."""
        await store.events.aregister_assets([Asset("a"), Asset("b")])
        written: list[int] = []

        async def commit(i: int) -> None:
            events = await store.events.acommit(
                EventCommit("w", ("a", "b"), str(i), dedup_key=f"d{i}", state={"n": str(i)})
            )
            assert [e.asset for e in events] == ["a", "b"] and events[0].id < events[1].id
            written.extend(e.id for e in events)

        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(commit, i)
        listed = await store.events.alist_events()
        assert [e.id for e in listed] == sorted(written) and len(set(written)) == 200
        entry = await store.aget_entry(AssetScope(name="b"), "n")
        assert entry is not None and entry.version == 100

    async def test_listing_filters_by_asset_since_and_limit(
        self, store: PostgresStateBackend
    ) -> None:
        """alist_events honours asset, since_id and limit, in id order."""
        await store.events.aregister_assets([Asset("a"), Asset("b")])
        for i in range(4):
            await store.events.acommit(EventCommit("w", ("a" if i % 2 else "b",), str(i)))
        events = await store.events.alist_events()
        assert [e.payload for e in events] == [0, 1, 2, 3]
        assert [e.payload for e in await store.events.alist_events(asset="a")] == [1, 3]
        assert [
            e.payload for e in await store.events.alist_events(since_id=events[1].id, limit=1)
        ] == [2]


class TestGarbageCollection:
    """acollect_garbage: expired, retention and orphaned rows, batched and dry."""

    async def _seed(self, store: PostgresStateBackend) -> None:
        store.clock = lambda: T0
        await store.aset(TASK, "expired", 1, retention=timedelta(hours=1))
        await store.aset(TASK, "kept", 1, retention=timedelta(days=365))
        await store.aset(TASK, "never", 1, retention=NEVER_EXPIRE)
        for i in range(5):
            await store.aset(TaskScope("d", "r", "t", i), "old", i)
        await store.events.aregister_assets([Asset("gone"), Asset("live")])
        for scope in (AssetScope(name="gone"), AssetScope(name="live")):
            await store.aset(scope, "wm", 1)
        await store.events.adeactivate_asset("gone")

    async def test_collects_each_kind_and_spares_the_rest(
        self, store: PostgresStateBackend
    ) -> None:
        """Expired, stale and orphaned rows go; NEVER_EXPIRE, fresh and active rows stay."""
        await self._seed(store)
        report = await store.gc.acollect_garbage(
            default_retention_days=30, now=T0 + timedelta(days=40)
        )
        assert report.expired == [(TASK, "expired")]
        assert sorted(s.map_index for s, _ in report.retention) == [0, 1, 2, 3, 4]
        assert report.orphaned == [("gone", "wm")]
        assert [e.key for e in await store.alist(TASK)] == ["kept", "never"]
        assert await store.aget(AssetScope(name="live"), "wm") == 1

    async def test_batches_delete_everything_in_several_statements(
        self, store: PostgresStateBackend
    ) -> None:
        """With batch_size 2 every row is still collected, over several transactions."""
        await self._seed(store)
        before = store.commit_stats.batches
        report = await store.gc.acollect_garbage(
            default_retention_days=30, batch_size=2, now=T0 + timedelta(days=40)
        )
        assert (len(report.expired), len(report.retention), len(report.orphaned)) == (1, 5, 1)
        assert store.commit_stats.batches - before >= 5
        again = await store.gc.acollect_garbage(
            default_retention_days=30, now=T0 + timedelta(days=40)
        )
        assert again.total == 0

    async def test_dry_run_reports_and_changes_nothing(self, store: PostgresStateBackend) -> None:
        """A dry run reports what a real run would delete, and deletes nothing."""
        await self._seed(store)
        now = T0 + timedelta(days=40)
        dry = await store.gc.acollect_garbage(dry_run=True, now=now)
        assert dry.dry_run and dry.total == 7
        real = await store.gc.acollect_garbage(now=now)
        assert (real.expired, real.retention, real.orphaned) == (
            dry.expired,
            dry.retention,
            dry.orphaned,
        )

    async def test_zero_retention_days_keeps_rows_without_retention(
        self, store: PostgresStateBackend
    ) -> None:
        """default_retention_days=0 disables the age rule; expiry still applies."""
        await self._seed(store)
        report = await store.gc.acollect_garbage(
            default_retention_days=0, now=T0 + timedelta(days=999)
        )
        assert report.retention == [] and len(report.expired) == 2


class TestTriggerStatus:
    """The daemon's status rows."""

    async def test_save_list_and_delete(self, store: PostgresStateBackend) -> None:
        """Saved statuses list back equal, ordered by trigger id, and can be deleted."""
        b = TriggerStatus("b", "m.C", ("x", "y"), ("w",), "running", events=3, updated_at=T0)
        a = TriggerStatus("a", "m.C", ("x",), (), "failed", failures=2, last_error="boom")
        await store.status.asave_trigger_status([b, a])
        assert await store.status.alist_trigger_status() == [a, b]
        b2 = TriggerStatus("b", "m.C", ("x",), ("w",), "stopped", owner="host-1")
        await store.status.asave_trigger_status([b2])
        await store.status.adelete_trigger_status(["a", "missing"])
        assert await store.status.alist_trigger_status() == [b2]


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """``node`` and every node below it in an ``EXPLAIN (FORMAT JSON)`` plan."""
    found = [node]
    for child in node.get("Plans", ()):
        found.extend(_plan_nodes(child))
    return found


class TestRunCreation:
    """Creating runs from a backlog of events."""

    async def test_a_long_backlog_is_read_only_as_far_as_the_runs_created(
        self, store: PostgresStateBackend
    ) -> None:
        """The create-and-claim statement reads the events it takes, not the whole backlog
        behind them (it read all of them, 4 ms per 3,000, on each creation)."""
        from watchkeeper.store.postgres.runs import create_claim_sql
        from watchkeeper.store.protocols import TaskSpec

        await store.events.aregister_assets([Asset("a")])
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
        async with anyio.create_task_group() as tg:
            for i in range(2000):
                commit = EventCommit("w", ("a",), str(i))
                tg.start_soon(store.events.acommit, commit)
        sql = create_claim_sql(store._tasks._prefix, store._tasks._events_key)
        async with store._pool_or_closed().acquire() as conn:
            plan = await conn.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}",
                "t", None, 8, None, "owner", 2, timedelta(seconds=30),
            )  # fmt: skip
            created = await conn.fetchval(f"SELECT count(*) FROM {store._tasks._prefix}task_runs")
        read = [
            n["Actual Rows"] * n["Actual Loops"]
            for n in _plan_nodes(json.loads(plan)[0]["Plan"])
            if n.get("Relation Name") == "asset_events"
        ]
        assert created == 8
        assert read and max(read) <= 8, read
