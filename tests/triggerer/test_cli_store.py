"""The store half of the ``watchkeeper`` command, run as real subprocesses on real databases."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from watchkeeper.store import (
    NEVER_EXPIRE,
    Asset,
    AssetScope,
    PostgresStateBackend,
    SqliteStateBackend,
    TaskScope,
)
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, TriggerStatus

_SCRIPT = Path(sys.executable).with_name("watchkeeper")
COMMAND: list[str] = (
    [str(_SCRIPT)]
    if _SCRIPT.is_file()
    else [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]
)

TASK = TaskScope("etl", "run_1", "load")
ORDERS = AssetScope(name="orders")


@dataclass
class Result:
    """What one run of the command produced."""

    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines()]


@pytest.fixture(scope="session")
def pycache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the subprocesses cache bytecode: compiling every import again costs each ~0.6 s."""
    return tmp_path_factory.mktemp("pycache")


@dataclass
class Cli:
    """Runs ``watchkeeper`` against one database from an empty working directory."""

    url: str
    cwd: Path
    pycache: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("WATCHKEEPER__")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.pycache)  # outside the source tree
        env["WATCHKEEPER__DATABASE__URL"] = self.url
        env["COLUMNS"] = "200"  # rich wraps tables at 80 columns when stdout is not a terminal
        env.update(extra or {})
        return env

    async def __call__(
        self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> Result:
        done = await anyio.run_process(
            [*COMMAND, *args],
            input=None if stdin is None else stdin.encode(),
            check=False,
            cwd=self.cwd,
            env=self.env(env),
        )
        return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def _dump(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return list(conn.iterdump())


async def snapshot(path: Path) -> list[str]:
    """Every row of the SQLite file, as SQL text: equal snapshots mean nothing changed."""
    return await anyio.to_thread.run_sync(_dump, path)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "state.db"


@pytest.fixture
async def populated(db_path: Path) -> AsyncIterator[Path]:
    """A SQLite file with asset ``orders`` (key ``watermark``), task state and two events."""
    db_path.parent.mkdir()
    async with SqliteStateBackend(db_path) as backend:
        await backend.events.aregister_assets([Asset("orders", uri="s3://bucket/orders")])
        await backend.aset(ORDERS, "watermark", "2024-05-31")
        await backend.aset(TASK, "cursor", 10)
        await commit(backend, "orders", {"n": 1}, dedup_key="m1")
        await commit(backend, "orders", {"n": 2})
    yield db_path


@pytest.fixture
def cli(populated: Path, tmp_path: Path, pycache: Path) -> Cli:
    # Four slashes: an absolute path. The command runs elsewhere, so a relative URL would miss.
    work = tmp_path / "work"
    work.mkdir()
    return Cli(f"sqlite:///{populated}", work, pycache)


async def commit(
    backend: BaseStateBackend, asset: str, payload: object, dedup_key: str | None = None
) -> None:
    await backend.events.acommit(
        EventCommit(
            watcher="feed", assets=(asset,), payload_json=json.dumps(payload), dedup_key=dedup_key
        )
    )


class TestStateStoreAsset:
    async def test_set_then_get_json_round_trips_the_value(self, cli: Cli, db_path: Path) -> None:
        """A JSON value set from the command line reads back identically with get --json,
        while another process (standing in for the daemon) holds the file open."""
        value = {"since": "2024-06-01", "ids": [1, 2.5, None], "ok": True}
        async with SqliteStateBackend(db_path) as backend:
            done = await cli(
                "state-store", "set", "--asset", "orders", "watermark", json.dumps(value)
            )
            assert (done.code, done.err) == (0, "")
            assert "version 2" in done.out
            got = await cli("state-store", "get", "--asset", "orders", "watermark", "--json")
            assert got.code == 0
            assert json.loads(got.out) == value
            assert got.out.count("\n") == 1
            entry = await backend.aget_entry(ORDERS, "watermark")
        assert entry is not None
        assert entry.value == value
        assert str(entry.writer) == f"cli:{getpass.getuser()}"

    async def test_set_reads_the_value_from_stdin_and_checks_the_version(
        self, cli: Cli, db_path: Path
    ) -> None:
        """``-`` reads the value from stdin; ``--expected-version`` makes the write a CAS."""
        done = await cli(
            "state-store", "set", "--asset", "orders", "watermark", "-",
            "--expected-version", "1", "--json", stdin='"2024-06-02"',
        )  # fmt: skip
        assert done.code == 0
        assert json.loads(done.out) == {"key": "watermark", "version": 2}
        async with SqliteStateBackend(db_path) as backend:
            assert await backend.aget(ORDERS, "watermark") == "2024-06-02"

    async def test_list_json_prints_one_entry_per_line_in_key_order(self, cli: Cli) -> None:
        """list --json prints key, value, version, updated_at and writer of each key."""
        await cli("state-store", "set", "--asset", "orders", "alpha", "[1]")
        done = await cli("state-store", "list", "--asset", "orders", "--json")
        assert done.code == 0
        rows = done.json_lines()
        assert [(r["key"], r["value"], r["version"]) for r in rows] == [
            ("alpha", [1], 1),
            ("watermark", "2024-05-31", 1),
        ]
        assert set(rows[0]) == {"key", "value", "version", "updated_at", "writer"}
        assert rows[0]["writer"] == f"cli:{getpass.getuser()}"
        assert rows[1]["writer"] is None

    async def test_list_for_people_is_a_table(self, cli: Cli) -> None:
        """Without --json, list prints a table naming the scope, keys and values."""
        done = await cli("state-store", "list", "--asset", "orders")
        assert done.code == 0
        assert "asset 'orders'" in done.out
        assert "watermark" in done.out
        assert '"2024-05-31"' in done.out

    async def test_delete_then_clear(self, cli: Cli, db_path: Path) -> None:
        """delete removes one key (a missing one is a no-op); clear removes every key."""
        async with SqliteStateBackend(db_path) as backend:
            await backend.aset(ORDERS, "other", 1)
        deleted = await cli("state-store", "delete", "--asset", "orders", "watermark")
        assert deleted.code == 0
        assert "deleted 'watermark'" in deleted.out
        again = await cli("state-store", "delete", "--asset", "orders", "watermark")
        assert again.code == 0
        assert "nothing deleted" in again.out
        async with SqliteStateBackend(db_path) as backend:
            assert [e.key for e in await backend.alist(ORDERS)] == ["other"]
        cleared = await cli("state-store", "clear", "--asset", "orders")
        assert cleared.code == 0
        assert "cleared 1 key" in cleared.out
        async with SqliteStateBackend(db_path) as backend:
            assert await backend.alist(ORDERS) == []


class TestStateStoreTask:
    async def test_map_index_addresses_one_task_instance(self, cli: Cli, db_path: Path) -> None:
        """--map-index picks the instance; other map indices keep their own state."""
        task = ("--task", "etl", "run_1", "load")
        done = await cli("state-store", "set", *task, "--map-index", "3", "cursor", "30")
        assert done.code == 0
        three = await cli("state-store", "get", *task, "--map-index", "3", "cursor", "--json")
        unmapped = await cli("state-store", "get", *task, "cursor", "--json")
        assert (json.loads(three.out), json.loads(unmapped.out)) == (30, 10)
        async with SqliteStateBackend(db_path) as backend:
            assert await backend.aget(TaskScope("etl", "run_1", "load", 3), "cursor") == 30

    async def test_clear_all_map_indices(self, cli: Cli, db_path: Path) -> None:
        """clear --all-map-indices removes the state of every map index of the task."""
        async with SqliteStateBackend(db_path) as backend:
            await backend.aset(TaskScope("etl", "run_1", "load", 0), "cursor", 0)
            await backend.aset(TaskScope("etl", "run_1", "load", 1), "cursor", 1)
            await backend.aset(TaskScope("etl", "run_2", "load", 0), "cursor", 2)
        done = await cli(
            "state-store", "clear", "--task", "etl", "run_1", "load", "--all-map-indices"
        )
        assert done.code == 0
        assert "cleared 3 keys" in done.out
        async with SqliteStateBackend(db_path) as backend:
            assert await backend.aget(TaskScope("etl", "run_2", "load", 0), "cursor") == 2
            assert await backend.aget(TASK, "cursor") is None

    async def test_clean_dry_run_deletes_nothing_then_clean_deletes(
        self, cli: Cli, db_path: Path
    ) -> None:
        """clean --dry-run lists what clean then deletes: expired task state and orphaned
        asset state, never NEVER_EXPIRE keys."""
        async with SqliteStateBackend(db_path) as backend:
            await backend.aset(TASK, "stale", 1, retention=timedelta(seconds=-1))
            await backend.aset(TASK, "kept", 1, retention=NEVER_EXPIRE)
            await backend.events.aregister_assets([Asset("gone")])
            await backend.aset(AssetScope(name="gone"), "wm", 5)
            assert await backend.events.adeactivate_asset("gone")
        before = await snapshot(db_path)
        dry = await cli("state-store", "clean", "--dry-run")
        assert dry.code == 0
        assert dry.out.splitlines() == [
            "would delete expired: task etl/run_1/load[-1] key 'stale'",
            "would delete orphaned: asset 'gone' key 'wm'",
            "would delete 2 rows (1 expired, 0 past retention, 1 of inactive assets)",
            "would delete 0 events (older than 30 days; with a dedup_key: older than 30 days)",
        ]
        assert await snapshot(db_path) == before
        real = await cli("state-store", "clean")
        assert real.code == 0
        assert real.out.splitlines()[-2:] == [
            "deleted 2 rows (1 expired, 0 past retention, 1 of inactive assets)",
            "deleted 0 events (older than 30 days; with a dedup_key: older than 30 days)",
        ]
        async with SqliteStateBackend(db_path) as backend:
            assert sorted(e.key for e in await backend.alist(TASK)) == ["cursor", "kept"]

    async def test_clean_uses_the_configured_retention(self, cli: Cli) -> None:
        """``[state_store] default_retention_days`` from the environment drives clean."""
        retention = {"WATCHKEEPER__STATE_STORE__DEFAULT_RETENTION_DAYS": "0"}
        kept = await cli("state-store", "clean", "--dry-run", env=retention)
        assert kept.out.splitlines()[-2].startswith("would delete 0 rows")

    @staticmethod
    async def _old_events(db_path: Path) -> None:
        """Two events committed 31 days ago (one with a dedup_key) beside the two recent ones."""
        async with SqliteStateBackend(db_path) as backend:
            then = datetime.now(UTC) - timedelta(days=31)
            backend.clock = lambda: then
            await commit(backend, "orders", {"n": "old"})
            await commit(backend, "orders", {"n": "old keyed"}, dedup_key="old-1")

    async def test_clean_deletes_events_past_retention(self, cli: Cli, db_path: Path) -> None:
        """clean --dry-run counts the events older than [events] retention_days and deletes
        nothing; clean deletes exactly those and keeps the recent ones."""
        await self._old_events(db_path)
        before = await snapshot(db_path)
        dry = await cli("state-store", "clean", "--dry-run")
        assert (dry.code, dry.err) == (0, "")
        assert dry.out.splitlines()[-1] == (
            "would delete 2 events (older than 30 days; with a dedup_key: older than 30 days)"
        )
        assert await snapshot(db_path) == before
        real = await cli("state-store", "clean")
        assert real.out.splitlines()[-1] == (
            "deleted 2 events (older than 30 days; with a dedup_key: older than 30 days)"
        )
        async with SqliteStateBackend(db_path) as backend:
            assert [e.payload for e in await backend.events.alist_events()] == [{"n": 1}, {"n": 2}]

    async def test_clean_json_reports_rows_and_events(self, cli: Cli, db_path: Path) -> None:
        """clean --json prints one document: the state rows by kind, the number of events,
        and the event retention in force (here a 40-day dedup window keeps the keyed event)."""
        await self._old_events(db_path)
        async with SqliteStateBackend(db_path) as backend:
            await backend.aset(TASK, "stale", 1, retention=timedelta(seconds=-1))
        window = {"WATCHKEEPER__EVENTS__DEDUP_RETENTION_DAYS": "40"}
        dry = await cli("state-store", "clean", "--dry-run", "--json", env=window)
        expected = {
            "dry_run": True,
            "rows": 1,
            "expired": [
                {"dag_id": "etl", "run_id": "run_1", "task_id": "load", "map_index": -1,
                 "key": "stale"},
            ],
            "retention": [],
            "orphaned": [],
            "events": 1,
            "logs": 0,
            "event_retention_days": 30,
            "dedup_retention_days": 40,
        }  # fmt: skip
        assert (dry.code, dry.json_lines()) == (0, [expected])
        real = await cli("state-store", "clean", "--json", env=window)
        assert real.json_lines() == [{**expected, "dry_run": False}]
        async with SqliteStateBackend(db_path) as backend:
            keyed = [e.payload["n"] for e in await backend.events.alist_events() if e.dedup_key]
        assert keyed == [1, "old keyed"]

    async def test_clean_keeps_every_event_with_zero_retention(
        self, cli: Cli, db_path: Path
    ) -> None:
        """With [events] retention_days = 0, clean says events are kept and deletes none."""
        await self._old_events(db_path)
        forever = {"WATCHKEEPER__EVENTS__RETENTION_DAYS": "0"}
        done = await cli("state-store", "clean", env=forever)
        assert done.out.splitlines()[-1] == (
            "deleted 0 events ([events] retention_days = 0 keeps them forever)"
        )
        async with SqliteStateBackend(db_path) as backend:
            assert len(await backend.events.alist_events()) == 4


class TestAssets:
    async def test_register_list_deactivate(self, cli: Cli) -> None:
        """A registered asset is listed; deactivated, only ``list --all`` shows it."""
        done = await cli("assets", "register", "payments", "--uri", "s3://bucket/payments")
        assert done.code == 0
        listed = await cli("assets", "list", "--json")
        assert [(a["name"], a["uri"], a["active"]) for a in listed.json_lines()] == [
            ("orders", "s3://bucket/orders", True),
            ("payments", "s3://bucket/payments", True),
        ]
        assert (await cli("assets", "deactivate", "payments")).code == 0
        active = await cli("assets", "list")
        assert "orders" in active.out
        assert "payments" not in active.out
        every = await cli("assets", "list", "--all", "--json")
        assert [(a["name"], a["active"]) for a in every.json_lines()] == [
            ("orders", True),
            ("payments", False),
        ]

    async def test_deactivating_twice_is_not_an_error(self, cli: Cli) -> None:
        """Deactivating an inactive asset says so and exits 0."""
        await cli("assets", "deactivate", "orders")
        again = await cli("assets", "deactivate", "orders")
        assert again.code == 0
        assert "already inactive" in again.out


class TestEvents:
    async def test_events_json_in_commit_order(self, cli: Cli) -> None:
        """events --json prints one object per committed event, oldest first."""
        done = await cli("events", "--json")
        assert done.code == 0
        events = done.json_lines()
        assert [
            (e["id"], e["asset"], e["watcher"], e["payload"], e["dedup_key"]) for e in events
        ] == [
            (1, "orders", "feed", {"n": 1}, "m1"),
            (2, "orders", "feed", {"n": 2}, None),
        ]
        assert set(events[0]) == {"id", "asset", "watcher", "payload", "dedup_key", "created_at"}

    async def test_since_limit_and_asset_filter(self, cli: Cli) -> None:
        """--since skips ids up to ID, --limit caps the count, --asset filters."""
        done = await cli("events", "--asset", "orders", "--since", "1", "--limit", "1", "--json")
        assert [e["id"] for e in done.json_lines()] == [2]

    async def test_a_url_password_in_a_payload_is_masked(self, cli: Cli, db_path: Path) -> None:
        """events prints a URL's password in a payload as ``***``, as text and as JSON."""
        async with SqliteStateBackend(db_path) as backend:
            await commit(backend, "orders", {"source": "redis://:hunter2@cache:6379/0"})
        text = await cli("events", "--since", "2")
        as_json = await cli("events", "--since", "2", "--json")
        assert "hunter2" not in text.out + as_json.out
        assert "redis://:***@cache:6379/0" in text.out
        [record] = as_json.json_lines()
        assert record["payload"] == {"source": "redis://:***@cache:6379/0"}

    async def test_status_masks_a_url_password_in_an_error(self, cli: Cli, db_path: Path) -> None:
        """status shows a saved last_error quoting a URL only with its password masked."""
        async with SqliteStateBackend(db_path) as backend:
            await backend.status.asave_trigger_status(
                [
                    TriggerStatus(
                        trigger_id="t1",
                        classpath="mine.Watcher",
                        assets=("orders",),
                        watchers=("w",),
                        state="backing_off",
                        failures=1,
                        last_error="ConnectionError: cannot reach postgresql://app:hunter2@db/x",
                    )
                ]
            )
        table = await cli("status")
        as_json = await cli("status", "--json")
        assert "hunter2" not in table.out + as_json.out
        [row] = json.loads(as_json.out)["watchers"]
        assert row["last_error"] == "ConnectionError: cannot reach postgresql://app:***@db/x"

    async def test_follow_prints_new_events_until_interrupted(
        self, cli: Cli, db_path: Path
    ) -> None:
        """--follow prints existing events, then each new commit, each line the very record
        ``events --json`` prints (every key), and exits 0 on SIGINT."""
        command = [*COMMAND, "events", "--follow", "--json", "--since", "1"]
        async with await anyio.open_process(command, cwd=cli.cwd, env=cli.env()) as process:
            assert process.stdout is not None
            lines = BufferedByteReceiveStream(process.stdout)
            with anyio.fail_after(30):
                first = json.loads(await lines.receive_until(b"\n", 65536))
            assert first["id"] == 2
            async with SqliteStateBackend(db_path) as backend:
                await commit(backend, "orders", {"n": 3})
            with anyio.fail_after(30):
                second = json.loads(await lines.receive_until(b"\n", 65536))
            assert (second["id"], second["payload"]) == (3, {"n": 3})
            process.send_signal(signal.SIGINT)
            with anyio.fail_after(30):
                assert await process.wait() == 0
        listed = await cli("events", "--json", "--since", "1")
        assert [first, second] == listed.json_lines()


BAD_INPUT: Sequence[tuple[str, list[str], int, str]] = [
    ("not JSON", ["state-store", "set", "--asset", "orders", "k", "2024-06-01"], 2, "not JSON"),
    ("NaN", ["state-store", "set", "--asset", "orders", "k", "NaN"], 2, "not JSON"),
    ("null", ["state-store", "set", "--asset", "orders", "k", "null"], 1, "None"),
    ("too large", ["state-store", "set", "--asset", "orders", "k", '"' + "x" * 70 + '"'], 1,
     "over the limit of 64 bytes"),
    ("unknown asset", ["state-store", "set", "--asset", "nope", "k", "1"], 1, "'nope'"),
    ("empty key", ["state-store", "set", "--asset", "orders", "", "1"], 1, "must not be empty"),
    ("stale version", ["state-store", "set", "--asset", "orders", "watermark", "1",
                       "--expected-version", "5"], 1, "at version 1, expected 5"),
    ("missing value", ["state-store", "set", "--asset", "orders", "k"], 2, "VALUE"),
    ("two scopes", ["state-store", "get", "--asset", "orders", "--task", "a", "b", "c", "k"], 2,
     "not allowed with"),
    ("map index on asset", ["state-store", "get", "--asset", "orders", "--map-index", "1", "k"],
     2, "--map-index applies to --task only"),
    ("retention on asset", ["state-store", "set", "--asset", "orders", "k", "1",
                            "--retention-days", "3"], 2, "apply to --task only"),
    ("all map indices on asset", ["state-store", "clear", "--asset", "orders",
                                  "--all-map-indices"], 2, "applies to --task only"),
    ("missing key", ["state-store", "get", "--asset", "orders", "absent"], 1, "'absent'"),
    ("unknown asset events", ["events", "--asset", "nope"], 1, "'nope' is not registered"),
    ("deactivate unknown", ["assets", "deactivate", "nope"], 1, "'nope' is not registered"),
    ("missing config", ["--config", "absent.toml", "assets", "list"], 2, "absent.toml"),
    ("unknown scheme", ["--database-url", "mysql://db/wk", "assets", "list"], 2, "'mysql'"),
]  # fmt: skip


class TestBadInput:
    @pytest.mark.parametrize(
        ("args", "code", "message"),
        [case[1:] for case in BAD_INPUT],
        ids=[case[0] for case in BAD_INPUT],
    )
    async def test_one_line_error_and_store_unchanged(
        self, cli: Cli, db_path: Path, args: list[str], code: int, message: str
    ) -> None:
        """Bad input exits 2 (usage) or 1 (store) with one stderr line and changes nothing."""
        before = await snapshot(db_path)
        done = await cli(*args, env={"WATCHKEEPER__STATE_STORE__MAX_VALUE_BYTES": "64"})
        assert done.code == code, done.err
        assert len(done.err_lines) == 1, done.err
        assert done.err_lines[0].startswith("watchkeeper: error: ")
        assert message in done.err_lines[0]
        assert done.out == ""
        assert await snapshot(db_path) == before

    async def test_invalid_setting_names_the_key(self, cli: Cli) -> None:
        """An invalid value in the environment is one line naming section.key, exit 2."""
        done = await cli(
            "assets", "list", env={"WATCHKEEPER__STATE_STORE__MAX_VALUE_BYTES": "zero"}
        )
        assert done.code == 2
        assert len(done.err_lines) == 1
        assert "state_store.max_value_bytes" in done.err


class TestGlobalOptions:
    async def test_database_url_option_beats_the_environment(
        self, cli: Cli, tmp_path: Path
    ) -> None:
        """--database-url wins over WATCHKEEPER__DATABASE__URL; db migrate creates the file."""
        other = tmp_path / "other.db"
        done = await cli("--database-url", f"sqlite:///{other}", "db", "migrate")
        assert done.code == 0
        assert done.out.startswith("applied migrations")
        assert other.is_file()
        again = await cli("--database-url", f"sqlite:///{other}", "db", "migrate")
        assert again.out == "database schema is up to date\n"

    async def test_usage_error_opens_no_database(self, cli: Cli, tmp_path: Path) -> None:
        """A usage error is reported before the database is opened (no file is created)."""
        fresh = tmp_path / "fresh.db"
        done = await cli(
            "--database-url", f"sqlite:///{fresh}",
            "state-store", "set", "--asset", "orders", "--retention-days", "1", "k", "1",
        )  # fmt: skip
        assert done.code == 2
        assert "apply to --task only" in done.err
        assert not fresh.exists()

    async def test_config_file_is_read(self, cli: Cli, tmp_path: Path) -> None:
        """--config names a TOML file whose settings apply (here, the size limit)."""
        config = tmp_path / "wk.toml"
        config.write_text("[state_store]\nmax_value_bytes = 8\n")
        done = await cli(
            "--config", str(config), "state-store", "set", "--asset", "orders", "k", '"123456789"'
        )
        assert done.code == 1
        assert "over the limit of 8 bytes" in done.err

    async def test_version(self, cli: Cli) -> None:
        """--version prints the program name and version."""
        done = await cli("--version")
        assert done.code == 0
        assert done.out.startswith("watchkeeper ")


@pytest.mark.postgres
class TestPostgres:
    async def test_state_assets_and_events_on_postgres(
        self, pg_dsn: str, pg_schema: str, tmp_path: Path, pycache: Path
    ) -> None:
        """The same commands work against PostgreSQL (search_path picks the test schema)."""
        cli = Cli(f"{pg_dsn}?search_path={pg_schema}", tmp_path, pycache)
        assert (await cli("db", "migrate")).code == 0
        assert (await cli("assets", "register", "orders")).code == 0
        done = await cli("state-store", "set", "--asset", "orders", "wm", '{"ts": "2024-06-01"}')
        assert done.code == 0
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
            assert await backend.aget(ORDERS, "wm") == {"ts": "2024-06-01"}
            await commit(backend, "orders", {"n": 1}, dedup_key="m1")
        got = await cli("state-store", "get", "--asset", "orders", "wm", "--json")
        assert json.loads(got.out) == {"ts": "2024-06-01"}
        events = await cli("events", "--json")
        assert [(e["asset"], e["payload"]) for e in events.json_lines()] == [("orders", {"n": 1})]
        bad = await cli("state-store", "set", "--asset", "nope", "wm", "1")
        assert bad.code == 1
        assert len(bad.err_lines) == 1
