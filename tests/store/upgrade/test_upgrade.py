"""Databases written by an earlier release open with today's code, which migrates them and
reads back everything they held.

The fixtures were written by the code of two commits (``make_fixture.py``, which says how):
7461c42, the 0.1.0 release, and e351c1b, the next one's start. Each is a SQLite file and a
``pg_dump`` of a PostgreSQL database; ``<commit>.json`` is what that code read back from them
(an event's ``created_at`` then had no microseconds on a whole second, so times compare as
times). Opening either runs today's pending migrations; the events, state,
tasks, runs, the consumer's cursor and the watcher controls must read back as they did, and
the upgraded store must take new writes after the old rows.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from datetime import datetime
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
COMMITS = ("7461c42", "e351c1b")
"""0.1.0, and the start of the next release."""
EXPECTED: dict[str, dict[str, Any]] = {
    commit: json.loads((HERE / f"{commit}.json").read_text()) for commit in COMMITS
}
by_commit = pytest.mark.parametrize("commit", COMMITS)


def as_read(seen: dict[str, Any]) -> dict[str, Any]:
    """``seen`` with each event's ``created_at`` as a time, not as the text one version wrote."""
    events = [{**e, "created_at": datetime.fromisoformat(e["created_at"])} for e in seen["events"]]
    return {**seen, "events": events}


async def check_takes_writes(store: Any, seen: dict[str, Any]) -> None:
    """A new event gets an id after every old one, and the old task schedules it."""
    last = max(event["id"] for event in seen["events"])
    (event,) = await store.events.acommit(EventCommit("orders_feed", ("orders",), '{"n":4}'))
    assert event.id > last
    run = await store.tasks.acreate_run("load")
    assert run is not None
    assert [e.id for e in (await store.tasks.aget_run(run.id)).events] == [event.id]


@by_commit
def test_the_fixtures_were_written_by_the_old_commit(commit: str) -> None:
    """The expectations name the commit whose code wrote the files, and hold data."""
    assert EXPECTED[commit]["commit"] == commit
    for kind in ("sqlite", "postgres"):
        seen = EXPECTED[commit][kind]
        assert len(seen["events"]) == 6 and len(seen["runs"]) == 3, kind
        assert {run[2] for run in seen["runs"]} == {"success", "queued"}, kind


@by_commit
async def test_sqlite_file_upgrades_and_reads_back(commit: str, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copyfile(HERE / f"{commit}.db", path)
    async with SqliteStateBackend(path) as store:
        seen = await read_back(store)
        assert as_read(seen) == as_read(EXPECTED[commit]["sqlite"])
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
        again = as_read(await read_back(store))["events"][:6]
        assert again == as_read(EXPECTED[commit]["sqlite"])["events"]


@by_commit
async def test_postgres_dump_upgrades_and_reads_back(commit: str, pg_database: PgDatabase) -> None:
    psql = shutil.which("psql")
    if psql is None:
        unavailable("psql (PostgreSQL's client) is not installed")
    await anyio.run_process(
        [psql, "--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-f", str(HERE / f"{commit}.sql"),
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
        assert as_read(seen) == as_read(EXPECTED[commit]["postgres"])
        await check_takes_writes(store, seen)


@by_commit
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_read_back_covers_every_kind_of_row(commit: str, kind: str) -> None:
    """What the tests compare names each kind of row the fixture wrote (so a reader that
    silently returned nothing of one kind would not pass)."""
    seen = EXPECTED[commit][kind]
    assert seen["consumer"] == 2
    assert seen["controls"] == [["orders_feed", True, "ops"]]
    assert {k for k, rows in seen["state"].items() if rows} == {
        "asset:orders", "asset:payments", "asset:refunds", "task:-1", "task:2",
    }  # fmt: skip
    assert [task[0] for task in seen["tasks"]] == ["audit", "load"]
