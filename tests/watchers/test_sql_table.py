"""SqlTableWatcher against a real SQLite file and the real PostgreSQL server."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import math
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiomysql  # type: ignore[import-untyped] # no stubs published
import aiosqlite
import anyio
import asyncpg
import pytest
from watchkeeper.store import Asset, BaseStateBackend, MemoryStateBackend
from watchkeeper.triggerer.testing import run_trigger
from watchkeeper.watchers import DirectoryWatcher, SqlSourceError, SqlTableWatcher

from tests.support.runtime import Signalling, rebuilt

OpenBackend = Callable[[], contextlib.AbstractAsyncContextManager[BaseStateBackend]]
ASSET = Asset("orders")
NAME = "orders_feed"
WATERMARK = f"{NAME}.watermark"
RECENT = f"{NAME}.recent"
FAST: dict[str, Any] = {"poll_interval": 0.01}


@dataclass
class Table:
    """One watched table: its DSN and name, and a way to write rows into it."""

    dialect: str
    dsn: str
    name: str

    async def execute(self, sql: str, *params: Any) -> None:
        """Run one statement and commit it (placeholders: $1, $2, ...)."""
        await self.execute_many(sql, [params])

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement per parameter row, all in one committed transaction."""
        if self.dialect == "sqlite":
            for index in range(9, 0, -1):
                sql = sql.replace(f"${index}", "?")
            async with aiosqlite.connect(self.dsn.removeprefix("sqlite:///")) as lite:
                for params in rows:
                    await lite.execute(sql, tuple(params))
                await lite.commit()
        elif self.dialect == "mysql":
            for index in range(9, 0, -1):
                sql = sql.replace(f"${index}", "%s")
            my = await mysql_connect(self.dsn)
            try:
                async with my.cursor() as cursor:
                    for params in rows:
                        await cursor.execute(sql, tuple(params))
                await my.commit()
            finally:
                await my.ensure_closed()
        else:
            pg = await asyncpg.connect(self.dsn)
            try:
                async with pg.transaction():
                    for params in rows:
                        await pg.execute(sql, *params)
            finally:
                await pg.close()

    async def insert(self, *rows: tuple[int, int, str]) -> None:
        """Insert ``(id, seq, body)`` rows, all in one transaction."""
        await self.execute_many(
            f"INSERT INTO {self.name} (id, seq, body) VALUES ($1, $2, $3)", rows
        )

    def watcher(self, **kwargs: Any) -> SqlTableWatcher:
        arguments: dict[str, Any] = {
            "dsn": self.dsn,
            "table": self.name,
            "cursor_column": "seq",
            "key_column": "id",
            **FAST,
            **kwargs,
        }
        return SqlTableWatcher(**arguments)


async def mysql_connect(dsn: str) -> Any:
    """An aiomysql connection to the database of a ``mysql://`` DSN (no autocommit)."""
    parts = urlsplit(dsn)
    return await aiomysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username,
        password=parts.password or "",
        db=parts.path.lstrip("/"),
    )


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
async def table(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Table]:
    """An empty ``events(id, seq, body)`` table in a SQLite file, a fresh PostgreSQL schema or
    the MariaDB test database."""
    ddl = "CREATE TABLE {} (id INTEGER PRIMARY KEY, seq INTEGER, body TEXT)"
    if request.param == "sqlite":
        sqlite = Table("sqlite", f"sqlite:///{tmp_path / 'source.db'}", "events")
        await sqlite.execute(ddl.format(sqlite.name))
        yield sqlite
    elif request.param == "mysql":
        dsn = request.getfixturevalue("mysql_dsn")  # a sync fixture: skips when MariaDB is down
        mysql = Table("mysql", dsn, f"events_{uuid.uuid4().hex[:12]}")
        await mysql.execute(ddl.format(mysql.name))
        try:
            yield mysql
        finally:
            await mysql.execute(f"DROP TABLE {mysql.name}")
    else:
        dsn = request.getfixturevalue("pg_dsn")  # a sync fixture: skips when PostgreSQL is down
        schema = f"wk_watchers_{uuid.uuid4().hex[:12]}"
        postgres = Table("postgres", dsn, f"{schema}.events")
        await postgres.execute(f'CREATE SCHEMA "{schema}"')
        try:
            await postgres.execute(ddl.format(postgres.name))
            yield postgres
        finally:
            await postgres.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def backend() -> MemoryStateBackend:
    return MemoryStateBackend()


async def payloads(
    trigger: SqlTableWatcher,
    backend: BaseStateBackend,
    max_events: int | None,
    *,
    limit: float = 10.0,
    name: str = NAME,
) -> list[dict[str, Any]]:
    events = await run_trigger(
        trigger,
        assets=ASSET,
        backend=backend,
        max_events=max_events,
        timeout=limit,
        watcher_name=name,
    )
    return [event.payload for event in events]


async def ids(
    trigger: SqlTableWatcher, backend: BaseStateBackend, max_events: int, *, name: str = NAME
) -> list[int]:
    return [payload["id"] for payload in await payloads(trigger, backend, max_events, name=name)]


class SignallingWatcher(Signalling, SqlTableWatcher):
    """The SqlTableWatcher that signals its committed events (see :class:`Signalling`)."""


class TestSqlTableWatcherRows:
    async def test_rows_come_once_in_cursor_order_as_json(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """Every row is emitted once, ordered by (cursor, key), its payload the row as a dict."""
        await table.insert((3, 20, "c"), (1, 10, "a"), (2, 30, "b"))
        result = await payloads(table.watcher(), backend, 3)
        assert result == [
            {"id": 1, "seq": 10, "body": "a"},
            {"id": 3, "seq": 20, "body": "c"},
            {"id": 2, "seq": 30, "body": "b"},
        ]
        assert await backend.aget(ASSET.scope, WATERMARK) == {
            "kind": "int",
            "cursor": 30,
            "key": 2,
        }

    @pytest.mark.parametrize("batch_size", [1, 2, 3, 500])
    async def test_batches_split_runs_of_equal_cursors_without_loss(
        self, table: Table, backend: MemoryStateBackend, batch_size: int
    ) -> None:
        """Keyset batches of any size neither skip nor repeat rows that share a cursor value."""
        seqs = [1, 1, 1, 2, 2, 3, 3]
        await table.insert(*[(key, seq, f"r{key}") for key, seq in enumerate(seqs, start=1)])
        watcher = table.watcher(batch_size=batch_size)
        assert await ids(watcher, backend, 7) == [1, 2, 3, 4, 5, 6, 7]
        await table.insert((8, 3, "tie"), (9, 4, "sentinel"))
        assert await ids(rebuilt(watcher), backend, 2) == [8, 9]

    async def test_each_poll_commits_its_rows_as_one_batch(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """batch_size rows commit with one state write: 7 rows in batches of 3 are 3 writes."""
        await table.insert(*[(key, key, "x") for key in range(1, 8)])
        assert await ids(table.watcher(batch_size=3), backend, 7) == list(range(1, 8))
        entry = await backend.aget_entry(ASSET.scope, WATERMARK)
        assert entry is not None
        assert (entry.value["cursor"], entry.version) == (7, 3)

    async def test_a_restarted_watcher_resumes_after_the_stored_watermark(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """A new instance built from serialize() emits only the rows the first one did not;
        each poll's rows commit as one batch, so a stop never falls inside one."""
        await table.insert(*[(key, key, "x") for key in range(1, 6)])
        watcher = table.watcher(batch_size=2)
        assert await ids(watcher, backend, 3) == [1, 2, 3, 4]  # two batches of two
        assert await ids(rebuilt(watcher), backend, 1) == [5]
        await table.insert((6, 6, "x"))
        assert await ids(rebuilt(watcher), backend, 1) == [6]

    async def test_a_row_committed_out_of_order_is_emitted_once(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """A row whose cursor lies behind the watermark when it lands comes once, in the same run."""
        await table.insert((1, 1, "a"), (2, 2, "b"), (4, 4, "d"))
        watcher = SignallingWatcher(table.dsn, table.name, "seq", "id", lag_window=100, **FAST)
        watcher.signal_after = 3
        watcher.committed = anyio.Event()
        result: list[int] = []

        async def drive() -> None:
            result.extend(await ids(watcher, backend, 4))

        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            with anyio.fail_after(10):
                await watcher.committed.wait()
            await table.insert((3, 3, "late"))
        assert result == [1, 2, 4, 3]
        await table.insert((5, 5, "sentinel"))
        assert await ids(rebuilt(watcher), backend, 1) == [5]

    async def test_a_late_row_found_after_a_restart_is_emitted_once(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """The recent keys are part of the state, so a restart neither misses nor repeats."""
        await table.insert((1, 1, "a"), (4, 4, "d"))
        watcher = table.watcher(lag_window=100)
        assert await ids(watcher, backend, 2) == [1, 4]
        await table.insert((3, 3, "late"), (2, 2, "later"))
        assert await ids(rebuilt(watcher), backend, 2) == [2, 3]
        await table.insert((5, 5, "sentinel"))
        assert await ids(rebuilt(watcher), backend, 1) == [5]

    async def test_a_row_behind_the_lag_window_is_never_emitted(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """A row more than lag_window cursor units late is skipped, by design."""
        await table.insert((10, 10, "a"))
        watcher = table.watcher(lag_window=2)
        assert await ids(watcher, backend, 1) == [10]
        await table.insert((1, 1, "too late"), (9, 9, "in window"), (11, 11, "sentinel"))
        assert await ids(rebuilt(watcher), backend, 2) == [9, 11]

    async def test_zero_lag_still_catches_rows_sharing_the_watermark_cursor(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """With lag_window=0 a late row with the watermark's cursor and a lower key comes once."""
        await table.insert((10, 5, "a"))
        watcher = table.watcher(lag_window=0)
        assert await ids(watcher, backend, 1) == [10]
        await table.insert((3, 5, "same cursor"), (20, 4, "behind"), (30, 6, "sentinel"))
        assert await ids(rebuilt(watcher), backend, 2) == [3, 30]

    async def test_a_burst_past_the_recent_limit_shrinks_the_window(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """Over recent_limit keys, the oldest are forgotten and late rows at or below them skipped."""

        class SmallWatcher(SqlTableWatcher):
            recent_limit = 2

        await table.insert(*[(seq, seq, "x") for seq in (10, 20, 30, 40)])
        watcher = SmallWatcher(table.dsn, table.name, "seq", "id", lag_window=100, **FAST)
        assert await ids(watcher, backend, 4) == [10, 20, 30, 40]
        assert await backend.aget(ASSET.scope, RECENT) == {
            "floor": 20,
            "cursors": [30, 40],
            "keys": [30, 40],
        }
        await table.insert((15, 15, "below floor"), (25, 25, "above floor"), (50, 50, "s"))
        restarted = SmallWatcher(**watcher.serialize()[1])
        assert await ids(restarted, backend, 2) == [25, 50]

    async def test_columns_limit_the_payload_but_keep_cursor_and_key(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """Only the listed columns are read, plus the cursor and key columns."""
        await table.insert((1, 1, "a"))
        assert await payloads(table.watcher(columns=["body"]), backend, 1) == [
            {"body": "a", "seq": 1, "id": 1}
        ]

    async def test_rows_with_a_null_cursor_are_not_emitted(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """A NULL cursor cannot be placed behind or past a watermark, so it is never read."""
        await table.execute(f"INSERT INTO {table.name} (id, seq, body) VALUES (1, NULL, 'n')")
        await table.insert((2, 2, "b"))
        assert await ids(table.watcher(), backend, 1) == [2]

    async def test_a_missing_table_raises_sql_source_error(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """A query failure surfaces as SqlSourceError naming the table, the driver's error chained."""
        watcher = SqlTableWatcher(table.dsn, table.name + "_missing", "seq", "id", **FAST)
        with pytest.raises(
            SqlSourceError, match=f"{table.name.rpartition('.')[2]}_missing"
        ) as caught:
            await payloads(watcher, backend, 1)
        assert caught.value.__cause__ is not None


class TestSqlTableWatcherStateKeys:
    async def test_two_watchers_of_one_table_on_one_asset_each_emit_every_row(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """Under two names, two watchers of one table keep two positions on one asset."""
        await table.insert((1, 1, "a"), (2, 2, "b"))
        watcher = table.watcher()
        assert await ids(watcher, backend, 2, name="first") == [1, 2]
        assert await ids(rebuilt(watcher), backend, 2, name="second") == [1, 2]
        await table.insert((3, 3, "c"))
        assert await ids(rebuilt(watcher), backend, 1, name="first") == [3]
        assert await ids(rebuilt(watcher), backend, 1, name="second") == [3]
        for name in ("first", "second"):
            assert await backend.aget(ASSET.scope, f"{name}.watermark") == {
                "kind": "int",
                "cursor": 3,
                "key": 3,
            }

    async def test_the_old_keys_are_adopted_and_nothing_is_emitted_twice(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """State saved under the old 'watermark'/'recent' keys resumes there, then moves over."""
        await table.insert((1, 1, "a"), (2, 2, "b"), (4, 4, "d"))
        await backend.events.aregister_assets([ASSET])
        # What the previous version committed after emitting rows 1, 2 and 4.
        old_recent = {"floor": None, "keys": [1, 2, 4], "cursors": [1, 2, 4]}
        await backend.aset(ASSET.scope, "watermark", {"kind": "int", "cursor": 4, "key": 4})
        await backend.aset(ASSET.scope, "recent", old_recent)
        await table.insert((3, 3, "late"), (5, 5, "e"))
        watcher = table.watcher(lag_window=10)
        assert await ids(watcher, backend, 2) == [3, 5]
        assert await backend.aget(ASSET.scope, WATERMARK) == {"kind": "int", "cursor": 5, "key": 5}
        assert (await backend.aget(ASSET.scope, RECENT))["keys"] == [1, 2, 4, 3, 5]
        assert await backend.aget(ASSET.scope, "recent") == old_recent  # left for other watchers
        await table.insert((6, 6, "sentinel"))
        assert await ids(rebuilt(watcher), backend, 1) == [6]

    async def test_the_documented_rewind_emits_the_rows_after_the_given_one(
        self, table: Table, backend: MemoryStateBackend
    ) -> None:
        """Setting the watermark, and a recent whose floor is its cursor, resumes right after it."""
        await table.insert(*[(key, key, "x") for key in range(1, 6)])
        watcher = table.watcher(lag_window=10)
        assert await ids(watcher, backend, 5) == [1, 2, 3, 4, 5]
        await backend.aset(ASSET.scope, WATERMARK, {"kind": "int", "cursor": 2, "key": 2})
        await backend.aset(ASSET.scope, RECENT, {"floor": 2, "cursors": [], "keys": []})
        assert await ids(rebuilt(watcher), backend, 3) == [3, 4, 5]
        await table.insert((6, 6, "sentinel"))
        assert await ids(rebuilt(watcher), backend, 1) == [6]

    async def test_a_directory_watcher_and_a_table_watcher_share_an_asset(
        self, table: Table, backend: MemoryStateBackend, tmp_path: Path
    ) -> None:
        """Watchers of two kinds on one asset neither read nor overwrite each other's state."""
        inbox = tmp_path / "inbox"
        inbox.mkdir()
        (inbox / "report.csv").write_text("x")
        await table.insert((1, 1, "a"))
        files = DirectoryWatcher(str(inbox), poll_interval=0.01)
        rows = table.watcher()
        file_events = await run_trigger(
            files, assets=ASSET, backend=backend, max_events=1, timeout=10, watcher_name="files"
        )
        assert [e.payload["name"] for e in file_events] == ["report.csv"]
        assert await ids(rows, backend, 1, name="rows") == [1]
        await table.insert((2, 2, "b"))
        assert await ids(rebuilt(rows), backend, 1, name="rows") == [2]
        assert (await backend.aget(ASSET.scope, "files.watermark"))["key"] == "report.csv"
        assert (await backend.aget(ASSET.scope, "rows.watermark"))["key"] == 2


class TestSqlTableWatcherSqlite:
    async def test_values_become_json(self, tmp_path: Path, backend: MemoryStateBackend) -> None:
        """Blobs become base64, reals stay numbers, NULLs become null."""
        path = tmp_path / "values.db"
        async with aiosqlite.connect(path) as conn:
            await conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, c REAL, b BLOB, n TEXT)")
            await conn.execute("INSERT INTO t VALUES ('k1', 1.5, x'00ff', NULL)")
            await conn.commit()
        watcher = SqlTableWatcher(f"sqlite:///{path}", "t", "c", "k", lag_window=0.5, **FAST)
        assert await payloads(watcher, backend, 1) == [
            {"k": "k1", "c": 1.5, "b": base64.b64encode(b"\x00\xff").decode(), "n": None}
        ]
        assert await backend.aget(ASSET.scope, WATERMARK) == {
            "kind": "float",
            "cursor": 1.5,
            "key": "k1",
        }

    async def test_a_text_cursor_needs_a_zero_lag_window(
        self, tmp_path: Path, backend: MemoryStateBackend
    ) -> None:
        """A lag window cannot be measured on text, so a text cursor with one is a clear error."""
        path = tmp_path / "text.db"
        async with aiosqlite.connect(path) as conn:
            await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, ts TEXT)")
            await conn.execute("INSERT INTO t VALUES (1, '2024-01-01T00:00:00Z')")
            await conn.commit()
        dsn = f"sqlite:///{path}"
        with pytest.raises(ValueError, match="set lag_window=0"):
            await payloads(SqlTableWatcher(dsn, "t", "ts", "id", lag_window=5, **FAST), backend, 1)
        watcher = SqlTableWatcher(dsn, "t", "ts", "id", lag_window=0, **FAST)
        assert await payloads(watcher, backend, 1) == [{"id": 1, "ts": "2024-01-01T00:00:00Z"}]

    async def test_an_epoch_timestamp_cursor_takes_a_late_row_within_the_window(
        self, tmp_path: Path, backend: MemoryStateBackend
    ) -> None:
        """SQLite keeps timestamps as epoch seconds: the lag window is in seconds on them, so a
        row 10 s behind the watermark comes once with lag_window=60, and one 120 s behind never."""
        path = tmp_path / "readings.db"
        t0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
        async with aiosqlite.connect(path) as conn:
            await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, at REAL NOT NULL)")
            await conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, t0), (2, t0 + 30)])
            await conn.commit()
        watcher = SqlTableWatcher(f"sqlite:///{path}", "t", "at", "id", lag_window=60, **FAST)
        assert [p["id"] for p in await payloads(watcher, backend, 2)] == [1, 2]
        async with aiosqlite.connect(path) as conn:
            await conn.executemany(
                "INSERT INTO t VALUES (?, ?)",
                [(3, t0 + 20), (4, t0 - 90), (5, t0 + 40)],  # 10 s late, 120 s late, on time
            )
            await conn.commit()
        later = await payloads(rebuilt(watcher), backend, 2)
        assert [p["id"] for p in later] == [3, 5]
        assert (await backend.aget(ASSET.scope, WATERMARK))["cursor"] == t0 + 40

    async def test_a_missing_database_file_is_an_error_and_is_not_created(
        self, tmp_path: Path, backend: MemoryStateBackend
    ) -> None:
        """The database is opened read-only: a mistyped path fails instead of creating a file."""
        path = tmp_path / "nope.db"
        watcher = SqlTableWatcher(f"sqlite:///{path}", "t", "c", "k", **FAST)
        with pytest.raises(SqlSourceError, match="opening SQLite database"):
            await payloads(watcher, backend, 1)
        assert not path.exists()


class TestSqlTableWatcherPostgres:
    async def test_a_transaction_that_commits_after_a_later_id_is_not_lost(
        self, pg_dsn: str, pg_schema: str, backend: MemoryStateBackend
    ) -> None:
        """A serial id taken by a transaction that commits after a higher id is emitted once."""
        name = f"{pg_schema}.jobs"
        admin = await asyncpg.connect(pg_dsn)
        slow = await asyncpg.connect(pg_dsn)
        try:
            await admin.execute(f"CREATE TABLE {name} (id BIGSERIAL PRIMARY KEY, body TEXT)")
            await admin.execute(f"INSERT INTO {name} (body) VALUES ('a'), ('b')")
            transaction = slow.transaction()
            await transaction.start()
            held = await slow.fetchval(f"INSERT INTO {name} (body) VALUES ('slow') RETURNING id")
            await admin.execute(f"INSERT INTO {name} (body) VALUES ('fast')")
            watcher = SqlTableWatcher(pg_dsn, name, "id", "id", lag_window=10, **FAST)
            assert await ids(watcher, backend, 3) == [1, 2, 4]
            await transaction.commit()
            assert held == 3
            assert await ids(rebuilt(watcher), backend, 1) == [3]
            await admin.execute(f"INSERT INTO {name} (body) VALUES ('sentinel')")
            assert await ids(rebuilt(watcher), backend, 1) == [5]
        finally:
            await slow.close()
            await admin.close()

    async def test_timestamp_cursor_and_uuid_key(
        self, pg_dsn: str, pg_schema: str, backend: MemoryStateBackend
    ) -> None:
        """Timestamps, UUIDs and numerics become JSON text; a late timestamp comes once."""
        name = f"{pg_schema}.readings"
        t0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
        keys = [uuid.uuid4() for _ in range(4)]
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(
                f"CREATE TABLE {name} (id UUID PRIMARY KEY, at TIMESTAMPTZ, v NUMERIC)"
            )
            insert = f"INSERT INTO {name} VALUES ($1, $2, $3)"
            await conn.execute(insert, keys[0], t0, 1.25)
            await conn.execute(insert, keys[1], t0 + dt.timedelta(seconds=30), 2)
            watcher = SqlTableWatcher(pg_dsn, name, "at", "id", lag_window=60, **FAST)
            first = await payloads(watcher, backend, 2)
            assert first[0] == {"id": str(keys[0]), "at": t0.isoformat(), "v": "1.25"}
            mark = await backend.aget(ASSET.scope, WATERMARK)
            assert mark == {
                "kind": "datetime",
                "cursor": (t0 + dt.timedelta(seconds=30)).isoformat(),
                "key": str(keys[1]),
            }
            await conn.execute(insert, keys[2], t0 + dt.timedelta(seconds=10), 3)
            await conn.execute(insert, keys[3], t0 + dt.timedelta(seconds=40), 4)
            later = await payloads(rebuilt(watcher), backend, 2)
            assert [p["id"] for p in later] == [str(keys[2]), str(keys[3])]
        finally:
            await conn.close()


class TestSqlTableWatcherMysql:
    async def test_an_auto_increment_id_committed_after_a_later_one_is_not_lost(
        self, mysql_dsn: str, backend: MemoryStateBackend
    ) -> None:
        """An AUTO_INCREMENT id taken by a transaction that commits after a higher id (two
        connections, the later id committed first) is emitted once, on the next run."""
        name = f"jobs_{uuid.uuid4().hex[:12]}"
        admin, slow = await mysql_connect(mysql_dsn), await mysql_connect(mysql_dsn)
        try:
            await admin.autocommit(True)
            async with admin.cursor() as cursor:
                await cursor.execute(
                    f"CREATE TABLE {name} (id BIGINT AUTO_INCREMENT PRIMARY KEY, body TEXT)"
                )
                await cursor.execute(f"INSERT INTO {name} (body) VALUES ('a'), ('b')")
            async with slow.cursor() as cursor:
                await cursor.execute("BEGIN")
                await cursor.execute(f"INSERT INTO {name} (body) VALUES ('slow')")
                held = cursor.lastrowid
            async with admin.cursor() as cursor:
                await cursor.execute(f"INSERT INTO {name} (body) VALUES ('fast')")
            watcher = SqlTableWatcher(mysql_dsn, name, "id", "id", lag_window=10, **FAST)
            assert await ids(watcher, backend, 3) == [1, 2, 4]
            await slow.commit()
            assert held == 3
            assert await ids(rebuilt(watcher), backend, 1) == [3]
            async with admin.cursor() as cursor:
                await cursor.execute(f"INSERT INTO {name} (body) VALUES ('sentinel')")
            assert await ids(rebuilt(watcher), backend, 1) == [5]
        finally:
            async with admin.cursor() as cursor:
                await cursor.execute(f"DROP TABLE IF EXISTS {name}")
            await slow.ensure_closed()
            await admin.ensure_closed()

    async def test_datetime_cursor_text_key_and_values_as_json(
        self, mysql_dsn: str, backend: MemoryStateBackend
    ) -> None:
        """DATETIME cursors, text keys and DECIMAL values become JSON; a late row comes once."""
        name = f"readings_{uuid.uuid4().hex[:12]}"
        t0 = dt.datetime(2024, 5, 1, 12, 0)
        table = Table("mysql", mysql_dsn, name)
        await table.execute(
            f"CREATE TABLE {name} (k VARCHAR(20) PRIMARY KEY, at DATETIME(6), v DECIMAL(8, 2))"
        )
        try:
            insert = f"INSERT INTO {name} VALUES ($1, $2, $3)"
            await table.execute(insert, "a", t0, "1.25")
            await table.execute(insert, "b", t0 + dt.timedelta(seconds=30), "2")
            watcher = SqlTableWatcher(mysql_dsn, name, "at", "k", lag_window=60, **FAST)
            first = await payloads(watcher, backend, 2)
            assert first[0] == {"k": "a", "at": t0.isoformat(), "v": "1.25"}
            assert await backend.aget(ASSET.scope, WATERMARK) == {
                "kind": "datetime",
                "cursor": (t0 + dt.timedelta(seconds=30)).isoformat(),
                "key": "b",
            }
            await table.execute(insert, "c", t0 + dt.timedelta(seconds=10), "3")
            await table.execute(insert, "d", t0 + dt.timedelta(seconds=40), "4")
            later = await payloads(rebuilt(watcher), backend, 2)
            assert [p["k"] for p in later] == ["c", "d"]
        finally:
            await table.execute(f"DROP TABLE {name}")

    async def test_a_refused_login_is_a_clear_error_without_the_password(
        self, mysql_dsn: str, backend: MemoryStateBackend
    ) -> None:
        """A wrong password fails the run with SqlSourceError; the message hides the password."""
        parts = urlsplit(mysql_dsn)
        dsn = f"mysql://nobody_wk:s3cret@{parts.hostname}:{parts.port}/test"
        with pytest.raises(SqlSourceError, match="connecting to") as caught:
            await payloads(SqlTableWatcher(dsn, "t", "c", "k", **FAST), backend, 1)
        assert "s3cret" not in str(caught.value)
        assert "nobody_wk:***@" in str(caught.value)


class TestSqlTableWatcherArguments:
    def test_serialize_rebuilds_an_equal_trigger(self, tmp_path: Path) -> None:
        """serialize() gives an importable classpath and JSON kwargs that rebuild an equal one."""
        watcher = SqlTableWatcher(
            f"sqlite:///{tmp_path / 'x.db'}", "main.t", "c", "k", 10, 0.5, 7, ("a", "b")
        )
        classpath, kwargs = watcher.serialize()
        assert classpath == "watchkeeper.watchers.sql_table.SqlTableWatcher"
        assert kwargs == {
            "dsn": f"sqlite:///{tmp_path / 'x.db'}",
            "table": "main.t",
            "cursor_column": "c",
            "key_column": "k",
            "batch_size": 10,
            "poll_interval": 0.5,
            "lag_window": 7,
            "columns": ["a", "b"],
            "timeout": 10.0,
        }
        copy = rebuilt(watcher)
        assert copy == watcher
        assert hash(copy) == hash(watcher)
        assert copy.serialize() == (classpath, kwargs)

    @pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
    def test_repr_hides_the_password(self, scheme: str) -> None:
        """repr() shows the DSN without its password, so logs never carry it."""
        watcher = SqlTableWatcher(f"{scheme}://app:s3cret@db:5432/main", "t", "c", "k")
        assert "s3cret" not in repr(watcher)
        assert "app:***@db:5432" in repr(watcher)

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"dsn": 5}, TypeError, "dsn must be a str"),
            ({"dsn": "mssql://x/y"}, ValueError, "dsn must start with"),
            ({"dsn": "mysql:///db"}, ValueError, "names no server"),
            ({"dsn": "oracle://u:pw@h"}, ValueError, "'oracle://u:\\*\\*\\*@h'"),
            ({"dsn": "sqlite:///"}, ValueError, "names no database file"),
            ({"dsn": "sqlite:///:memory:"}, ValueError, "in-memory"),
            ({"table": "t; DROP TABLE t"}, ValueError, "table 't; DROP TABLE t' is not a plain"),
            ({"table": 'a"b'}, ValueError, "is not a plain SQL identifier"),
            ({"table": "a.b.c"}, ValueError, "more than one '.'"),
            ({"table": 3}, TypeError, "table must be a str"),
            ({"cursor_column": "1abc"}, ValueError, "cursor_column '1abc'"),
            ({"key_column": "x" * 64}, ValueError, "key_column"),
            ({"key_column": None}, TypeError, "key_column must be a str"),
            ({"batch_size": 0}, ValueError, "batch_size must be at least 1"),
            ({"batch_size": 1.5}, TypeError, "batch_size must be an int"),
            ({"batch_size": True}, TypeError, "batch_size must be an int"),
            ({"poll_interval": 0}, ValueError, "poll_interval must be greater than 0"),
            ({"poll_interval": math.nan}, ValueError, "poll_interval must be finite"),
            ({"lag_window": -1}, ValueError, "lag_window must be 0 or more"),
            ({"lag_window": "5"}, TypeError, "lag_window must be a number"),
            ({"columns": "body"}, TypeError, "columns must be a list"),
            ({"columns": []}, ValueError, "columns must not be empty"),
            ({"columns": ["ok", "bad name"]}, ValueError, "a name in columns 'bad name'"),
            ({"columns": ["a", "b", "a"]}, ValueError, "columns lists a more than once"),
        ],
    )
    def test_bad_arguments_are_rejected_by_name(
        self, kwargs: dict[str, Any], error: type[Exception], match: str
    ) -> None:
        """Each invalid argument raises a TypeError or ValueError that names it."""
        arguments: dict[str, Any] = {
            "dsn": "sqlite:///x.db",
            "table": "t",
            "cursor_column": "c",
            "key_column": "k",
            **kwargs,
        }
        with pytest.raises(error, match=match):
            SqlTableWatcher(**arguments)

    @pytest.mark.parametrize(
        "dsn",
        [
            "sqlite:///relative.db",
            "sqlite:////abs/path.db",
            "postgres://h/db",
            "mysql://u@h:3307/db",
            "mariadb://h/db",
        ],
    )
    def test_supported_dsns_are_accepted(self, dsn: str) -> None:
        """Both SQLite path forms, both PostgreSQL schemes and both MySQL ones are accepted."""
        assert SqlTableWatcher(dsn, "t", "c", "k").serialize()[1]["dsn"] == dsn


class TestSqlTableWatcherDurableState:
    async def test_restart_on_a_reopened_store_emits_nothing_twice(
        self, table: Table, reopenable_backend: OpenBackend
    ) -> None:
        """The watermark and recent keys survive closing the store; a rebuilt watcher resumes."""
        await table.insert((1, 1, "a"), (4, 4, "d"), (5, 4, "tie"))
        watcher = table.watcher(batch_size=2, lag_window=10)
        async with reopenable_backend() as first:
            assert await ids(watcher, first, 2) == [1, 4]
        await table.insert((3, 3, "late"), (6, 6, "sentinel"))
        async with reopenable_backend() as second:
            assert await ids(rebuilt(watcher), second, 3) == [3, 5, 6]
            recent = await second.aget(ASSET.scope, RECENT)
            assert recent == {
                "floor": None,
                "cursors": [1, 4, 3, 4, 6],
                "keys": [1, 4, 3, 5, 6],  # in emission order: the late row 3 came third
            }
