"""S3 benchmark: ``S3PrefixWatcher`` against a raw aiobotocore loop committing the same pages.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/s3_bench.py [--objects 5000] [--page-size 1000] [--runs 3]

``moto_server`` (the ``moto[server]`` dev dependency) is started on a free port and one bucket
is filled with ``--objects`` small objects under a prefix, once: listing does not consume
them, so every side of every run reads the same bucket. Each side lists the whole prefix,
``--page-size`` keys per ``ListObjectsV2`` call, and commits each page's objects into a fresh
SQLite file (WAL, ``synchronous=FULL``):

- **raw**: ``list_objects_v2`` with the continuation token, then one transaction per page
  inserting one event row per object (key, size, ETag, time) and upserting the last key as
  the watermark: what the watcher's durability needs, on aiosqlite, with nothing else;
- **watcher**: ``S3PrefixWatcher`` through the real runtime (``run_trigger`` on
  ``SqliteStateBackend``), which commits each page as one ``TriggerEventBatch`` with its lag
  window (the versions emitted within it) in the state.

The sides alternate, raw first, in each run. moto lists far slower than S3, so both sides
wait for it most of the time: the ratio says what the watcher adds around the same calls.
Prints objects/s of each (the best of ``--runs``) and the ratio watcher/raw; writes
``benchmarks/results/s3.json``.
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
from watchkeeper.watchers import S3PrefixWatcher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _watcher_bench import Rates, timed_watcher

from tests.support.aws import AWS_ENV, moto_server

PREFIX = "bench/"
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
    "INSERT INTO asset_state (asset_name, key, value) VALUES ('bench', 'watermark', ?) "
    "ON CONFLICT (asset_name, key) DO UPDATE SET value = excluded.value"
)


async def fill_bucket(s3: Any, objects: int) -> str:
    """A fresh bucket holding ``objects`` small objects under :data:`PREFIX`; its name."""
    bucket = f"wk-bench-{uuid.uuid4().hex[:10]}"
    await s3.create_bucket(Bucket=bucket)

    async def put(n: int) -> None:
        body = json.dumps({"n": n, "pad": "x" * 100}).encode()
        await s3.put_object(Bucket=bucket, Key=f"{PREFIX}{n:08d}.json", Body=body)

    for start in range(0, objects, 20):
        async with anyio.create_task_group() as tg:
            for n in range(start, min(start + 20, objects)):
                tg.start_soon(put, n)
    return bucket


async def raw_loop(s3: Any, bucket: str, objects: int, page_size: int, db: Path) -> float:
    """Seconds the raw loop takes to list and commit ``objects`` objects."""
    async with aiosqlite.connect(db, isolation_level=None) as conn:
        for statement in _SCHEMA:
            await conn.execute(statement)
        start = time.perf_counter()
        done = 0
        token: str | None = None
        while True:
            arguments: dict[str, Any] = {"Bucket": bucket, "Prefix": PREFIX, "MaxKeys": page_size}
            if token is not None:
                arguments["ContinuationToken"] = token
            page = await s3.list_objects_v2(**arguments)
            found = page.get("Contents") or []
            if found:
                stamp = datetime.now(UTC).isoformat()
                rows = [
                    (
                        "bench",
                        json.dumps(
                            {
                                "bucket": bucket,
                                "key": o["Key"],
                                "size": o["Size"],
                                "etag": o["ETag"].strip('"'),
                                "last_modified": o["LastModified"].isoformat(),
                            }
                        ),
                        stamp,
                    )
                    for o in found
                ]
                await conn.execute("BEGIN IMMEDIATE")
                await conn.executemany(_EVENT, rows)
                await conn.execute(_STATE, (json.dumps(found[-1]["Key"]),))
                await conn.execute("COMMIT")
                done += len(found)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        elapsed = time.perf_counter() - start
    if done < objects:
        raise RuntimeError(f"the raw loop committed {done} of {objects} objects")
    return elapsed


async def watcher_loop(endpoint: str, bucket: str, objects: int, page_size: int, db: Path) -> float:
    """Seconds ``S3PrefixWatcher`` takes to list and commit ``objects`` objects."""
    watcher = S3PrefixWatcher(
        bucket, PREFIX, endpoint_url=endpoint, page_size=page_size, poll_interval=0.1
    )
    return await timed_watcher(watcher, objects, db, "objects")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=5_000)
    parser.add_argument("--page-size", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(AWS_ENV)
    rates = Rates(args.objects, "raw", "watcher")
    with moto_server() as endpoint:
        async with get_session().create_client(
            "s3", region_name="us-east-1", endpoint_url=endpoint
        ) as s3:
            filled = time.perf_counter()
            bucket = await fill_bucket(s3, args.objects)
            print(f"filled {args.objects} objects in {time.perf_counter() - filled:.1f} s")
            for run in range(args.runs):
                with tempfile.TemporaryDirectory() as tmp:
                    raw = await raw_loop(
                        s3, bucket, args.objects, args.page_size, Path(tmp) / "raw.db"
                    )
                    mine = await watcher_loop(
                        endpoint, bucket, args.objects, args.page_size, Path(tmp) / "wk.db"
                    )
                rates.add(run, raw=raw, watcher=mine)
    rates.write("s3", objects=args.objects, page_size=args.page_size)


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
