"""Databases written by an earlier release open with today's code, which migrates them and
reads back everything they held.

The fixtures were written by commit e351c1b's own code (``make_fixture.py``, which says how):
a SQLite file, and a ``pg_dump`` of a PostgreSQL database; ``e351c1b.json`` is what that
code read back from them. Opening either runs today's pending migrations; the events, state,
tasks, runs, the consumer's cursor and the watcher controls must read back as they did, and
the upgraded store must take new writes after the old rows.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend
from watchkeeper.store.postgres.schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from watchkeeper.store.protocols import EventCommit
from watchkeeper.store.sqlite.schema import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION

from tests.store.upgrade.make_fixture import read_back
from tests.support.postgres import PgDatabase
from tests.support.requires import unavailable

HERE = Path(__file__).parent
COMMIT = "e351c1b"
EXPECTED: dict[str, Any] = json.loads((HERE / f"{COMMIT}.json").read_text())


async def check_takes_writes(store: Any, seen: dict[str, Any]) -> None:
    """A new event gets an id after every old one, and the old task schedules it."""
    last = max(event["id"] for event in seen["events"])
    (event,) = await store.events.acommit(EventCommit("orders_feed", ("orders",), '{"n":4}'))
    assert event.id > last
    run = await store.tasks.acreate_run("load")
    assert run is not None
    assert [e.id for e in (await store.tasks.aget_run(run.id)).events] == [event.id]


def test_the_fixtures_were_written_by_the_old_commit() -> None:
    """The expectations name the commit whose code wrote the files, and hold data."""
    assert EXPECTED["commit"] == COMMIT
    for kind in ("sqlite", "postgres"):
        seen = EXPECTED[kind]
        assert len(seen["events"]) == 6 and len(seen["runs"]) == 3, kind
        assert {run[2] for run in seen["runs"]} == {"success", "queued"}, kind


async def test_sqlite_file_of_e351c1b_upgrades_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copyfile(HERE / f"{COMMIT}.db", path)
    async with SqliteStateBackend(path) as store:
        seen = await read_back(store)
        assert seen == EXPECTED["sqlite"]
        await check_takes_writes(store, seen)
    conn = sqlite3.connect(path)
    try:
        (top,) = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
    finally:
        conn.close()
    assert top == SQLITE_SCHEMA_VERSION
    # Opened again: nothing left to migrate, and the old rows are still there.
    async with SqliteStateBackend(path) as store:
        assert store.applied_migrations == []
        assert (await read_back(store))["events"][:6] == EXPECTED["sqlite"]["events"]


async def test_postgres_dump_of_e351c1b_upgrades_and_reads_back(
    pg_database: PgDatabase,
) -> None:
    psql = shutil.which("psql")
    if psql is None:
        unavailable("psql (PostgreSQL's client) is not installed")
    await anyio.run_process(
        [psql, "--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-f", str(HERE / f"{COMMIT}.sql"),
         pg_database.dsn],
        check=True,
    )  # fmt: skip
    async with PostgresStateBackend(pg_database.dsn) as store:
        conn = await asyncpg.connect(pg_database.dsn)
        try:
            top = await conn.fetchval("SELECT max(version) FROM public.schema_migrations")
        finally:
            await conn.close()
        assert top == PG_SCHEMA_VERSION
        seen = await read_back(store)
        assert seen == EXPECTED["postgres"]
        await check_takes_writes(store, seen)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_read_back_covers_every_kind_of_row(kind: str) -> None:
    """What the tests compare names each kind of row the fixture wrote (so a reader that
    silently returned nothing of one kind would not pass)."""
    seen = EXPECTED[kind]
    assert seen["consumer"] == 2
    assert seen["controls"] == [["orders_feed", True, "ops"]]
    assert {k for k, rows in seen["state"].items() if rows} == {
        "asset:orders", "asset:payments", "asset:refunds", "task:-1", "task:2",
    }  # fmt: skip
    assert [task[0] for task in seen["tasks"]] == ["audit", "load"]
