"""SQS benchmark: ``SqsWatcher`` against a raw aiobotocore loop committing the same batches.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/sqs_bench.py [--messages 1000] [--batch-size 10] [--runs 2]

``moto_server`` (the ``moto[server]`` dev dependency) is started on a free port. For each side
of each run, ``--messages`` JSON messages are sent to a fresh standard queue; then the side
reads them all, ``--batch-size`` per receive (SQS allows 10), into a fresh SQLite file (WAL,
``synchronous=FULL``):

- **raw**: ``receive_message`` (long polling), one transaction inserting one event row per
  message (with its dedup key) and upserting the last message id, then
  ``delete_message_batch``: what the watcher's durability needs, on aiosqlite, with nothing
  else;
- **watcher**: ``SqsWatcher`` through the real runtime (``run_trigger`` on
  ``SqliteStateBackend``), which commits each receive as one ``TriggerEventBatch``.

moto answers one call at a time and is far slower than SQS, so both sides mostly wait for it:
the ratio says what the watcher adds around the same calls, not what SQS itself sustains.
Prints messages/s of each (the best of ``--runs``) and the ratio watcher/raw; writes
``benchmarks/results/sqs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
from aiobotocore.session import get_session
from watchkeeper.watchers import SqsWatcher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _raw_tables import sqlite_tables
from _watcher_bench import Rates, timed_watcher

from tests.support.aws import AWS_ENV, moto_server

_EVENT = (
    "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, created_at) "
    "VALUES (1, ?, 'raw', ?, ?, ?)"
)
_STATE = (
    "INSERT INTO asset_state (asset_id, key, value, version, updated_at) "
    "VALUES (1, 'message_id', ?, 1, ?) ON CONFLICT (asset_id, key) DO UPDATE SET "
    "value = excluded.value, version = asset_state.version + 1, updated_at = excluded.updated_at"
)


async def fill_queue(sqs: Any, messages: int) -> str:
    """A fresh queue holding ``messages`` JSON messages; its URL."""
    answer = await sqs.create_queue(QueueName=f"wk-bench-{uuid.uuid4().hex[:10]}")
    queue = str(answer["QueueUrl"])
    for start in range(0, messages, 10):
        entries = [
            {"Id": str(n), "MessageBody": json.dumps({"n": n, "pad": "x" * 100})}
            for n in range(start, min(start + 10, messages))
        ]
        await sqs.send_message_batch(QueueUrl=queue, Entries=entries)
    return queue


async def raw_loop(sqs: Any, queue: str, messages: int, batch_size: int, db: Path) -> float:
    """Seconds the raw loop takes to receive, commit and delete ``messages`` messages."""
    async with aiosqlite.connect(db, isolation_level=None) as conn:
        for statement in sqlite_tables():
            await conn.execute(statement)
        start = time.perf_counter()
        done = 0
        while done < messages:
            answer = await sqs.receive_message(
                QueueUrl=queue,
                MaxNumberOfMessages=batch_size,
                WaitTimeSeconds=1,
                VisibilityTimeout=60,
                MessageSystemAttributeNames=["All"],
            )
            found = answer.get("Messages") or []
            if not found:
                continue
            stamp = datetime.now(UTC).isoformat()
            rows = [
                (
                    "bench",
                    json.dumps({"message_id": m["MessageId"], "data": json.loads(m["Body"])}),
                    f"raw:sqs:{m['MessageId']}",
                    stamp,
                )
                for m in found
            ]
            await conn.execute("BEGIN IMMEDIATE")
            await conn.executemany(_EVENT, rows)
            await conn.execute(_STATE, (json.dumps(found[-1]["MessageId"]), stamp))
            await conn.execute("COMMIT")
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(found)
            ]
            await sqs.delete_message_batch(QueueUrl=queue, Entries=entries)
            done += len(found)
        return time.perf_counter() - start


async def watcher_loop(
    endpoint: str, queue: str, messages: int, batch_size: int, db: Path
) -> float:
    """Seconds ``SqsWatcher`` takes to receive and commit ``messages`` messages."""
    watcher = SqsWatcher(queue, endpoint_url=endpoint, batch_size=batch_size, wait_time=1)
    return await timed_watcher(watcher, messages, db, "messages")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    os.environ.update(AWS_ENV)
    rates = Rates(args.messages, "raw", "watcher")
    with moto_server() as endpoint:
        async with get_session().create_client(
            "sqs", region_name="us-east-1", endpoint_url=endpoint
        ) as sqs:
            for run in range(args.runs):
                with tempfile.TemporaryDirectory() as tmp:
                    queue = await fill_queue(sqs, args.messages)
                    raw = await raw_loop(
                        sqs, queue, args.messages, args.batch_size, Path(tmp) / "raw.db"
                    )
                    queue = await fill_queue(sqs, args.messages)
                    mine = await watcher_loop(
                        endpoint, queue, args.messages, args.batch_size, Path(tmp) / "wk.db"
                    )
                rates.add(run, raw=raw, watcher=mine)
    rates.write("sqs", messages=args.messages, batch_size=args.batch_size)


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
