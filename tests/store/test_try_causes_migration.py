"""The migration that counts a run's tries by cause fills the counts of existing runs from
their recorded errors (SQLite migration 11, PostgreSQL migration 10)."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
from watchkeeper.store import Asset, PostgresStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskSpec

from tests.support.clock import Clock

TTL = timedelta(seconds=30)


async def lapse_then_fail(store: Any) -> int:
    """A run of a task with two tries: one lost (its lease lapsed), one the task failed."""
    store.clock = Clock()
    await store.events.aregister_assets([Asset("a")])
    await store.tasks.async_tasks([TaskSpec("t", ("a",), max_tries=3)])
    await store.events.acommit(EventCommit("w", ("a",), "1"))
    run = await store.tasks.acreate_run("t")
    await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
    store.clock.advance(31)
    (again,) = await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL)
    await store.tasks.afinish_run(run.id, "w2", again.lease_token, success=False, error="boom")
    return int(run.id)


def strip_causes(errors: str) -> str:
    """The errors JSON as it was recorded before causes were kept."""
    return json.dumps([{k: v for k, v in e.items() if k != "cause"} for e in json.loads(errors)])


async def check_migrated(store: Any, run_id: int) -> None:
    run = await store.tasks.aget_run(run_id)
    assert (run.failures, run.lost_tries, run.state) == (1, 1, "queued")
    assert [e.cause for e in run.errors] == ["worker_lost", "task_error"]


async def test_sqlite_version_10_file_gets_try_counts(tmp_path: Path) -> None:
    """A file from before the counts (version 10) is upgraded by migration 11 alone; a run's
    lapsed try counts as lost, its failure as its own."""
    path = tmp_path / "state.db"
    async with SqliteStateBackend(path) as store:
        run_id = await lapse_then_fail(store)
    conn = sqlite3.connect(path)
    try:
        (errors,) = conn.execute("SELECT errors FROM task_runs WHERE id = ?", (run_id,)).fetchone()
        conn.execute("UPDATE task_runs SET errors = ?", (strip_causes(errors),))
        conn.execute("ALTER TABLE task_runs DROP COLUMN failures")
        conn.execute("ALTER TABLE task_runs DROP COLUMN lost_tries")
        conn.execute("DELETE FROM schema_migrations WHERE version = 11")
        conn.commit()
    finally:
        conn.close()
    async with SqliteStateBackend(path) as store:
        assert store.applied_migrations == [11]
        await check_migrated(store, run_id)


async def test_postgres_version_9_schema_gets_try_counts(pg_dsn: str, pg_schema: str) -> None:
    """A schema from before the counts (version 9) is upgraded by migration 10 alone; a run's
    lapsed try counts as lost, its failure as its own."""
    async with PostgresStateBackend(pg_dsn, schema=pg_schema) as store:
        run_id = await lapse_then_fail(store)
    conn = await asyncpg.connect(pg_dsn)
    try:
        table = f'"{pg_schema}".task_runs'
        errors = await conn.fetchval(f"SELECT errors FROM {table} WHERE id = $1", run_id)
        await conn.execute(f"UPDATE {table} SET errors = $1", strip_causes(errors))
        await conn.execute(f"ALTER TABLE {table} DROP COLUMN failures, DROP COLUMN lost_tries")
        await conn.execute(f'DELETE FROM "{pg_schema}".schema_migrations WHERE version = 10')
    finally:
        await conn.close()
    async with PostgresStateBackend(pg_dsn, schema=pg_schema) as store:
        assert store.applied_migrations == [10]
        await check_migrated(store, run_id)
