"""Backfill benchmark: a 100,000-row table through ``SqlTableWatcher``, beside a raw loop.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/backfill_bench.py [--quick] [--no-postgres] [--only DB] [--rows N]

For SQLite and for PostgreSQL, one source table of N rows ``(id, seq, body, amount, at)`` is
read three ways, in the same process and the same run, each writing into a fresh store:

- *plain loop* (SQLite's baseline): keyset-read 1,000 rows at a time with the standard
  library's blocking ``sqlite3``, turn each row into JSON, and insert them as event rows,
  with the watermark upsert, in one transaction per 1,000 rows (``executemany``), into tables
  shaped like the store's (same columns and indexes, WAL and ``synchronous=FULL``);
- *raw loop* (PostgreSQL's baseline): the same with the driver the watcher uses (aiosqlite /
  asyncpg; two ``unnest`` statements on asyncpg);
- *ours*: ``SqlTableWatcher(batch_size=1000)`` run by a ``TriggerRunner`` (default
  ``RunnerConfig``, as the daemon runs watchers) on ``SqliteStateBackend`` /
  ``PostgresStateBackend`` until it committed N events: each poll is one
  ``TriggerEventBatch``, so one transaction per 1,000 rows, validated and deduplicated like
  any event;
- *per-row events* (the path before batches, on fewer rows): the same watcher yielding one
  ``TriggerEvent(row, state=...)`` per row, one commit each.

The figure is rows committed per second (wall time from start to the last commit), with the
process CPU time per row; the ratio is ours ÷ the baseline. The process runs with the
daemon's garbage-collector setting (gen-0 threshold 10,000,
``_gctune.raise_gen0_threshold``) for all of them. Writes ``benchmarks/results/backfill.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import asyncpg
from _raw_tables import pg_tables, sqlite_tables
from watchkeeper.store import (
    Asset,
    BaseStateBackend,
    PostgresStateBackend,
    SqliteStateBackend,
)
from watchkeeper.triggerer import TriggerEvent, TriggerRunner, WatchSpec, configure_logging
from watchkeeper.triggerer.daemon._gctune import raise_gen0_threshold
from watchkeeper.watchers import SqlTableWatcher
from watchkeeper.watchers._sql import to_json_value
from watchkeeper.watchers._window_state import WindowState

PG_DSN = os.environ.get("WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
ASSET = Asset("backfill")
CHUNK = 1000
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def source_rows(count: int) -> list[tuple[int, int, str, float, str]]:
    return [
        (
            n,
            n,
            f"order {n} for customer {n % 977}",
            n * 0.25,
            (T0 + timedelta(seconds=n)).isoformat(),
        )
        for n in range(1, count + 1)
    ]


# -- the source tables ---------------------------------------------------------------------------


def make_sqlite_source(path: Path, count: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, seq INTEGER, body TEXT, amount REAL, at TEXT)"
    )
    conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", source_rows(count))
    conn.commit()
    conn.close()


async def make_pg_source(dsn: str, schema: str, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(
            f'CREATE TABLE "{schema}".orders (id bigint PRIMARY KEY, seq bigint, body text, '
            "amount double precision, at text)"
        )
        await conn.copy_records_to_table("orders", records=source_rows(count), schema_name=schema)
    finally:
        await conn.close()


# -- the raw loop --------------------------------------------------------------------------------

_SQLITE_EVENT = (
    "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, created_at) "
    "VALUES (1, 'backfill', 'raw', ?, NULL, ?)"
)
_SQLITE_STATE = (
    "INSERT INTO asset_state (asset_id, key, value, version, updated_at) "
    "VALUES (1, 'watermark', ?, 1, ?) ON CONFLICT (asset_id, key) DO UPDATE SET "
    "value = excluded.value, version = asset_state.version + 1, updated_at = excluded.updated_at"
)


def _row_json(row: Any) -> str:
    return json.dumps({name: to_json_value(value) for name, value in dict(row).items()})


async def raw_sqlite(source: Path, sink: Path, count: int) -> float:
    async with (
        aiosqlite.connect(f"file:{source}?mode=ro", uri=True) as src,
        aiosqlite.connect(sink, isolation_level=None) as dst,
    ):
        src.row_factory = aiosqlite.Row
        for statement in sqlite_tables(created_index=True):
            await dst.execute(statement)
        start = time.perf_counter()
        last, done = 0, 0
        while done < count:
            rows = await src.execute_fetchall(
                "SELECT * FROM orders WHERE id > ? ORDER BY id LIMIT ?", (last, CHUNK)
            )
            stamp = datetime.now(UTC).isoformat()
            await dst.execute("BEGIN IMMEDIATE")
            await dst.executemany(_SQLITE_EVENT, [(_row_json(row), stamp) for row in rows])
            last = rows[-1]["id"]
            await dst.execute(_SQLITE_STATE, (str(last), stamp))
            await dst.execute("COMMIT")
            done += len(rows)
        return time.perf_counter() - start


def plain_sqlite(source: Path, sink: Path, count: int) -> float:
    """The raw loop on the standard library's blocking ``sqlite3``, in this thread: the
    ceiling for our writer, which runs ``sqlite3`` in a thread of its own (aiosqlite adds a
    thread hop per statement)."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(sink, isolation_level=None)
    try:
        src.row_factory = sqlite3.Row
        for statement in sqlite_tables(created_index=True):
            dst.execute(statement)
        start = time.perf_counter()
        last, done = 0, 0
        while done < count:
            rows = src.execute(
                "SELECT * FROM orders WHERE id > ? ORDER BY id LIMIT ?", (last, CHUNK)
            ).fetchall()
            stamp = datetime.now(UTC).isoformat()
            dst.execute("BEGIN IMMEDIATE")
            dst.executemany(_SQLITE_EVENT, [(_row_json(row), stamp) for row in rows])
            last = rows[-1]["id"]
            dst.execute(_SQLITE_STATE, (str(last), stamp))
            dst.execute("COMMIT")
            done += len(rows)
        return time.perf_counter() - start
    finally:
        src.close()
        dst.close()


async def raw_postgres(dsn: str, source: str, sink: str, count: int) -> float:
    src = await asyncpg.connect(dsn)
    dst = await asyncpg.connect(dsn)
    p = f'"{sink}".'
    try:
        await dst.execute(f'CREATE SCHEMA "{sink}"')
        for statement in pg_tables(p, created_index=True):
            await dst.execute(statement)
        insert = (
            f"INSERT INTO {p}asset_events (asset_id, asset_name, watcher, payload, created_at) "
            "SELECT 1, 'backfill', 'raw', j, $2 FROM unnest($1::text[]) AS i(j)"
        )
        upsert = (
            f"INSERT INTO {p}asset_state AS t (asset_id, key, value, version, updated_at) "
            "VALUES (1, 'watermark', $1, 1, $2) ON CONFLICT (asset_id, key) DO UPDATE SET "
            "value = EXCLUDED.value, version = t.version + 1, updated_at = EXCLUDED.updated_at"
        )
        select = f'SELECT * FROM "{source}".orders WHERE id > $1 ORDER BY id LIMIT $2'
        start = time.perf_counter()
        last, done = 0, 0
        while done < count:
            rows = await src.fetch(select, last, CHUNK)
            stamp = datetime.now(UTC)
            async with dst.transaction():
                await dst.execute(insert, [_row_json(row) for row in rows], stamp)
                last = rows[-1]["id"]
                await dst.execute(upsert, str(last), stamp)
            done += len(rows)
        return time.perf_counter() - start
    finally:
        await dst.execute(f'DROP SCHEMA IF EXISTS "{sink}" CASCADE')
        await src.close()
        await dst.close()


# -- ours ----------------------------------------------------------------------------------------


class PerRowTableWatcher(SqlTableWatcher):
    """The loop ``SqlTableWatcher`` ran before batches: one event (and state) per row.

    Benchmark-only, built on the watcher's private helpers, to measure the path batches replace.
    """

    async def run(self) -> AsyncIterator[TriggerEvent]:  # type: ignore[override]
        state: WindowState[Any, Any] = WindowState(
            "bench",
            "SqlTableWatcher",
            self.watcher_name,
            lower=self._lower,
            size_of=lambda cursor, key: 24,
            max_keys=self.recent_limit,
            kinds=("int", "float", "str", "datetime"),
            key_types=(int, str),
        )
        window = await state.aload(self.asset_state_store)
        async with self._driver.open(self._target, self.params.table) as source:
            while True:
                late, new = await self._poll(source, window)
                for rows, is_new in ((late, False), (new, True)):
                    for row in rows:
                        cursor, key = self._identity(row)
                        window.record(cursor, key, new=is_new)
                        payload = {name: to_json_value(v) for name, v in row.items()}
                        yield TriggerEvent(payload, state=state.state(window))


async def ours(
    backend: BaseStateBackend, dsn: str, table: str, count: int, *, per_row: bool = False
) -> float:
    """Seconds until a ``TriggerRunner`` (as the daemon runs watchers) committed ``count``."""
    kind = PerRowTableWatcher if per_row else SqlTableWatcher
    watcher = kind(dsn, table, "id", "id", batch_size=CHUNK, poll_interval=0.001, lag_window=100)
    await backend.events.aregister_assets([ASSET])
    async with TriggerRunner(backend) as runner:
        start = time.perf_counter()
        await runner.start_trigger(WatchSpec("backfill", watcher, (ASSET,), ("backfill",)))
        while True:
            (status,) = runner.statuses()
            if status.events >= count:
                break
            if status.failures:
                raise RuntimeError(f"the watcher failed: {status.last_error}")
            await anyio.sleep(0.002)
        elapsed = time.perf_counter() - start
    if status.events != count:
        raise RuntimeError(f"committed {status.events} events, expected {count}")
    return elapsed


# -- the run -------------------------------------------------------------------------------------


async def best_of(
    repeat: int, *measures: Callable[[], Awaitable[float]]
) -> list[tuple[float, float]]:
    """The best time of each measure over ``repeat`` rounds, with the process CPU time of that
    round; the measures take turns within a round, so a burst of load on this shared machine
    hits them alike."""
    times: list[list[tuple[float, float]]] = [[] for _ in measures]
    for _ in range(repeat):
        for measured, measure in zip(times, measures, strict=True):
            cpu = time.process_time()
            wall = await measure()
            measured.append((wall, time.process_time() - cpu))
    return [min(measured) for measured in times]


async def bench_sqlite(count: int, per_row_count: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wk-backfill-") as tmp:
        root = Path(tmp)
        source = root / "source.db"
        make_sqlite_source(source, count)
        dsn = f"sqlite:///{source}"
        runs = iter(range(1000))

        def fresh() -> Path:
            return root / f"sink-{next(runs)}.db"

        async def plain() -> float:
            return plain_sqlite(source, fresh(), count)

        async def raw() -> float:
            return await raw_sqlite(source, fresh(), count)

        async def batched() -> float:
            async with SqliteStateBackend(fresh()) as backend:
                return await ours(backend, dsn, "orders", count)

        async def per_row() -> float:
            async with SqliteStateBackend(fresh()) as backend:
                return await ours(backend, dsn, "orders", per_row_count, per_row=True)

        plain_s, raw_s, ours_s = await best_of(repeat, plain, raw, batched)
        (per_row_s,) = await best_of(1, per_row)
        return _times(plain=plain_s, raw=raw_s, ours=ours_s, per_row=per_row_s)


async def bench_postgres(count: int, per_row_count: int, repeat: int) -> dict[str, Any]:
    source = f"wk_backfill_src_{uuid.uuid4().hex[:8]}"
    await make_pg_source(PG_DSN, source, count)
    try:

        async def raw() -> float:
            return await raw_postgres(
                PG_DSN, source, f"wk_backfill_raw_{uuid.uuid4().hex[:8]}", count
            )

        @contextlib.asynccontextmanager
        async def store() -> AsyncIterator[BaseStateBackend]:
            schema = f"wk_backfill_ours_{uuid.uuid4().hex[:8]}"
            admin = await asyncpg.connect(PG_DSN)
            try:
                await admin.execute(f'CREATE SCHEMA "{schema}"')
                async with PostgresStateBackend(PG_DSN, schema=schema) as backend:
                    yield backend
            finally:
                await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                await admin.close()

        async def batched() -> float:
            async with store() as backend:
                return await ours(backend, PG_DSN, f"{source}.orders", count)

        async def per_row() -> float:
            async with store() as backend:
                return await ours(backend, PG_DSN, f"{source}.orders", per_row_count, per_row=True)

        raw_s, ours_s = await best_of(repeat, raw, batched)
        (per_row_s,) = await best_of(1, per_row)
        return _times(raw=raw_s, ours=ours_s, per_row=per_row_s)
    finally:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{source}" CASCADE')
        finally:
            await conn.close()


def _times(**measured: tuple[float, float]) -> dict[str, float]:
    """``{name}_s`` (wall) and ``{name}_cpu_s`` (process CPU) of each measure."""
    out: dict[str, float] = {}
    for name, (wall, cpu) in measured.items():
        out[f"{name}_s"], out[f"{name}_cpu_s"] = wall, cpu
    return out


def report(results: dict[str, Any]) -> None:
    rows, per_row_rows = results["rows"], results["per_row_rows"]
    print(f"\nbackfill of {rows:,} rows, load {results['load']} -> {results['load_end']}")
    print(
        f"{'':10} {'baseline':>22} {'raw driver loop':>18} {'ours (batches)':>16} "
        f"{'ratio':>7} {'CPU/row base/ours':>19} {'per-row events':>16}"
    )
    for kind in ("sqlite", "postgres"):
        r = results.get(kind)
        if r is None:
            continue
        # SQLite's baseline is the plain sqlite3 loop; PostgreSQL's the asyncpg loop.
        base = "plain" if "plain_s" in r else "raw"
        base_rate = rows / r[f"{base}_s"]
        raw = rows / r["raw_s"]
        batched = rows / r["ours_s"]
        per_row = per_row_rows / r["per_row_s"]
        name = "sqlite3" if base == "plain" else "asyncpg"
        cpu = f"{1e6 * r[f'{base}_cpu_s'] / rows:.1f} / {1e6 * r['ours_cpu_s'] / rows:.1f} us"
        print(
            f"{kind:10} {name:>8} {base_rate:>9,.0f} r/s {raw:>12,.0f} r/s "
            f"{batched:>12,.0f} r/s {batched / base_rate:>6.2f}x {cpu:>19} "
            f"{per_row:>12,.0f} r/s ({per_row / base_rate:.3f}x)"
        )
    print(
        "(ratio: ours / baseline; the raw driver loop is aiosqlite on SQLite, asyncpg on PostgreSQL)"
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "rows": args.rows,
        "per_row_rows": args.per_row_rows,
        "load": loadavg(),
        "started": datetime.now(UTC).isoformat(),
    }
    if args.only in (None, "sqlite"):
        results["sqlite"] = await bench_sqlite(args.rows, args.per_row_rows, args.repeat)
    if not args.no_postgres and args.only in (None, "postgres"):
        results["postgres"] = await bench_postgres(args.rows, args.per_row_rows, args.repeat)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 rows, one repetition")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--only", choices=["sqlite", "postgres"], help="run one database")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--per-row-rows", type=int, default=3_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many rounds")
    parser.add_argument("--out", default="benchmarks/results/backfill.json")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.per_row_rows, args.repeat = 10_000, 1_000, 1
    configure_logging("warning", "json")
    raise_gen0_threshold()  # the daemon's setting (``Daemon(tune_gc=True)``), for both loops
    results = asyncio.run(run(args))
    results["load_end"] = loadavg()
    report(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
