"""Bad input at the command line's edges and ``db migrate``.

Each run is a real ``watchkeeper`` subprocess on a real database. Every bad input is one
``watchkeeper: error: ...`` line on stderr, nothing on stdout, and the database unchanged;
SQLite and PostgreSQL print the same line. Tables escape what is not printable.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import Asset, AssetScope, SqliteStateBackend, TaskScope
from watchkeeper.store.protocols import EventCommit, TaskSpec, TriggerStatus
from watchkeeper.store.sqlite.schema import SQLITE_MIGRATIONS

APPLIED = f"applied migrations {', '.join(str(s[0]) for s in SQLITE_MIGRATIONS.steps)}\n"
"""What ``db migrate`` says on a new database (both have the same versions)."""
_SCRIPT = Path(sys.executable).with_name("watchkeeper")
COMMAND: list[str] = (
    [str(_SCRIPT)]
    if _SCRIPT.is_file()
    else [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]
)
# What the shell passes for bytes that are not UTF-8: Python decodes them to lone surrogates.
NOT_UTF8 = os.fsdecode(b"\xff")


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class Cli:
    """Runs ``watchkeeper`` against the database ``url`` from the directory ``cwd``."""

    url: str
    cwd: Path

    async def __call__(self, *args: str, stdin: str | None = None) -> Result:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("WATCHKEEPER__")}
        env["WATCHKEEPER__DATABASE__URL"] = self.url
        env["COLUMNS"] = "300"  # rich wraps tables at 80 columns when stdout is not a terminal
        done = await anyio.run_process(
            [*COMMAND, *args],
            input=None if stdin is None else stdin.encode(),
            check=False,
            cwd=self.cwd,
            env=env,
        )
        out, err = (data.decode(errors="backslashreplace") for data in (done.stdout, done.stderr))
        return Result(done.returncode, out, err)


def _dump(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return list(conn.iterdump())


@pytest.fixture
async def db_path(tmp_path: Path) -> Path:
    """A SQLite file with asset ``orders`` (key ``watermark``) and one task key."""
    path = tmp_path / "state.db"
    async with SqliteStateBackend(path) as backend:
        await backend.events.aregister_assets([Asset("orders")])
        await backend.aset(AssetScope(name="orders"), "watermark", 1)
        await backend.aset(TaskScope("etl", "run_1", "load"), "cursor", 10)
    return path


@pytest.fixture
def cli(db_path: Path, tmp_path: Path) -> Cli:
    work = tmp_path / "work"
    work.mkdir()
    return Cli(f"sqlite:///{db_path}", work)


SET_ASSET = ["state-store", "set", "--asset", "orders"]
SET_TASK = ["state-store", "set", "--task", "etl", "run_1", "load"]

# name, arguments, stdin, exit status, what the error line says
EDGES: Sequence[tuple[str, list[str], str | None, int, str]] = [
    ("100k nested lists", [*SET_ASSET, "k", "-"], "[" * 100_000 + "]" * 100_000, 2,
     "nested too deeply (the store keeps at most 256 levels)"),
    ("257 nested lists", [*SET_ASSET, "k", "[" * 257 + "]" * 257], None, 1,
     "nested more than 256 levels deep"),
    ("10**5000", [*SET_ASSET, "k", "1" + "0" * 5000], None, 2, "integer of 5001 digits"),
    ("10**5000 nested", [*SET_ASSET, "k", "-"], '{"n": [' + "9" * 5000 + "]}", 2,
     "integer of 5000 digits"),
    ("lone surrogate in a value", [*SET_ASSET, "k", f'"a{NOT_UTF8}"'], None, 1,
     "lone surrogate"),
    ("lone surrogate in a key", [*SET_ASSET, f"k{NOT_UTF8}", "1"], None, 1,
     "invalid key 'k\\udcff': not valid UTF-8"),
    ("control character in a key", [*SET_ASSET, "a\x1b[2Jb", "1"], None, 1,
     "invalid key 'a\\x1b[2Jb': contains the control character '\\x1b'"),
    ("retention days past timedelta", [*SET_TASK, "k", "1", "--retention-days", "99999999999"],
     None, 2, "--retention-days: 99999999999 is more than 999999999"),
    ("retention past year 9999", [*SET_TASK, "k", "1", "--retention-days", "99999999"], None, 1,
     "the expiry would fall after the year 9999"),
    ("huge map index", [*SET_TASK, "k", "1", "--map-index", "99999999999999999999"], None, 2,
     "--map-index: 99999999999999999999 is more than 2147483647"),
    ("map index past int4", [*SET_TASK, "k", "1", "--map-index", "2147483648"], None, 2,
     "is more than 2147483647"),
    ("huge expected version", [*SET_ASSET, "watermark", "2", "--expected-version",
                               "99999999999999999999"], None, 2, "is more than 9223372036854775807"),
    ("huge since", ["events", "--since", "99999999999999999999"], None, 2,
     "--since: 99999999999999999999 is more than 9223372036854775807"),
    ("digits past the int limit", ["events", "--limit", "9" * 5000], None, 2,
     "has too many digits"),
    ("control character in a dag_id", ["state-store", "get", "--task", "d\x01", "r", "t", "k"],
     None, 2, "invalid dag_id 'd\\x01'"),
    ("lone surrogate in an asset", ["state-store", "list", "--asset", f"o{NOT_UTF8}"], None, 2,
     "invalid asset name 'o\\udcff'"),
    ("ESC in a registered name", ["assets", "register", "x\x1b]0;pwned\x07"], None, 2,
     "invalid asset name 'x\\x1b]0;pwned\\x07'"),
    ("long URI", ["assets", "register", "a", "--uri", "u" * 1025], None, 2,
     "1025 bytes in UTF-8, over the limit of 1024"),
]  # fmt: skip


class TestBadInputAtTheEdges:
    @pytest.mark.parametrize(
        ("args", "stdin", "code", "message"),
        [case[1:] for case in EDGES],
        ids=[case[0] for case in EDGES],
    )
    async def test_one_line_and_nothing_changed(
        self,
        cli: Cli,
        db_path: Path,
        args: list[str],
        stdin: str | None,
        code: int,
        message: str,
    ) -> None:
        """Each input past an edge exits 2 (usage) or 1 (refused by the store) with one
        printable stderr line naming what was wrong, and the database is unchanged."""
        before = await anyio.to_thread.run_sync(_dump, db_path)
        done = await cli(*args, stdin=stdin)
        assert done.code == code, done.err
        lines = done.err.splitlines()
        assert len(lines) == 1, done.err
        assert lines[0].startswith("watchkeeper: error: ") and lines[0].isprintable(), done.err
        assert message in lines[0], lines[0]
        assert done.out == ""
        assert await anyio.to_thread.run_sync(_dump, db_path) == before


class TestTablesEscape:
    async def test_what_a_table_prints_is_escaped(self, cli: Cli, db_path: Path) -> None:
        """Keys, values, asset names, watcher names and dedup keys with C1 controls, line
        separators, bidi overrides or rich markup print escaped and literally in tables."""
        odd = "[bold]x\u0085\u202e\u2028y"
        async with SqliteStateBackend(db_path) as backend:
            await backend.events.aregister_assets([Asset(odd)])
            await backend.events.acommit(
                EventCommit(odd, (odd,), '"\\u001b[2J"', dedup_key=odd, state={odd: f'"{odd}"'})
            )
        shown = "[bold]x\\x85\\u202e\\u2028y"
        for args in (
            ["state-store", "list", "--asset", odd],
            ["assets", "list"],
            ["events"],
        ):
            done = await cli(*args)
            assert done.code == 0, done.err
            assert shown in done.out, done.out
            assert all(ch not in done.out for ch in "\x1b\x85\u202e\u2028"), done.out
        events = await cli("events", "--json")
        assert odd in events.out  # --json is for programs: the exact text, JSON-escaped

    async def test_brackets_in_names_print_in_every_table(self, cli: Cli, db_path: Path) -> None:
        """Names written like rich markup (``[orders]``, ``[bold]b``) print literally in the
        tasks, runs, watchers and status tables: they used to vanish as unknown style tags."""
        orders, bold = "[orders]", "[bold]b"
        async with SqliteStateBackend(db_path) as backend:
            await backend.events.aregister_assets([Asset(orders), Asset(bold)])
            await backend.tasks.async_tasks(
                [TaskSpec("[t]", (orders, bold)), TaskSpec("[u]", (orders,))]
            )
            for asset in (orders, bold):
                await backend.events.acommit(EventCommit("[w]", (asset,), "{}"))
            assert await backend.tasks.acreate_run("[t]") is not None
            status = TriggerStatus(
                trigger_id="[trigger]", classpath="pkg.W", assets=(orders,), watchers=("[w]",),
                state="running", updated_at=datetime.now(UTC),
            )  # fmt: skip
            await backend.status.asave_trigger_status([status])
        tasks = await cli("tasks", "list")
        assert tasks.code == 0, tasks.err
        assert "[t]" in tasks.out and "[u]" in tasks.out
        assert f"[{orders}, {bold}]" in tasks.out and f"[{orders}]" in tasks.out, tasks.out
        runs = await cli("runs", "list")
        assert runs.code == 0 and "[t]" in runs.out, runs.out
        watchers = await cli("watchers", "list")
        assert watchers.code == 0 and "[w]" in watchers.out and orders in watchers.out
        shown = await cli("status")
        assert shown.code == 0 and "[w]" in shown.out and orders in shown.out, shown.out


class TestDbMigrate:
    async def test_sqlite_reports_the_migrations_it_applied(self, tmp_path: Path) -> None:
        """On a fresh SQLite file, db migrate names the migrations it applied; then none."""
        cli = Cli(f"sqlite:///{tmp_path / 'fresh.db'}", tmp_path)
        first = await cli("db", "migrate")
        applied = APPLIED
        assert (first.code, first.out) == (0, applied), first.err
        again = await cli("db", "migrate")
        assert (again.code, again.out) == (0, "database schema is up to date\n"), again.err

    async def test_postgres_reports_the_migrations_it_applied(
        self, pg_dsn: str, pg_schema: str, tmp_path: Path
    ) -> None:
        """On a fresh PostgreSQL schema, db migrate names the migrations it applied (it used
        to say "up to date", reading an attribute only SQLite had); then none."""
        cli = Cli(f"{pg_dsn}?search_path={pg_schema}", tmp_path)
        first = await cli("db", "migrate")
        assert (first.code, first.out) == (
            0,
            APPLIED,
        ), first.err
        again = await cli("db", "migrate")
        assert (again.code, again.out) == (0, "database schema is up to date\n"), again.err


class TestSameOnPostgres:
    async def test_the_store_refuses_alike_on_postgres(
        self, cli: Cli, pg_dsn: str, pg_schema: str, tmp_path: Path
    ) -> None:
        """The inputs the store itself refuses print the same error line on PostgreSQL as on
        SQLite (a lone surrogate used to be UnicodeEncodeError on one, a driver error on the
        other)."""
        pg = Cli(f"{pg_dsn}?search_path={pg_schema}", tmp_path)
        assert (await pg("db", "migrate")).code == 0
        assert (await pg("assets", "register", "orders")).code == 0
        for name, args, stdin, code, _ in EDGES:
            if code != 1:
                continue
            on_sqlite, on_postgres = await cli(*args, stdin=stdin), await pg(*args, stdin=stdin)
            assert (on_postgres.code, on_postgres.err) == (on_sqlite.code, on_sqlite.err), name
