"""Store benchmark: aset/aget latency and write throughput, beside raw-driver baselines.

Not a test. Run by hand from the repository root:

    python3 -m uv run python benchmarks/store_bench.py [--quick] [--no-postgres]

Every figure is measured in the same run as its baseline (raw sqlite3, raw aiosqlite, raw
asyncpg doing the same upsert: one per transaction, and in 1000-row transactions as the
ceiling of group commit; for N concurrent writers on SQLite, a raw aiosqlite group-commit
pipeline doing the same upserts from N coroutines), because this machine is shared and noisy; the ratios are the
result. Writes a JSON file to benchmarks/results/store.json (the load average is recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.abc
import asyncpg
from watchkeeper.store import (
    Asset,
    AssetScope,
    BaseStateBackend,
    PostgresStateBackend,
    SqliteStateBackend,
    TaskScope,
)

PG_DSN = os.environ.get("WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
UPSERT_SQLITE = (
    "INSERT INTO kv(k, v, version) VALUES (?, ?, 1) "
    "ON CONFLICT(k) DO UPDATE SET v = excluded.v, version = kv.version + 1"
)
UPSERT_PG = (
    "INSERT INTO kv(k, v, version) VALUES ($1, $2, 1) "
    "ON CONFLICT(k) DO UPDATE SET v = excluded.v, version = kv.version + 1"
)
VALUE = json.dumps({"watermark": "2024-06-01T00:00:00Z", "offset": 123456})


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": pct(samples, 0.50) * 1000,
        "p99_ms": pct(samples, 0.99) * 1000,
        "mean_ms": statistics.fmean(samples) * 1000,
    }


# -- baselines -----------------------------------------------------------------------------------


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS kv(k TEXT PRIMARY KEY, v TEXT, version INTEGER)")
    return conn


def raw_sqlite_per_op(path: Path, n: int) -> tuple[float, list[float]]:
    """One upsert per transaction, synchronous=FULL: what a naive writer pays per call."""
    conn = sqlite_connect(path)
    lat = []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(UPSERT_SQLITE, (f"k{i}", VALUE))
        conn.execute("COMMIT")
        lat.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed, lat


def raw_sqlite_batched(path: Path, n: int, batch: int = 1000) -> float:
    """Upserts in 1000-row transactions: the ceiling a group-committing writer can approach."""
    conn = sqlite_connect(path)
    start = time.perf_counter()
    for base in range(0, n, batch):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            UPSERT_SQLITE, [(f"k{i}", VALUE) for i in range(base, min(n, base + batch))]
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


async def raw_aiosqlite_per_op(path: Path, n: int) -> tuple[float, list[float], list[float]]:
    """Upserts one per transaction, then reads of the same keys: (ops/s, set lat, get lat)."""
    async with aiosqlite.connect(path, isolation_level=None) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=FULL")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS kv(k TEXT PRIMARY KEY, v TEXT, version INTEGER)"
        )
        lat = []
        start = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            await conn.execute("BEGIN IMMEDIATE")
            await conn.execute(UPSERT_SQLITE, (f"k{i}", VALUE))
            await conn.execute("COMMIT")
            lat.append(time.perf_counter() - t0)
        ops = n / (time.perf_counter() - start)
        get_lat = []
        for i in range(n):
            t0 = time.perf_counter()
            rows = await conn.execute_fetchall("SELECT v FROM kv WHERE k = ?", (f"k{i % 100}",))
            json.loads(next(iter(rows))[0])
            get_lat.append(time.perf_counter() - t0)
        return ops, lat, get_lat


_GROUP_SCHEMA = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    """CREATE TABLE asset_state (
        asset_id INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
        version INTEGER NOT NULL, updated_at TEXT NOT NULL, writer_kind TEXT,
        writer_name TEXT, writer_try INTEGER, PRIMARY KEY (asset_id, key))""",
)
_GROUP_UPSERT = (
    "INSERT INTO asset_state (asset_id, key, value, version, updated_at) "
    "VALUES (1, ?, ?, 1, ?) ON CONFLICT (asset_id, key) DO UPDATE SET "
    "value = excluded.value, version = asset_state.version + 1, "
    "updated_at = excluded.updated_at"
)
_GROUP_MAX_BATCH = 1024  # the SQLite backend's own writer batch limit


async def raw_aiosqlite_group_commit(path: Path, n: int, writers: int) -> tuple[float, list[float]]:
    """``writers`` coroutines each upserting distinct keys (the value JSON-encoded by the
    writer, as ``aset`` validates it) through a raw group-commit pipeline on aiosqlite: a
    bounded anyio stream, one writer task taking everything queued (up to 1024) into one
    ``BEGIN IMMEDIATE`` / ``executemany`` / ``COMMIT``, then waking the batch's futures.
    The same table shape and ``synchronous=FULL`` as the SQLite backend's ``asset_state``.
    """
    Item = tuple[str, str, asyncio.Future[None]]
    send, receive = anyio.create_memory_object_stream[Item](max_buffer_size=_GROUP_MAX_BATCH)
    lat: list[float] = []

    async def writer_task(
        conn: aiosqlite.Connection, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        task_status.started()
        async for first in receive:
            batch = [first]
            while len(batch) < _GROUP_MAX_BATCH:
                try:
                    batch.append(receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            await conn.execute("BEGIN IMMEDIATE")
            await conn.executemany(_GROUP_UPSERT, [(k, v, stamp) for k, v, _ in batch])
            await conn.execute("COMMIT")
            for *_, done in batch:
                done.set_result(None)

    async def producer(w: int) -> None:
        value = json.loads(VALUE)
        loop = asyncio.get_running_loop()
        for i in range(n // writers):
            t0 = time.perf_counter()
            done: asyncio.Future[None] = loop.create_future()
            item = (f"k{w}-{i}", json.dumps(value, separators=(",", ":")), done)
            try:
                send.send_nowait(item)
            except anyio.WouldBlock:
                await send.send(item)
            await done
            lat.append(time.perf_counter() - t0)

    async with aiosqlite.connect(path, isolation_level=None) as conn:
        for statement in _GROUP_SCHEMA:
            await conn.execute(statement)
        async with anyio.create_task_group() as outer:
            await outer.start(writer_task, conn)
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for w in range(writers):
                    tg.start_soon(producer, w)
            elapsed = time.perf_counter() - start
            send.close()
    return len(lat) / elapsed, lat


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    """A new PostgreSQL schema, dropped on exit even when the measurement failed."""
    schema = f"wk_bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        yield schema
    finally:
        with anyio.move_on_after(10, shield=True):
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            await conn.close()


async def raw_asyncpg(n: int, writers: int) -> tuple[float, list[float]]:
    """Raw asyncpg upserts (autocommit, one per statement) from ``writers`` coroutines."""
    async with fresh_schema() as schema:
        table = f'"{schema}".kv'
        pool = await asyncpg.create_pool(PG_DSN, min_size=1, max_size=10)
        try:
            await pool.execute(f"CREATE TABLE {table}(k TEXT PRIMARY KEY, v TEXT, version INTEGER)")
            sql = UPSERT_PG.replace("kv", table)
            lat: list[float] = []

            async def writer(w: int) -> None:
                for i in range(n // writers):
                    t0 = time.perf_counter()
                    await pool.execute(sql, f"k{w}-{i}", VALUE)
                    lat.append(time.perf_counter() - t0)

            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for w in range(writers):
                    tg.start_soon(writer, w)
            return len(lat) / (time.perf_counter() - start), lat
        finally:
            await pool.close()


async def raw_asyncpg_batched(n: int, batch: int = 1000) -> float:
    """Upserts in 1000-row transactions (one ``executemany``): PostgreSQL's ceiling here."""
    async with fresh_schema() as schema:
        table = f'"{schema}".kv'
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f"CREATE TABLE {table}(k TEXT PRIMARY KEY, v TEXT, version INTEGER)")
            sql = UPSERT_PG.replace("kv", table)
            start = time.perf_counter()
            for base in range(0, n, batch):
                async with conn.transaction():
                    await conn.executemany(
                        sql, [(f"k{i}", VALUE) for i in range(base, min(n, base + batch))]
                    )
            return n / (time.perf_counter() - start)
        finally:
            await conn.close()


# -- watchkeeper ---------------------------------------------------------------------------------


async def ours_latency(backend: BaseStateBackend, n: int) -> dict[str, Any]:
    scope = TaskScope("bench", "run", "latency")
    set_lat, get_lat = [], []
    for i in range(n):
        t0 = time.perf_counter()
        await backend.aset(scope, f"k{i % 100}", {"watermark": i})
        set_lat.append(time.perf_counter() - t0)
    for i in range(n):
        t0 = time.perf_counter()
        await backend.aget(scope, f"k{i % 100}")
        get_lat.append(time.perf_counter() - t0)
    return {"aset": summary(set_lat), "aget": summary(get_lat)}


async def ours_throughput(
    backend: BaseStateBackend, n: int, writers: int
) -> tuple[float, list[float]]:
    scope = AssetScope(name="bench")
    lat: list[float] = []
    value = json.loads(VALUE)

    async def writer(w: int) -> None:
        for i in range(n // writers):
            t0 = time.perf_counter()
            await backend.aset(scope, f"k{w}-{i}", value)
            lat.append(time.perf_counter() - t0)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(writers):
            tg.start_soon(writer, w)
    return len(lat) / (time.perf_counter() - start), lat


async def with_backend(
    make: Callable[[], BaseStateBackend], fn: Callable[[BaseStateBackend], Awaitable[Any]]
) -> Any:
    async with make() as backend:
        await backend.events.aregister_assets([Asset("bench")])
        return await fn(backend)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n_lat = 500 if args.quick else 2000
    n_tp = 5000 if args.quick else 20000
    results: dict[str, Any] = {
        "n_latency": n_lat,
        "n_throughput": n_tp,
        "load_start": loadavg(),
        "sqlite": {},
        "postgres": {},
    }
    with tempfile.TemporaryDirectory(prefix="wk-bench-") as tmpdir:
        tmp = Path(tmpdir)

        def fresh(name: str) -> Path:
            return tmp / f"{name}-{uuid.uuid4().hex[:6]}.db"

        # SQLite
        s: dict[str, Any] = results["sqlite"]
        s["raw_sqlite3_per_op_ops"], lat = await anyio.to_thread.run_sync(
            raw_sqlite_per_op, fresh("raw"), n_lat
        )
        s["raw_sqlite3_per_op_latency"] = summary(lat)
        s["raw_sqlite3_batch1000_ops"] = await anyio.to_thread.run_sync(
            raw_sqlite_batched, fresh("rawb"), n_tp
        )
        s["raw_aiosqlite_per_op_ops"], lat, get_lat = await raw_aiosqlite_per_op(
            fresh("aio"), n_lat
        )
        s["raw_aiosqlite_per_op_latency"] = summary(lat)
        s["raw_aiosqlite_get_latency"] = summary(get_lat)
        s["ours_latency"] = await with_backend(
            lambda: SqliteStateBackend(fresh("lat")), lambda b: ours_latency(b, n_lat)
        )
        for writers in (1, 100, 1000):
            n = n_lat if writers == 1 else n_tp
            if writers > 1:
                # The same upserts through a raw group-commit pipeline, just before ours.
                cpu = time.process_time()
                ops, lat = await raw_aiosqlite_group_commit(fresh(f"grp{writers}"), n, writers)
                cpu_us = (time.process_time() - cpu) / n * 1e6  # the process: loop and threads
                s[f"raw_group_{writers}_writers"] = {"ops": ops, "cpu_us": cpu_us, **summary(lat)}
            path = fresh(f"tp{writers}")
            cpu = time.process_time()
            ops, lat = await with_backend(
                partial(SqliteStateBackend, path), partial(ours_throughput, n=n, writers=writers)
            )
            cpu_us = (time.process_time() - cpu) / n * 1e6  # with opening and closing the store
            s[f"ours_{writers}_writers"] = {"ops": ops, "cpu_us": cpu_us, **summary(lat)}
        s["load"] = loadavg()

    if not args.no_postgres:
        p: dict[str, Any] = results["postgres"]
        p["raw_asyncpg_batch1000_ops"] = await raw_asyncpg_batched(n_tp)
        for writers in (1, 100, 1000):
            n = n_lat if writers == 1 else n_tp
            ops, lat = await raw_asyncpg(n, writers)
            p[f"raw_asyncpg_{writers}_writers"] = {"ops": ops, **summary(lat)}
            async with fresh_schema() as schema:
                ops, lat = await with_backend(
                    partial(PostgresStateBackend, PG_DSN, schema=schema),
                    partial(ours_throughput, n=n, writers=writers),
                )
                p[f"ours_{writers}_writers"] = {"ops": ops, **summary(lat)}
                if writers == 1:
                    p["ours_latency"] = await with_backend(
                        partial(PostgresStateBackend, PG_DSN, schema=schema),
                        partial(ours_latency, n=n_lat),
                    )
        p["load"] = loadavg()
    return results


def _lat(d: dict[str, float]) -> str:
    return f"{d['p50_ms']:.3f}/{d['p99_ms']:.3f} ms"


def report(r: dict[str, Any]) -> None:
    s = r["sqlite"]
    print(f"\nSQLite (synchronous=FULL, WAL)   load {s['load']}")
    print(
        f"  aset p50/p99  ours {_lat(s['ours_latency']['aset'])}"
        f"   raw sqlite3 per-op {_lat(s['raw_sqlite3_per_op_latency'])}"
        f"   raw aiosqlite per-op {_lat(s['raw_aiosqlite_per_op_latency'])}"
    )
    print(
        f"  aget p50/p99  ours {_lat(s['ours_latency']['aget'])}"
        f"   raw aiosqlite SELECT {_lat(s['raw_aiosqlite_get_latency'])}"
    )
    batch, per_op = s["raw_sqlite3_batch1000_ops"], s["raw_sqlite3_per_op_ops"]
    print(
        f"  baselines: raw sqlite3 one upsert per txn {per_op:.0f}/s, 1000-row txns {batch:.0f}/s"
    )
    for w in (1, 100, 1000):
        o = s[f"ours_{w}_writers"]
        # One writer awaits each write: its ceiling is one transaction per write, not a batch.
        vs = (
            f"ratio to per-op {o['ops'] / per_op:.2f}x"
            if w == 1
            else (
                f"ratio to 1000-row txns {o['ops'] / batch:.2f}x, to per-op {o['ops'] / per_op:.1f}x"
            )
        )
        print(
            f"  {w:>4} writers  ours {o['ops']:>9.0f} ops/s  p50 {o['p50_ms']:.2f} ms "
            f"p99 {o['p99_ms']:.2f} ms  CPU {o['cpu_us']:.1f} us/write   {vs}"
        )
        group = s.get(f"raw_group_{w}_writers")
        if group is not None:
            print(
                f"                raw aiosqlite group commit {group['ops']:>9.0f} ops/s  "
                f"p50 {group['p50_ms']:.2f} ms p99 {group['p99_ms']:.2f} ms  "
                f"CPU {group['cpu_us']:.1f} us/write   "
                f"ours / group commit {o['ops'] / group['ops']:.2f}x (goal at 1000: >= 0.8x)"
            )
    p = r.get("postgres") or {}
    if p:
        print(f"\nPostgreSQL   load {p['load']}")
        raw1 = p["raw_asyncpg_1_writers"]
        print(
            f"  aset p50/p99  ours {_lat(p['ours_latency']['aset'])}"
            f"   raw asyncpg autocommit upsert {_lat(raw1)}"
            f"   aget p50/p99 ours {_lat(p['ours_latency']['aget'])}"
        )
        batch = p["raw_asyncpg_batch1000_ops"]
        print(f"  baseline: raw asyncpg 1000-row txns {batch:.0f}/s")
        for w in (1, 100, 1000):
            o, raw = p[f"ours_{w}_writers"], p[f"raw_asyncpg_{w}_writers"]
            print(
                f"  {w:>4} writers  ours {o['ops']:>9.0f} ops/s   raw asyncpg autocommit "
                f"{raw['ops']:>7.0f} ops/s   ratio {o['ops'] / raw['ops']:.2f}x"
                + ("" if w == 1 else f", to 1000-row txns {o['ops'] / batch:.2f}x")
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--out", default="benchmarks/results/store.json")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    results["load_end"] = loadavg()
    report(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
