"""Pub/Sub benchmark: ``PubSubWatcher`` against raw pull loops committing the same batches.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/pubsub_bench.py [--messages 5000] [--batch-size 100] [--runs 2]

The Pub/Sub emulator (Debian's ``google-cloud-cli-pubsub-emulator``) is started on a free port.
For each side of each run, ``--messages`` JSON messages are published to a fresh topic with a
fresh subscription; then the side reads them all into a fresh SQLite file (WAL,
``synchronous=FULL``), ``--batch-size`` messages per transaction:

- **raw**: ``Pull`` calls of ``--batch-size`` messages (``google.pubsub_v1.SubscriberAsyncClient``,
  the calls the watcher makes); per batch one transaction inserting one event row per message
  (with its dedup key) and upserting the last message id, then one ``Acknowledge`` call: what
  the watcher's durability needs, on aiosqlite, with nothing else;
- **raw stream**: the same, the messages coming from one streaming pull cut into batches of
  ``--batch-size`` (what a streaming watcher would do; for the choice of ``Pull``);
- **watcher**: ``PubSubWatcher`` through the real runtime (``run_trigger`` on
  ``SqliteStateBackend``), which commits each batch as one ``TriggerEventBatch`` and
  acknowledges it after the commit.

The emulator is one local Java process: both sides mostly wait for it and for the disk, so the
ratio says what the watcher adds around the same calls, not what the service sustains. Prints
messages/s of each (the best of ``--runs``) and the ratio watcher/raw; writes
``benchmarks/results/pubsub.json`` (the ratio is against **raw**, the same calls).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
from google.pubsub_v1.types import ReceivedMessage, StreamingPullRequest
from watchkeeper.watchers import PubSubWatcher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _watcher_bench import Rates, timed_watcher

from tests.support.pubsub import make_subscription, publish, pubsub_emulator, subscriber

_SCHEMA = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    """CREATE TABLE asset_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, asset_name TEXT NOT NULL, payload TEXT NOT NULL,
        dedup_key TEXT, created_at TEXT NOT NULL)""",
    "CREATE UNIQUE INDEX asset_events_dedup ON asset_events (asset_name, dedup_key)",
    """CREATE TABLE asset_state (
        asset_name TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (asset_name, key))""",
)
_EVENT = "INSERT INTO asset_events (asset_name, payload, dedup_key, created_at) VALUES (?, ?, ?, ?)"
_STATE = (
    "INSERT INTO asset_state (asset_name, key, value) VALUES ('bench', 'message_id', ?) "
    "ON CONFLICT (asset_name, key) DO UPDATE SET value = excluded.value"
)


async def fill(host: str, messages: int) -> str:
    """A fresh subscription whose topic holds ``messages`` JSON messages; its path."""
    topic, subscription = await make_subscription(host, ack_deadline=60)
    for start in range(0, messages, 500):
        bodies = [
            json.dumps({"n": n, "pad": "x" * 100}).encode()
            for n in range(start, min(start + 500, messages))
        ]
        await publish(host, topic, bodies)
    return subscription


async def commit(conn: aiosqlite.Connection, batch: list[ReceivedMessage]) -> None:
    """One transaction: an event row per message, with its dedup key, and the last id."""
    stamp = datetime.now(UTC).isoformat()
    rows = [
        (
            "bench",
            json.dumps({"message_id": m.message.message_id, "data": json.loads(m.message.data)}),
            f"raw:pubsub:{m.message.message_id}",
            stamp,
        )
        for m in batch
    ]
    await conn.execute("BEGIN IMMEDIATE")
    await conn.executemany(_EVENT, rows)
    await conn.execute(_STATE, (json.dumps(batch[-1].message.message_id),))
    await conn.execute("COMMIT")


async def raw_pull_loop(
    host: str, subscription: str, messages: int, batch_size: int, db: Path
) -> float:
    """Seconds the raw loop takes to pull, commit and acknowledge ``messages`` messages."""
    async with aiosqlite.connect(db, isolation_level=None) as conn, subscriber(host) as client:
        for statement in _SCHEMA:
            await conn.execute(statement)
        start = time.perf_counter()
        done = 0
        while done < messages:
            answer = await client.pull(
                subscription=subscription, max_messages=batch_size, retry=None, timeout=30
            )
            batch = list(answer.received_messages)
            if not batch:
                await anyio.sleep(0.5)
                continue
            await commit(conn, batch)
            await client.acknowledge(
                subscription=subscription,
                ack_ids=[m.ack_id for m in batch],
                retry=None,
                timeout=30,
            )
            done += len(batch)
        return time.perf_counter() - start


async def raw_stream_loop(
    host: str, subscription: str, messages: int, batch_size: int, db: Path
) -> float:
    """Seconds the streaming loop takes to commit and acknowledge ``messages`` messages."""
    done_writing = anyio.Event()

    async def requests() -> AsyncIterator[StreamingPullRequest]:
        yield StreamingPullRequest(
            subscription=subscription,
            stream_ack_deadline_seconds=60,
            max_outstanding_messages=2 * batch_size,
        )
        await done_writing.wait()

    async with aiosqlite.connect(db, isolation_level=None) as conn, subscriber(host) as client:
        for statement in _SCHEMA:
            await conn.execute(statement)
        start = time.perf_counter()
        call: Any = await client.streaming_pull(requests=requests(), retry=None, timeout=None)
        done = 0
        pending: list[ReceivedMessage] = []
        while done < messages:
            if not pending:
                response = await call.read()
                pending.extend(response.received_messages)
                continue
            batch, pending = pending[:batch_size], pending[batch_size:]
            await commit(conn, batch)
            await client.acknowledge(
                subscription=subscription,
                ack_ids=[m.ack_id for m in batch],
                retry=None,
                timeout=30,
            )
            done += len(batch)
        elapsed = time.perf_counter() - start
        done_writing.set()
        call.cancel()
        return elapsed


async def watcher_loop(
    host: str, subscription: str, messages: int, batch_size: int, db: Path
) -> float:
    """Seconds ``PubSubWatcher`` takes to pull and commit ``messages`` messages."""
    watcher = PubSubWatcher(subscription, emulator_host=host, batch_size=batch_size)
    return await timed_watcher(watcher, messages, db, "messages")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5_000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    rates = Rates(args.messages, "raw", "raw_stream", "watcher")
    with pubsub_emulator() as host:
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                subscription = await fill(host, args.messages)
                raw = await raw_pull_loop(
                    host, subscription, args.messages, args.batch_size, Path(tmp) / "raw.db"
                )
                subscription = await fill(host, args.messages)
                stream = await raw_stream_loop(
                    host, subscription, args.messages, args.batch_size, Path(tmp) / "rs.db"
                )
                subscription = await fill(host, args.messages)
                mine = await watcher_loop(
                    host, subscription, args.messages, args.batch_size, Path(tmp) / "wk.db"
                )
            rates.add(run, raw=raw, raw_stream=stream, watcher=mine)
    rates.write("pubsub", messages=args.messages, batch_size=args.batch_size)


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
