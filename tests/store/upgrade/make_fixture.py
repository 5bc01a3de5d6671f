"""Build the upgrade fixtures: a SQLite file and a PostgreSQL dump written by an old commit.

Run with that commit's code, not today's, so the files are what a user of it has on disk
(7461c42 is the 0.1.0 release):

    git worktree add /tmp/old 7461c42
    (cd /tmp/old && uv sync --locked && \
        uv run python "$REPO/tests/store/upgrade/make_fixture.py" \
            --out "$REPO/tests/store/upgrade" --commit 7461c42)
    git worktree remove --force /tmp/old

It writes ``<commit>.db`` (SQLite), ``<commit>.sql`` (``pg_dump --no-owner`` of a fresh
database holding the store in its default schema) and ``<commit>.json``: what that code read
back from both, which ``test_upgrade.py`` expects today's code to read from them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import urllib.parse
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import watchkeeper.store
from watchkeeper.store import (
    NEVER_EXPIRE,
    Asset,
    AssetScope,
    PostgresStateBackend,
    SqliteStateBackend,
    TaskScope,
)

# This script writes the fixtures with the code of the commit they are named after (e351c1b),
# whose store exported these records from `watchkeeper.store.backend`; today's code has them in
# `watchkeeper.store.protocols`. Import whichever this checkout has.
try:
    from watchkeeper.store.protocols import EventBatchCommit, EventCommit, TaskSpec, Writer
except ImportError:  # e351c1b
    from watchkeeper.store.backend import (  # type: ignore[import-untyped,no-redef,unused-ignore]
        EventBatchCommit,
        EventCommit,
        TaskSpec,
        Writer,
    )

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
TASK_SCOPES = (TaskScope("etl", "run_1", "load"), TaskScope("etl", "run_1", "load", map_index=2))
ASSET_SCOPES = (AssetScope(name="orders"), AssetScope(name="payments"))


class _Clock:
    """A clock that moves one second per reading, so every timestamp is distinct."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


async def fill(store: Any) -> None:
    """Events (single, deduplicated, a batch), asset and task state, tasks with runs in
    three states, a consumer's cursor and a paused watcher."""
    store.clock = _Clock()
    writer = Writer("watcher", "orders_feed")
    await store.aregister_assets(
        [Asset("orders", uri="s3://bucket/orders"), Asset("payments"), Asset("refunds")]
    )
    await store.async_tasks(
        [TaskSpec("load", ("orders",), max_tries=2), TaskSpec("audit", ("payments",))]
    )
    await store.acommit_event(
        EventCommit("orders_feed", ("orders",), '{"n":1}', None, {"watermark": "1"}, writer)
    )
    await store.acommit_event(
        EventCommit("orders_feed", ("orders",), '{"n":2}', "msg-2", {"watermark": "2"}, writer)
    )
    # A redelivered message: no event, no state.
    await store.acommit_event(
        EventCommit("orders_feed", ("orders",), '{"n":2}', "msg-2", {"watermark": "0"}, writer)
    )
    await store.acommit_events(
        EventBatchCommit(
            "payments_feed",
            ("payments",),
            (('{"p":"a"}', "p-1"), ('{"p":"b"}', None), ('["x",1.5,null]', "p-3")),
            {"cursor": '"2026-12-03"'},
        )
    )
    await store.aset(AssetScope(name="orders"), "schema", {"cols": ["id", "at"], "v": 2})
    await store.aset(AssetScope(name="refunds"), "note", "nothing yet")
    await store.aset(TASK_SCOPES[0], "rows", 120, retention=NEVER_EXPIRE)
    await store.aset(TASK_SCOPES[0], "checkpoint", [1, 2, 3], retention=timedelta(days=7))
    await store.aset(TASK_SCOPES[1], "partial", {"ok": True})
    # Runs: one succeeded, one failed once and queued again, one queued.
    done = await store.acreate_run("load")
    (claimed,) = await store.aclaim_runs("worker-1", limit=1, ttl=timedelta(seconds=30))
    await store.afinish_run(done.id, "worker-1", claimed.lease_token, success=True)
    await store.acommit_event(
        EventCommit("orders_feed", ("orders",), '{"n":3}', None, {"watermark": "3"}, writer)
    )
    again = await store.acreate_run("load")
    (claimed,) = await store.aclaim_runs("worker-1", limit=1, ttl=timedelta(seconds=30))
    await store.afinish_run(again.id, "worker-1", claimed.lease_token, success=False, error="boom")
    await store.acreate_run("audit")
    await store.aconsumer_ack("reporter", 2)
    await store.aset_watcher_paused("orders_feed", True, by="ops")


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


async def read_back(store: Any) -> dict[str, Any]:
    """What a user reads from the store: the same keys whichever code reads it.

    Today's code reads through the store's services; e351c1b's (which wrote the fixtures and
    their expected reads) had the same calls on the backend itself.
    """
    events_of = getattr(store, "events", store)
    tasks_of = getattr(store, "tasks", store)
    controls_of = getattr(store, "controls", store)
    events = await events_of.alist_events()
    try:
        runs = await tasks_of.alist_runs(event_ids=True)
        run_events = {r.id: list(r.event_ids) for r in runs}
    except TypeError:  # 7461c42's listing has no event ids: each run read alone
        runs = await tasks_of.alist_runs()
        run_events = {r.id: [e.id for e in (await tasks_of.aget_run(r.id)).events] for r in runs}
    state: dict[str, Any] = {}
    for scope in (*ASSET_SCOPES, AssetScope(name="refunds")):
        state[f"asset:{scope.name}"] = [
            [e.key, e.value, e.version] for e in await store.alist(scope)
        ]
    for task_scope in TASK_SCOPES:
        state[f"task:{task_scope.map_index}"] = [
            [e.key, e.value, e.version, e.never_expire, _when(e.expires_at)]
            for e in await store.alist(task_scope)
        ]
    return {
        "assets": [[a.name, a.uri, a.active] for a in await events_of.alist_assets()],
        "events": [e.to_record() for e in events],
        "state": state,
        "tasks": [
            [t.name, list(t.spec.assets), t.spec.max_tries, t.paused, dict(t.cursors)]
            for t in await tasks_of.alist_tasks()
        ],
        "runs": [
            [r.id, r.task, r.state, r.try_number, r.max_tries, r.event_count, run_events[r.id]]
            for r in sorted(runs, key=lambda r: r.id)
        ],
        "consumer": await tasks_of.aconsumer_position("reporter"),
        "controls": [
            [c.watcher, c.paused, c.updated_by] for c in await controls_of.alist_watcher_controls()
        ],
    }


def _database_dsn(dsn: str, name: str) -> str:
    url = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(url._replace(path=f"/{name}"))


async def build_postgres(dsn: str, dump: Path) -> dict[str, Any]:
    name = f"wk_upgrade_fixture_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        target = _database_dsn(dsn, name)
        async with PostgresStateBackend(target) as store:
            await fill(store)
            seen = await read_back(store)
        await anyio.run_process(
            ["pg_dump", "--no-owner", "--no-privileges", "--file", str(dump), target], check=True
        )
        return seen
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def build_sqlite(path: Path) -> dict[str, Any]:
    async with SqliteStateBackend(path) as store:
        await fill(store)
        seen = await read_back(store)
    # One file, nothing left in a write-ahead log beside it.
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    return seen


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default="e351c1b")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args(argv)
    source = Path(watchkeeper.store.__file__).resolve()
    print(f"building with the store at {source}")
    out: Path = args.out
    (out / f"{args.commit}.db").unlink(missing_ok=True)
    expected = {
        "commit": args.commit,
        "sqlite": asyncio.run(build_sqlite(out / f"{args.commit}.db")),
        "postgres": asyncio.run(build_postgres(args.dsn, out / f"{args.commit}.sql")),
    }
    (out / f"{args.commit}.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
