"""Growth benchmark: does a daemon under sustained load stay bounded in storage and memory?

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/growth_bench.py [--minutes 10] [--key-rate 10000] [--files 1000]
    uv run python benchmarks/growth_bench.py --postgres [DSN]

One real ``watchkeeper triggerer`` on a SQLite file (or, with ``--postgres``, on a database
of its own created on that server and dropped afterwards; DSN by default
``WATCHKEEPER_BENCH_PG_DSN`` or ``postgresql://postgres@127.0.0.1:5432/test``) runs, for
``--minutes`` (10 by default):

- flood watchers committing ``--key-rate`` new dedup keys per second in all (batches of
  ``--batch`` events, each with its own key, paced by the clock; a flood that falls behind
  drops its backlog rather than bursting, so the figure printed is what was committed);
- one watcher committing ``--big-rate`` events per second whose payload is within 64 bytes of
  ``[events] max_payload_bytes`` (1 MiB by default);
- idle watchers, so the watchers path holds ``--files`` Python files in all; one of them is
  rewritten every second, so every scan of the path (``[triggerer] reload_interval``) finds a
  change and reloads the definitions.

Retention is counted in whole days, which no run of minutes would ever reach. So the daemon's
own collection is off (``gc_interval = 0``) and this script runs the store's collection itself
every ``--gc-every`` seconds with ``event_retention_days = dedup_retention_days = 1`` and a
clock moved ``1 day - --window`` seconds ahead: an event, keyed or not, goes once it is
``--window`` seconds old. That is the daemon's rule with the retention shortened to the window;
storage should then level off at about ``rate x (window + gc-every)`` events.

There is no runtime-free baseline for growth; the reference is that bound, and the first
minute's figures against the last. Every ``--sample-every`` seconds it records the events and
dedup keys kept, the commit rates, the database's size on disk (file and WAL) and in live
pages, the daemon's RSS, and each reload's cost: the gap between two ``watchers_reloaded``
log lines less the interval slept between them. On PostgreSQL "on disk" is the database's
size (``pg_database_size``, the cluster's WAL not included) and "live" the events table's
(``pg_total_relation_size``: heap, TOAST and indexes, dead rows until vacuumed included).
Writes ``benchmarks/results/growth.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

import anyio
import asyncpg
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend

PG_DSN = os.environ.get("WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")

LIBRARY = '''
"""The benchmark's watchers: a clock-paced flood of keyed events, big events, idle ones."""

import json
import time

import anyio
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent, TriggerEventBatch


class KeyFlood(BaseEventTrigger):
    def __init__(self, rate, batch):
        super().__init__()
        self.rate, self.batch = rate, batch

    def serialize(self):
        return (self.classpath(), {"rate": self.rate, "batch": self.batch})

    async def run(self):
        key = f"{self.watcher_name}.seq"
        seq = await self.asset_state_store.aget(key, default=0)
        start, sent = time.monotonic(), 0
        while True:
            delay = start + sent / self.rate - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            elif delay < -1.0:  # behind by a second: drop the backlog, never burst
                start, sent = time.monotonic(), 0
            events = [
                TriggerEvent({"seq": seq + i}, dedup_key=f"{self.watcher_name}:{seq + i}")
                for i in range(self.batch)
            ]
            seq += self.batch
            sent += self.batch
            yield TriggerEventBatch(events, state={key: seq})


class BigPayload(BaseEventTrigger):
    def __init__(self, rate, size):
        super().__init__()
        self.rate, self.size = rate, size

    def serialize(self):
        return (self.classpath(), {"rate": self.rate, "size": self.size})

    async def run(self):
        n = 0
        blob = "x" * (self.size - 64)  # the payload's JSON is within 64 bytes of the limit
        while True:
            await anyio.sleep(1 / self.rate)
            n += 1
            yield TriggerEvent({"n": n, "blob": blob})


class Idle(BaseEventTrigger):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def serialize(self):
        return (self.classpath(), {"n": self.n})

    async def run(self):
        await anyio.sleep_forever()
        yield TriggerEvent({})
'''

ASSET_FILE = """
from watchkeeper.triggerer import Asset, AssetWatcher
from growthlib import {cls}

{name} = Asset("{name}", watchers=[AssetWatcher("{name}_feed", {cls}({args}))])
"""


def write_watchers(path: Path, args: argparse.Namespace, max_payload: int) -> Path:
    """The watcher files; returns the idle file the run rewrites to force reloads."""
    path.mkdir()
    (path / "growthlib.py").write_text(LIBRARY)
    per_flood = args.key_rate / args.floods
    for i in range(args.floods):
        text = ASSET_FILE.format(
            cls="KeyFlood", name=f"flood_{i:02d}", args=f"{per_flood!r}, {args.batch}"
        )
        (path / f"flood_{i:02d}.py").write_text(text)
    big = ASSET_FILE.format(cls="BigPayload", name="big", args=f"{args.big_rate!r}, {max_payload}")
    (path / "big.py").write_text(big)
    idle = args.files - args.floods - 2  # growthlib.py and big.py
    for i in range(idle):
        name = f"idle_{i:04d}"
        (path / f"{name}.py").write_text(ASSET_FILE.format(cls="Idle", name=name, args=i))
    return path / "idle_0000.py"


def touch(file: Path, n: int) -> None:
    """Change ``file`` without changing what it defines: the next scan reloads."""
    text = file.read_text().split("# rewrite")[0]
    fresh = file.with_suffix(".tmp")  # written aside, then renamed: a scan never reads half
    fresh.write_text(f"{text}# rewrite {n}\n")
    os.replace(fresh, file)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def store_figures(db: Path) -> dict[str, float]:
    """Events and dedup keys kept, the newest ids, and the file's size: on disk and live."""
    on_disk = sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists())
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
        events, keyed, top = conn.execute(
            "SELECT count(*), count(dedup_key), coalesce(max(id), 0) FROM asset_events"
        ).fetchone()
        big = conn.execute("SELECT count(*) FROM asset_events WHERE dedup_key IS NULL").fetchone()[
            0
        ]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    return {
        "events": events,
        "dedup_keys": keyed,
        "big_events": big,
        "max_id": top,
        "disk_mb": on_disk / 1e6,
        "live_mb": (pages - free) * size / 1e6,
    }


async def pg_figures(dsn: str) -> dict[str, float]:
    """:func:`store_figures` on PostgreSQL (see the module's docstring for the sizes)."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS events, count(dedup_key) AS keyed, coalesce(max(id), 0) AS top,"
            " count(*) FILTER (WHERE dedup_key IS NULL) AS big,"
            " pg_database_size(current_database()) AS disk,"
            " pg_total_relation_size('asset_events') AS live FROM asset_events"
        )
    finally:
        await conn.close()
    assert row is not None
    return {
        "events": row["events"],
        "dedup_keys": row["keyed"],
        "big_events": row["big"],
        "max_id": row["top"],
        "disk_mb": row["disk"] / 1e6,
        "live_mb": row["live"] / 1e6,
    }


@contextmanager
def throwaway_database(dsn: str) -> Iterator[str]:
    """A database of its own on the server of ``dsn``, dropped on the way out."""
    name = f"wk_growth_{uuid.uuid4().hex[:8]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    anyio.run(admin, f'CREATE DATABASE "{name}"')
    try:
        yield f"{dsn.rpartition('/')[0]}/{name}"
    finally:
        anyio.run(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reload_lines(log: Path) -> list[float]:
    """The UNIX times of the daemon's ``watchers_reloaded`` lines so far."""
    times = []
    for line in log.read_text(errors="replace").splitlines():
        if '"watchers_reloaded"' not in line:
            continue
        try:
            stamp = json.loads(line)["timestamp"]
        except (ValueError, KeyError):
            continue
        times.append(datetime.fromisoformat(stamp).timestamp())
    return times


def log_counts(log: Path, names: tuple[str, ...]) -> dict[str, int]:
    text = log.read_text(errors="replace")
    return {name: text.count(f'"{name}"') for name in names}


def log_lines(log: Path, name: str, most: int = 5) -> list[str]:
    """The first ``most`` log lines of event ``name`` (cut at 400 characters): the reasons."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if f'"{name}"' in line]
    return [line[:400] for line in lines[:most]]


@contextmanager
def running_daemon(
    tmp: Path, watchers: Path, env: dict[str, str], log: IO[bytes]
) -> Iterator[subprocess.Popen[bytes]]:
    script = Path(sys.executable).with_name("watchkeeper")
    command = (
        [str(script)]
        if script.is_file()
        else [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]
    )
    proc = subprocess.Popen(
        [*command, "triggerer", "--watchers-path", str(watchers)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tmp,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def collect(db: Path | str, window: float) -> int:
    """One collection pass with the retention shortened to ``window`` seconds (see above);
    ``db`` is the SQLite file or the PostgreSQL DSN."""
    opened = PostgresStateBackend(db) if isinstance(db, str) else SqliteStateBackend(db)
    async with opened as backend:
        report = await backend.gc.acollect_garbage(
            now=backend.clock() + timedelta(days=1) - timedelta(seconds=window),
            event_retention_days=1,
            dedup_retention_days=1,
            batch_size=5000,
        )
    return report.events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of load (default 10)")
    parser.add_argument("--key-rate", type=float, default=10_000.0, help="new dedup keys/s in all")
    parser.add_argument("--floods", type=int, default=10, help="flood watchers sharing the rate")
    parser.add_argument("--batch", type=int, default=100, help="events per flood batch")
    parser.add_argument("--big-rate", type=float, default=1.0, help="max-size events/s")
    parser.add_argument("--files", type=int, default=1000, help="watcher files in all")
    parser.add_argument("--window", type=float, default=60.0, help="retention, in seconds")
    parser.add_argument("--gc-every", type=float, default=10.0, help="seconds between passes")
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--reload-interval", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/growth.json"))
    parser.add_argument(
        "--postgres", nargs="?", const=PG_DSN, default=None, metavar="DSN",
        help="run on PostgreSQL (a throwaway database on the DSN's server) instead of SQLite",
    )  # fmt: skip
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(throwaway_database(args.postgres)) if args.postgres else None
        run(args, pg)


def run(args: argparse.Namespace, pg: str | None) -> None:
    """One run on SQLite, or on the PostgreSQL database ``pg``."""
    max_payload = 1_048_576
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory(prefix="growth-") as tmp_name:
        tmp = Path(tmp_name)
        db, log_path = tmp / "state.db", tmp / "daemon.log"
        store: Path | str = pg or db
        rewritten = write_watchers(tmp / "watchers", args, max_payload)
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            WATCHKEEPER__DATABASE__URL=pg or f"sqlite:///{db}",
            WATCHKEEPER__LOGGING__FORMAT="json",
            WATCHKEEPER__API__ENABLED="false",
            WATCHKEEPER__TRIGGERER__GC_INTERVAL="0",
            WATCHKEEPER__TRIGGERER__CAPACITY=str(args.files + 100),
            WATCHKEEPER__TRIGGERER__RELOAD_INTERVAL=str(args.reload_interval),
            WATCHKEEPER__EVENTS__MAX_PAYLOAD_BYTES=str(max_payload),
        )
        samples: list[dict[str, Any]] = []
        collected = 0
        with log_path.open("ab") as log, running_daemon(tmp, tmp / "watchers", env, log) as proc:
            deadline = time.monotonic() + 300
            while '"daemon_started"' not in log_path.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the daemon did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
            print(f"daemon started with {args.files} watcher files; load {args.minutes:g} min")
            print(f"{'t s':>6} {'events':>9} {'keys':>9} {'events/s':>8} "
                  f"{'disk MB':>8} {'live MB':>8} {'RSS MB':>7} {'reload max s':>12}")  # fmt: skip
            start = time.monotonic()
            end = start + args.minutes * 60
            next_sample, next_gc, rewrites = start, start + args.gc_every, 0
            last: dict[str, Any] | None = None
            seen_reloads = len(reload_lines(log_path))
            while time.monotonic() < end and proc.poll() is None:
                rewrites += 1
                touch(rewritten, rewrites)
                now = time.monotonic()
                if now >= next_gc:
                    collected += anyio.run(collect, store, args.window)
                    next_gc += args.gc_every
                if now >= next_sample:
                    figures = anyio.run(pg_figures, pg) if pg else store_figures(db)
                    reloads = reload_lines(log_path)
                    gaps = [b - a - args.reload_interval for a, b in itertools.pairwise(reloads)]
                    fresh = gaps[max(seen_reloads - 1, 0) :]
                    seen_reloads = len(reloads)
                    sample = {"t": now - start, "rss_mb": rss_mb(proc.pid), **figures,
                              "reload_costs": [round(g, 3) for g in fresh]}  # fmt: skip
                    if last is not None and sample["max_id"] >= last["max_id"] > 0:
                        dt = sample["t"] - last["t"]
                        sample["ids_per_s"] = (sample["max_id"] - last["max_id"]) / dt
                    samples.append(sample)
                    worst = max(fresh) if fresh else float("nan")
                    rate = sample.get("ids_per_s", float("nan"))
                    print(f"{sample['t']:>6.0f} {sample['events']:>9} {sample['dedup_keys']:>9} "
                          f"{rate:>8.0f} {sample['disk_mb']:>8.1f} "
                          f"{sample['live_mb']:>8.1f} {sample['rss_mb']:>7.1f} {worst:>12.2f}")  # fmt: skip
                    last = sample
                    next_sample += args.sample_every
                time.sleep(1.0)
            alive = proc.poll() is None
        counts = log_counts(log_path, ("watcher_failed", "trigger_failed", "store_unavailable",
                                       "watchers_reload_failed", "loop_blocked"))  # fmt: skip
        for name in ("watchers_reload_failed", "loop_blocked", "watcher_failed"):
            for line in log_lines(log_path, name):
                print(line)
    load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    summarise(args, samples, collected, alive, counts, load_before, load_after, pg is not None)


def summarise(
    args: argparse.Namespace,
    samples: list[dict[str, Any]],
    collected: int,
    alive: bool,
    counts: dict[str, int],
    load_before: str,
    load_after: str,
    postgres: bool,
) -> None:
    if len(samples) < 3:
        raise SystemExit("too few samples: run longer")
    duration = samples[-1]["t"]
    rates = [s["ids_per_s"] for s in samples if "ids_per_s" in s]
    costs = [c for s in samples for c in s["reload_costs"]]
    third = [s for s in samples if s["t"] >= duration / 3]
    last_third = [s for s in samples if s["t"] >= 2 * duration / 3]
    committed = statistics.mean(rates)
    bound = committed * (args.window + args.gc_every)
    costs_sorted = sorted(costs)
    p95 = costs_sorted[min(len(costs) - 1, round(0.95 * (len(costs) - 1)))] if costs else None
    over = sum(c > args.reload_interval for c in costs)
    summary: dict[str, Any] = {
        "backend": "postgresql" if postgres else "sqlite",
        "minutes": round(duration / 60, 2),
        "settings": vars(args) | {"out": str(args.out)},
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "daemon_alive_at_end": alive,
        "log_counts": counts,
        "events_committed_per_s_mean": round(committed),
        "events_collected": collected,
        "bound_events": round(bound),
        "events_kept_max_after_first_third": max(s["events"] for s in third),
        "disk_mb_first_third_end": round(third[0]["disk_mb"], 1),
        "disk_mb_end": round(samples[-1]["disk_mb"], 1),
        "disk_mb_max": round(max(s["disk_mb"] for s in samples), 1),
        "live_mb_last_third": [round(s["live_mb"], 1) for s in last_third],
        "rss_mb_first_third_end": round(third[0]["rss_mb"], 1),
        "rss_mb_end": round(samples[-1]["rss_mb"], 1),
        "rss_mb_max": round(max(s["rss_mb"] for s in samples), 1),
        "reloads": len(costs),
        "reload_cost_p50_s": round(statistics.median(costs), 3) if costs else None,
        "reload_cost_p95_s": None if p95 is None else round(p95, 3),
        "reload_cost_max_s": round(max(costs), 3) if costs else None,
        "reloads_over_interval": over,
        "reload_interval_s": args.reload_interval,
        "samples": samples,
    }
    print()
    print(
        f"{summary['minutes']} min of load, load average {load_before} before, {load_after} after"
    )
    print(f"committed {committed:.0f} events/s on average (asked: {args.key_rate:g} keyed + "
          f"{args.big_rate:g} big); {collected} collected")  # fmt: skip
    print(f"events kept: at most {summary['events_kept_max_after_first_third']} after the first "
          f"third; bound rate x (window + gc-every) = {bound:.0f}")  # fmt: skip
    print(f"database on disk: {summary['disk_mb_first_third_end']} MB at a third, "
          f"{summary['disk_mb_end']} MB at the end (max {summary['disk_mb_max']} MB)")  # fmt: skip
    print(f"daemon RSS: {summary['rss_mb_first_third_end']} MB at a third, "
          f"{summary['rss_mb_end']} MB at the end (max {summary['rss_mb_max']} MB)")  # fmt: skip
    print(f"reloads: {len(costs)}, cost p50 {summary['reload_cost_p50_s']} s, p95 "
          f"{summary['reload_cost_p95_s']} s, max {summary['reload_cost_max_s']} s; {over} over "
          f"the interval of {args.reload_interval:g} s")  # fmt: skip
    print(f"daemon alive at the end: {alive}; log counts {counts}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
