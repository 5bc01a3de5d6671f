"""Watcher rates benchmark: what ``GET /api/v1/watchers`` costs over a large event log.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/watcher_rates_bench.py [--events N] [--watchers N] [--rounds N]

A SQLite store holds ``--events`` events (default 1,000,000) from ``--watchers`` watchers
(default 100), all committed in the last five minutes: a firehose's window. The API is served
in this process, on a free port, and each figure is the median of ``--rounds`` timings:

- ``raw count``: the count query the event-log path runs (``SELECT watcher, count(*) ... WHERE
  created_at >= ? GROUP BY watcher``) on a plain ``sqlite3`` connection: the baseline;
- ``event log``: the route as ``watchkeeper api`` serves it (no runner), each request a cache
  miss (the 2 s cache of the count is emptied before it);
- ``runner counters``: the route as a daemon serves it, the rates taken from its runner's
  event counters (one per watcher, as a runner that committed these events keeps them).

Reported: milliseconds per request and the ratio to the raw count. Writes
``benchmarks/results/watcher_rates.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
from _bench_measure import loadavg
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventBatchCommit, TriggerStatus, encode_json
from watchkeeper.triggerer import RunnerConfig, TriggerRunner
from watchkeeper.triggerer.api import api_context, make_token, serve_app
from watchkeeper.triggerer.api._rates import RATE_CACHE
from watchkeeper.triggerer.settings import ApiSettings

RESULTS = Path(__file__).parent / "results"
BATCH = 10_000


async def fill(backend: SqliteStateBackend, events: int, watchers: int) -> list[str]:
    """Commit ``events`` events spread over ``watchers`` watchers, with a status row each."""
    names = [f"w{i:04d}" for i in range(watchers)]
    await backend.events.aregister_assets([Asset(name) for name in names])
    now = datetime.now(UTC)
    await backend.status.asave_trigger_status(
        [TriggerStatus(n, "m.C", (n,), (n,), "running", updated_at=now) for n in names]
    )
    payload = encode_json({"n": 1})
    per_watcher = events // watchers
    for name in names:
        for start in range(0, per_watcher, BATCH):
            rows = tuple((payload, None) for _ in range(min(BATCH, per_watcher - start)))
            await backend.events.acommit_batch(EventBatchCommit(name, (name,), rows))
    return names


def raw_count(path: Path) -> Callable[[], None]:
    """The event-log path's count query, on its own connection."""
    conn = sqlite3.connect(path, check_same_thread=False)
    sql = "SELECT watcher, count(*) FROM asset_events WHERE created_at >= ? GROUP BY watcher"

    def run() -> None:
        since = datetime.now(UTC) - timedelta(seconds=300)
        conn.execute(sql, (since.isoformat(timespec="microseconds"),)).fetchall()

    return run


async def timed(rounds: int, call: Callable[[], Awaitable[Any]], pause: float = 0.0) -> float:
    """Median seconds of ``rounds`` calls, after one warm-up call; ``pause`` seconds between
    two calls (not timed)."""
    await call()
    times = []
    for _ in range(rounds):
        await anyio.sleep(pause)
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def route_time(
    backend: SqliteStateBackend, runner: TriggerRunner | None, rounds: int
) -> float:
    """Median seconds of ``GET /api/v1/watchers`` served over ``backend`` (with ``runner``),
    each request past the event-log count's cache."""
    text, row = make_token(f"bench-{id(runner)}", ["read"], now=datetime.now(UTC))
    await backend.controls.acreate_token(row)
    ctx = api_context(backend, ApiSettings(port=0), runner=runner)
    async with anyio.create_task_group() as tg:
        port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
        headers = {"Authorization": f"Bearer {text}"}
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as client:

            async def get() -> None:
                response = await client.get("/api/v1/watchers")
                response.raise_for_status()

            seconds = await timed(rounds, get, pause=RATE_CACHE + 0.1)
        tg.cancel_scope.cancel()
    return seconds


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        async with SqliteStateBackend(path) as backend:
            started = time.perf_counter()
            names = await fill(backend, args.events, args.watchers)
            print(f"filled {args.events:,} events in {time.perf_counter() - started:.1f} s")
            count = raw_count(path)

            async def raw() -> None:
                await anyio.to_thread.run_sync(count)

            raw_s = await timed(args.rounds, raw)
            log_s = await route_time(backend, None, args.rounds)
            async with TriggerRunner(backend, RunnerConfig(status_interval=0)) as runner:
                per_watcher = args.events // args.watchers
                for name in names:  # the counts a runner keeps for the events it committed
                    runner.metrics.events[(name, name)] = per_watcher
                runner_s = await route_time(backend, runner, args.rounds)
    result = {
        "loadavg": loadavg(),
        "events": args.events,
        "watchers": args.watchers,
        "raw_count_ms": round(raw_s * 1000, 2),
        "event_log_ms": round(log_s * 1000, 2),
        "runner_counters_ms": round(runner_s * 1000, 2),
        "event_log_vs_raw": round(log_s / raw_s, 3),
        "runner_counters_vs_raw": round(runner_s / raw_s, 3),
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    result = anyio.run(main, parser.parse_args(), backend="asyncio")
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "watcher_rates.json").write_text(json.dumps(result, indent=2) + "\n")
