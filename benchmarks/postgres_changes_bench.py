"""PostgreSQL change capture benchmark: ``PostgresChangesWatcher`` against a raw loop reading
the same slot and committing the same batches.

Not a test (CI does not run it). Run by hand from the repository root (as root it runs the
server as the ``postgres`` user):

    uv run python benchmarks/postgres_changes_bench.py [--rows 20000] [--batch-size 500] [--runs 3]

A throwaway cluster with ``wal_level=logical`` is made and started (``tests/support/
pg_logical.py``). For each side of each run a fresh table gets ``--rows`` inserted rows, in
source transactions of 10 rows, with a slot made before the first; then the side reads them
all into a fresh SQLite file (WAL, ``synchronous=FULL``):

- **raw**: the same cycle with nothing around it: ``pg_logical_slot_peek_binary_changes``
  (through a cursor, ``--batch-size`` rows per fetch), the same ``pgoutput`` decoder, one
  transaction per batch of whole source transactions on aiosqlite inserting one event row per
  change and upserting the position, then ``pg_replication_slot_advance``;
- **watcher**: ``PostgresChangesWatcher`` through the real runtime (``run_trigger`` on
  ``SqliteStateBackend``).

Prints changes/s of each (the best of ``--runs``) and the ratio watcher/raw; writes
``benchmarks/results/postgres_changes.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.to_thread
import asyncpg
from watchkeeper.watchers import PostgresChangesWatcher
from watchkeeper.watchers._pgoutput import Begin, Commit, PgOutputDecoder, format_lsn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _watcher_bench import Rates, timed_watcher

from tests.support.pg_logical import logical_cluster

_SCHEMA = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    """CREATE TABLE asset_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, asset_name TEXT NOT NULL, payload TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    """CREATE TABLE asset_state (
        asset_name TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (asset_name, key))""",
)
_EVENT = "INSERT INTO asset_events (asset_name, payload, created_at) VALUES (?, ?, ?)"
_STATE = (
    "INSERT INTO asset_state (asset_name, key, value) VALUES ('bench', 'position', ?) "
    "ON CONFLICT (asset_name, key) DO UPDATE SET value = excluded.value"
)
_PEEK = (
    "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes("
    "$1, $2, $3, 'proto_version', '1', 'publication_names', $4)"
)
_PER_TRANSACTION = 10


async def fill(dsn: str, rows: int) -> str:
    """A fresh table, its publication and slot (both named ``wk_<table>``), then ``rows``
    rows inserted in transactions of 10; the slot's name."""
    table = f"bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"CREATE TABLE {table} (id int PRIMARY KEY, name text, qty int, price numeric)"
        )
        await conn.execute(f"CREATE PUBLICATION wk_{table} FOR TABLE {table}")
        await conn.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f"wk_{table}"
        )
        for start in range(0, rows, _PER_TRANSACTION):
            async with conn.transaction():
                await conn.executemany(
                    f"INSERT INTO {table} VALUES ($1, $2, $3, $4)",
                    [
                        (n, f"item {n}", n % 7, f"{n}.25")
                        for n in range(start, min(start + _PER_TRANSACTION, rows))
                    ],
                )
    finally:
        await conn.close()
    return f"wk_{table}"


def _payload(change: Any, begin: Begin, lsn: int) -> dict[str, Any]:
    relation = change.relation
    return {
        "schema": relation.schema,
        "table": relation.table,
        "op": change.op,
        "new": change.new,
        "old": change.old,
        "unchanged": change.unchanged,
        "xid": begin.xid,
        "commit_lsn": format_lsn(begin.final_lsn),
        "commit_time": begin.commit_time,
        "lsn": format_lsn(lsn),
    }


async def raw_loop(dsn: str, slot: str, rows: int, batch_size: int, db: Path) -> float:
    """Seconds the raw cycle takes to peek, decode, commit and confirm ``rows`` changes."""
    conn = await asyncpg.connect(dsn)
    try:
        async with aiosqlite.connect(db, isolation_level=None) as lite:
            for statement in _SCHEMA:
                await lite.execute(statement)

            async def commit(events: list[dict[str, Any]], end: int) -> None:
                stamp = datetime.now(UTC).isoformat()
                await lite.execute("BEGIN IMMEDIATE")
                await lite.executemany(_EVENT, [("bench", json.dumps(e), stamp) for e in events])
                await lite.execute(_STATE, (json.dumps({"lsn": format_lsn(end)}),))
                await lite.execute("COMMIT")

            start = time.perf_counter()
            done = 0
            while done < rows:
                flush = await conn.fetchval("SELECT pg_current_wal_flush_lsn()")
                decoder = PgOutputDecoder()
                batch: list[dict[str, Any]] = []
                pending: list[dict[str, Any]] = []
                begin: Begin | None = None
                end = 0
                async with conn.transaction(readonly=True):
                    cursor = await conn.cursor(_PEEK, slot, flush, 10_000, slot)
                    while records := await cursor.fetch(batch_size):
                        for lsn, data in records:
                            message = decoder.decode(data)
                            if isinstance(message, Begin):
                                begin, pending = message, []
                            elif isinstance(message, Commit):
                                if batch and len(batch) + len(pending) > batch_size:
                                    await commit(batch, end)
                                    done += len(batch)
                                    batch = []
                                batch += pending
                                end = message.end_lsn
                                if len(batch) >= batch_size:
                                    await commit(batch, end)
                                    done += len(batch)
                                    batch = []
                            elif message is not None and begin is not None:
                                found = message if isinstance(message, list) else [message]
                                pending += [_payload(c, begin, lsn) for c in found]
                    if batch:
                        await commit(batch, end)
                        done += len(batch)
                if end:
                    await conn.execute("SELECT pg_replication_slot_advance($1, $2)", slot, end)
            return time.perf_counter() - start
    finally:
        await conn.close()


async def watcher_loop(dsn: str, slot: str, rows: int, batch_size: int, db: Path) -> float:
    """Seconds ``PostgresChangesWatcher`` takes to read and commit ``rows`` changes."""
    watcher = PostgresChangesWatcher(dsn, slot, slot, batch_size=batch_size, poll_interval=0.1)
    return await timed_watcher(watcher, rows, db, "changes")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rates = Rates(args.rows, "raw", "watcher")
    with logical_cluster() as cluster:
        dsn = cluster.dsn
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                slot = await fill(dsn, args.rows)
                raw = await raw_loop(dsn, slot, args.rows, args.batch_size, Path(tmp) / "raw.db")
                slot = await fill(dsn, args.rows)
                mine = await watcher_loop(
                    dsn, slot, args.rows, args.batch_size, Path(tmp) / "wk.db"
                )
            rates.add(run, raw=raw, watcher=mine)
    rates.write(
        "postgres_changes",
        rows=args.rows,
        batch_size=args.batch_size,
        rows_per_transaction=_PER_TRANSACTION,
    )


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
