"""Tasks benchmark: runs/s with a no-op task and event-to-task-start latency, beside raw baselines.

Not a test. Run by hand from the repository root:

    python3 -m uv run python benchmarks/tasks_bench.py [--quick] [--no-postgres]

1. **Runs per second**: N events are committed while the task is paused (``max_events_per_run
   = 1``, so each event is one run), then the task is resumed and the time until every run has
   succeeded is measured: the worker's steps (a fenced finish and the next claim in one
   transaction; a batch of creations with their cursor moves, claimed in the same transaction,
   when too few runs are ready) and the no-op call in the thread pool. Workers run in this
   process, each on its own backend (its own connections), 1 and 4 of them on PostgreSQL, 1
   on SQLite.
   The same with ``isolation="process"`` (each try in a child process of the worker's pool),
   1 worker on each database.
   Baselines, same run: a bare ``FOR UPDATE SKIP LOCKED`` queue on asyncpg (claim up to 8
   jobs, mark each done), 1 and 4 consumers; a bare polling loop on aiosqlite (claim up to 8
   in one ``BEGIN IMMEDIATE``, mark each done).
2. **Dispatch latency**: events are committed at a steady rate (100 and 1,000/s) by this
   process while a real ``watchkeeper worker`` process runs a no-op task that writes, for each
   event it gets, its start time minus the event's ``created_at``. Baselines: on PostgreSQL a
   raw ``LISTEN``/``NOTIFY`` consumer (insert + NOTIFY per batch, the consumer reads new rows
   when notified); on SQLite a bare aiosqlite loop polling for new rows every 20 ms (the
   worker's poll interval in this run), both in this process.

Writes JSON to benchmarks/results/tasks.json (with the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.lowlevel
import asyncpg
from watchkeeper.store import (
    Asset,
    BaseStateBackend,
    PostgresStateBackend,
    SqliteStateBackend,
)
from watchkeeper.store.protocols import EventCommit
from watchkeeper.triggerer import Worker, WorkerSettings, asset_task, load_settings
from watchkeeper.triggerer.settings import Settings
from watchkeeper.triggerer.worker import AssetTask, load_tasks

PG_DSN = os.environ.get("WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SRC = Asset("bench_src")
POLL = 0.02
# CPU time of this process (every thread) per run or job, by scenario: a figure a busy
# machine disturbs less than the wall-clock rate.
CPU_MS_PER_JOB: dict[str, float] = {}
RUN_COUNTS: dict[str, int] = {}  # runs the latency scenario's worker made, by scenario


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asset_task(schedule=[SRC], max_events_per_run=1)
def noop(**_: Any) -> None:
    """The no-op task of the throughput scenario."""


@asynccontextmanager
async def pg_database() -> AsyncIterator[str]:
    """A fresh database (its DSN): the worker process gets it through its URL."""
    from urllib.parse import urlsplit, urlunsplit

    name = f"wk_bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield urlunsplit(urlsplit(PG_DSN)._replace(path=f"/{name}"))
    finally:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()


def open_backend(kind: str, where: str) -> BaseStateBackend:
    if kind == "sqlite":
        return SqliteStateBackend(where)
    if kind == "postgres-url":  # a database of its own, reachable by URL (child processes)
        return PostgresStateBackend(where)
    return PostgresStateBackend(PG_DSN, schema=where)


ISOLATED = textwrap.dedent(
    """
    from watchkeeper.triggerer import Asset, asset_task


    @asset_task(schedule=[Asset("bench_src")], max_events_per_run=1, isolation="process")
    def noop(**_):
        pass
    """
)


def isolated_noop(defs: Path, url: str) -> tuple[AssetTask, Settings]:
    """The no-op task with ``isolation="process"`` (from a definition file, as children find
    it) and the settings its worker's children open the store with."""
    defs.mkdir(parents=True, exist_ok=True)
    (defs / "bench_tasks.py").write_text(ISOLATED)
    (task,), _ = load_tasks(defs)
    settings = load_settings(
        database={"url": url},
        triggerer={"watchers_path": str(defs)},
        worker={"concurrency": 8, "poll_interval": POLL, "heartbeat_interval": 5},
        logging={"level": "warning"},
    )
    return task, settings


# -- 1. runs per second ---------------------------------------------------------------------------


async def all_succeeded(store: Any) -> bool:
    """No event pending, no run queued or running (and at least one run succeeded)."""
    (info,) = await store.tasks.alist_tasks()
    if info.pending.get(SRC.name):
        return False
    for state in ("queued", "running"):
        if await store.tasks.alist_runs(task=info.name, state=state, limit=1):
            return False
    return bool(await store.tasks.alist_runs(task=info.name, state="success", limit=1))


async def runs_per_second(
    kind: str,
    where: str,
    workers: int,
    events: int,
    *,
    isolated: tuple[AssetTask, Settings] | None = None,
) -> float:
    settings = WorkerSettings(concurrency=8, poll_interval=POLL, heartbeat_interval=5)
    task, process_settings = isolated if isolated is not None else (noop, None)
    async with open_backend(kind, where) as main:
        await main.events.aregister_assets([SRC])
        await Worker(main, [task], settings, process_settings=process_settings).declare()
        await main.tasks.aset_task_paused("noop", True)  # type: ignore[attr-defined]
        async with anyio.create_task_group() as tg:
            for start in range(0, events, 500):
                for i in range(start, min(events, start + 500)):
                    tg.start_soon(main.events.acommit, EventCommit("bench", (SRC.name,), str(i)))
                await anyio.lowlevel.checkpoint()
        backends = [open_backend(kind, where) for _ in range(workers)]
        async with AsyncExitStack() as stack:
            for backend in backends:
                await stack.enter_async_context(backend)
            async with anyio.create_task_group() as tg:
                for backend in backends:
                    worker = Worker(backend, [task], settings, process_settings=process_settings)
                    await tg.start(worker.run)
                t0, c0 = time.perf_counter(), time.process_time()
                await main.tasks.aset_task_paused("noop", False)  # type: ignore[attr-defined]
                while True:
                    if await all_succeeded(main):
                        break
                    await anyio.sleep(0.02)
                elapsed = time.perf_counter() - t0
                mode = "" if isolated is None else "_process"
                CPU_MS_PER_JOB[f"{kind}_{workers}{mode}"] = (
                    (time.process_time() - c0) * 1000 / events
                )
                tg.cancel_scope.cancel()
        return events / elapsed


async def raw_pg_queue(consumers: int, jobs: int) -> float:
    conn = await asyncpg.connect(PG_DSN)
    table = f"bench_jobs_{uuid.uuid4().hex[:8]}"
    try:
        await conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, state text NOT NULL)")
        await conn.execute(
            f"INSERT INTO {table} SELECT g, 'queued' FROM generate_series(1, $1) g", jobs
        )
        pool = await asyncpg.create_pool(PG_DSN, min_size=consumers, max_size=consumers + 1)
        claim = (
            f"UPDATE {table} SET state = 'running' WHERE id IN (SELECT id FROM {table} "
            "WHERE state = 'queued' ORDER BY id LIMIT 8 FOR UPDATE SKIP LOCKED) RETURNING id"
        )
        finish = f"UPDATE {table} SET state = 'done' WHERE id = $1"

        async def consume() -> None:
            async with pool.acquire() as c:
                while True:
                    ids = [r[0] for r in await c.fetch(claim)]
                    if not ids:
                        return
                    for job in ids:
                        await c.execute(finish, job)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(consumers):
                tg.start_soon(consume)
        elapsed = time.perf_counter() - t0
        await pool.close()
        return jobs / elapsed
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()


async def raw_sqlite_queue(path: str, jobs: int) -> float:
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await db.execute("PRAGMA journal_mode = WAL")
        await db.execute("PRAGMA synchronous = FULL")
        await db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
        await db.executemany("INSERT INTO jobs VALUES (?, 'queued')", [(i,) for i in range(jobs)])
        t0, c0 = time.perf_counter(), time.process_time()
        while True:
            await db.execute("BEGIN IMMEDIATE")
            rows = await db.execute_fetchall(
                "UPDATE jobs SET state = 'running' WHERE id IN (SELECT id FROM jobs "
                "WHERE state = 'queued' ORDER BY id LIMIT 8) RETURNING id"
            )
            await db.execute("COMMIT")
            if not rows:
                break
            for (job,) in rows:
                await db.execute("UPDATE jobs SET state = 'done' WHERE id = ?", (job,))
        CPU_MS_PER_JOB["raw_sqlite"] = (time.process_time() - c0) * 1000 / jobs
        return jobs / (time.perf_counter() - t0)


# -- 2. dispatch latency --------------------------------------------------------------------------


LATENCY_TASK = textwrap.dedent(
    """
    import os
    import time

    from watchkeeper.triggerer import Asset, asset_task

    src = Asset("bench_src")
    OUT = os.environ["BENCH_LATENCY_OUT"]


    @asset_task(schedule=[src])
    def measure(*, triggering_asset_events, **_):
        now = time.time()
        with open(OUT, "a") as out:
            for event in triggering_asset_events[src]:
                out.write(f"{now - event.created_at.timestamp()} {now} {event.payload}\\n")
    """
)


async def task_latency(
    kind: str,
    url: str,
    rate: float,
    seconds: float,
    *,
    commits: list[float] | None = None,
    after_commit: list[float] | None = None,
    profile: Path | None = None,
) -> list[float]:
    """Dispatch latency samples (ms); ``commits`` gets each event's submit-to-commit time
    (ms) in this process; ``profile``: run the worker under pyinstrument, its report there."""
    work = Path(tempfile.mkdtemp(prefix="wk-bench-"))
    (work / "defs").mkdir()
    (work / "defs" / "latency.py").write_text(LATENCY_TASK)
    out = work / "latency.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        WATCHKEEPER__DATABASE__URL=url,
        WATCHKEEPER__WORKER__POLL_INTERVAL=str(POLL),
        WATCHKEEPER__LOGGING__LEVEL="warning",
        BENCH_LATENCY_OUT=str(out),
    )
    program = "from watchkeeper.triggerer.cli import main; main()"
    command = [sys.executable, "-c", program]
    if profile is not None:
        command = [
            sys.executable,
            "-m",
            "pyinstrument",
            "-o",
            str(profile),
            "-r",
            "text",
            "-c",
            program,
        ]
    backend_: BaseStateBackend = (
        PostgresStateBackend(url) if kind == "postgres" else SqliteStateBackend(url[10:])
    )
    async with backend_ as backend:
        await backend.events.aregister_assets([SRC])
        proc = await anyio.open_process(
            [*command, "worker", "--watchers-path", str(work / "defs")],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        try:
            while True:
                if await backend.tasks.alist_tasks():  # type: ignore[attr-defined]
                    break
                await anyio.sleep(0.05)
            count = int(rate * seconds)
            acked: dict[str, float] = {}

            async def commit(i: int) -> None:
                start = time.perf_counter()
                await backend.events.acommit(EventCommit("bench", (SRC.name,), str(i)))
                acked[str(i)] = time.time()
                if commits is not None:
                    commits.append((time.perf_counter() - start) * 1000)

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(count):
                    delay = t0 + i / rate - time.perf_counter()
                    if delay > 0:
                        await anyio.sleep(delay)
                    tg.start_soon(commit, i)
            with anyio.move_on_after(10):
                while True:
                    if out.exists() and len(out.read_text().splitlines()) >= count:
                        break
                    await anyio.sleep(0.05)
            RUN_COUNTS[f"{kind}_{int(rate)}"] = sum(
                (await backend.tasks.acount_runs()).values()  # type: ignore[attr-defined]
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(15):
                await proc.wait()
    lines = [line.split() for line in out.read_text().splitlines()]
    if after_commit is not None:  # the task's start after the commit was acknowledged here
        after_commit.extend(
            (float(started) - acked[payload]) * 1000
            for _, started, payload in lines
            if payload in acked
        )
    return [float(line[0]) * 1000 for line in lines]


async def raw_pg_latency(rate: float, seconds: float) -> list[float]:
    table = f"bench_ev_{uuid.uuid4().hex[:8]}"
    producer = await asyncpg.connect(PG_DSN)
    listener = await asyncpg.connect(PG_DSN)
    reader = await asyncpg.connect(PG_DSN)
    samples: list[float] = []
    try:
        await producer.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, created double precision)"
        )
        wake = asyncio.Event()
        await listener.add_listener(table, lambda *_: wake.set())
        count = int(rate * seconds)

        async def consume() -> None:
            last = 0
            while len(samples) < count:
                await wake.wait()
                wake.clear()
                rows = await reader.fetch(f"SELECT id, created FROM {table} WHERE id > $1", last)
                now = time.time()
                for r in rows:
                    last = max(last, r[0])
                    samples.append((now - r[1]) * 1000)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            t0 = time.perf_counter()
            for i in range(count):
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    await anyio.sleep(delay)
                async with producer.transaction():
                    await producer.execute(
                        f"INSERT INTO {table} (created) VALUES ($1)", time.time()
                    )
                    await producer.execute(f"NOTIFY {table}")
    finally:
        await producer.execute(f"DROP TABLE IF EXISTS {table}")
        for c in (producer, listener, reader):
            await c.close()
    return samples


async def raw_sqlite_latency(path: str, rate: float, seconds: float) -> list[float]:
    samples: list[float] = []
    count = int(rate * seconds)
    async with aiosqlite.connect(path, isolation_level=None) as writer:
        await writer.execute("PRAGMA journal_mode = WAL")
        await writer.execute("CREATE TABLE ev (id INTEGER PRIMARY KEY, created REAL)")
        async with aiosqlite.connect(path, isolation_level=None) as reader:

            async def consume() -> None:
                last = 0
                while len(samples) < count:
                    rows = await reader.execute_fetchall(
                        "SELECT id, created FROM ev WHERE id > ?", (last,)
                    )
                    now = time.time()
                    for row_id, created in rows:
                        last = max(last, row_id)
                        samples.append((now - created) * 1000)
                    await anyio.sleep(POLL)

            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                t0 = time.perf_counter()
                for i in range(count):
                    delay = t0 + i / rate - time.perf_counter()
                    if delay > 0:
                        await anyio.sleep(delay)
                    await writer.execute("INSERT INTO ev (created) VALUES (?)", (time.time(),))
    return samples


# -- main -----------------------------------------------------------------------------------------


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": round(statistics.median(samples), 2) if samples else float("nan"),
        "p99_ms": round(pct(samples, 0.99), 2) if samples else float("nan"),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    events = 1000 if args.quick else 3000
    seconds = 2.0 if args.quick else 4.0
    results: dict[str, Any] = {"loadavg_before": loadavg(), "events": events}
    tmp = Path(tempfile.mkdtemp(prefix="wk-tasks-bench-"))
    wanted = ("sqlite",) if args.no_postgres else ("sqlite", "postgres")
    backends = [b for b in wanted if args.backend in (None, b)]

    if args.only in (None, "runs"):
        if "sqlite" in backends:
            db = str(tmp / "runs.db")
            ours = await runs_per_second("sqlite", db, 1, events)
            raw_jobs = await raw_sqlite_queue(str(tmp / "raw.db"), events)
            results["sqlite_runs_per_s_1_worker"] = round(ours)
            results["raw_sqlite_poll_queue_jobs_per_s"] = round(raw_jobs)
            cpu = {k: round(CPU_MS_PER_JOB[k], 3) for k in ("sqlite_1", "raw_sqlite")}
            results["sqlite_cpu_ms_per_run"] = cpu
            print(
                f"runs/s sqlite 1 worker: {round(ours)} raw aiosqlite queue: {round(raw_jobs)} "
                f"({ours / raw_jobs:.2f}x); CPU ms per run/job {cpu}"
            )
            if args.isolation:
                db = tmp / "runs-process.db"
                isolated = isolated_noop(tmp / "defs-sqlite", f"sqlite:///{db}")
                child = await runs_per_second("sqlite", str(db), 1, events, isolated=isolated)
                results["sqlite_runs_per_s_1_worker_process"] = round(child)
                print(
                    f"runs/s sqlite 1 worker, isolation='process': {round(child)} "
                    f"({child / raw_jobs:.2f}x the raw queue, {child / ours:.2f}x in-process)"
                )
        if "postgres" in backends:
            for workers in (1, 4):
                async with pg_schema() as schema:
                    rate = await runs_per_second("postgres", schema, workers, events)
                raw = await raw_pg_queue(workers, events)
                results[f"pg_runs_per_s_{workers}_workers"] = round(rate)
                results[f"raw_pg_skip_locked_jobs_per_s_{workers}_consumers"] = round(raw)
                print(
                    f"runs/s postgres {workers} workers: {round(rate)} "
                    f"raw SKIP LOCKED: {round(raw)} ({rate / raw:.2f}x)"
                )
                if args.isolation and workers == 1:
                    async with pg_database() as dsn:
                        isolated = isolated_noop(tmp / "defs-postgres", dsn)
                        child = await runs_per_second(
                            "postgres-url", dsn, 1, events, isolated=isolated
                        )
                    results["pg_runs_per_s_1_worker_process"] = round(child)
                    print(
                        f"runs/s postgres 1 worker, isolation='process': {round(child)} "
                        f"({child / raw:.2f}x the raw queue, {child / rate:.2f}x in-process)"
                    )

    if args.only in (None, "latency"):
        for rate in args.rates:
            profile = None
            tag = str(int(rate))
            if "sqlite" in backends:
                url = f"sqlite:///{tmp / f'lat{tag}.db'}"
                commits: list[float] = []
                after: list[float] = []
                if args.profile_dir is not None:
                    profile = args.profile_dir / f"worker-sqlite-{tag}.txt"
                found = summary(
                    await task_latency(
                        "sqlite",
                        url,
                        rate,
                        seconds,
                        commits=commits,
                        after_commit=after,
                        profile=profile,
                    )
                )
                raw_poll = summary(
                    await raw_sqlite_latency(str(tmp / f"rawlat{tag}.db"), rate, seconds)
                )
                results[f"sqlite_latency_{tag}"] = {
                    "worker": found,
                    "commit": summary(commits),
                    "after_commit": summary(after),
                    "runs": RUN_COUNTS.get(f"sqlite_{tag}"),
                    "raw_poll": raw_poll,
                }
                print(
                    f"latency sqlite {tag}/s: worker {found} raw poll {raw_poll}; "
                    f"commit {summary(commits)}; after commit {summary(after)}; "
                    f"runs {RUN_COUNTS.get(f'sqlite_{tag}')}"
                )
            if "postgres" in backends:
                commits, after = [], []
                if args.profile_dir is not None:
                    profile = args.profile_dir / f"worker-postgres-{tag}.txt"
                async with pg_database() as dsn:
                    found = summary(
                        await task_latency(
                            "postgres",
                            dsn,
                            rate,
                            seconds,
                            commits=commits,
                            after_commit=after,
                            profile=profile,
                        )
                    )
                raw_listen = summary(await raw_pg_latency(rate, seconds))
                results[f"pg_latency_{tag}"] = {
                    "worker": found,
                    "commit": summary(commits),
                    "after_commit": summary(after),
                    "runs": RUN_COUNTS.get(f"postgres_{tag}"),
                    "raw_listen_notify": raw_listen,
                }
                print(
                    f"latency postgres {tag}/s: worker {found} raw LISTEN/NOTIFY {raw_listen}; "
                    f"commit {summary(commits)}; after commit {summary(after)}; "
                    f"runs {RUN_COUNTS.get(f'postgres_{tag}')}"
                )
    results["loadavg_after"] = loadavg()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default=None)
    parser.add_argument("--only", choices=("runs", "latency"), default=None)
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 1000.0])
    parser.add_argument(
        "--no-isolation",
        dest="isolation",
        action="store_false",
        help="skip the runs/s of isolation='process' (a child process per try)",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="run the latency scenario's worker under pyinstrument, its reports here",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tasks.json"))
    options = parser.parse_args()
    if options.profile_dir is not None:
        options.profile_dir.mkdir(parents=True, exist_ok=True)
    outcome = anyio.run(main, options, backend="asyncio")
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(outcome, indent=2))
    print(json.dumps(outcome, indent=2))
