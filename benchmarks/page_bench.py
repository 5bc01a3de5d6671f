"""Page benchmark: what the watcher view's sampling and the asset graph cost with many watchers.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/page_bench.py [--watchers N] [--samples N] [--rounds N]

A SQLite store holds ``--watchers`` (default 10,000) watchers' status rows, one live daemon,
one asset per watcher and one event per watcher in the last minute. Measured, medians of
``--rounds`` rounds:

1. **One sample** of :class:`~watchkeeper.triggerer.api._series.WatcherSeries` (the status and
   control rows, the event log's count since the last sample, one point per watcher), against
   its baseline in the same run: :func:`watcher_rows` alone, the read every
   ``GET /api/v1/watchers`` already makes. Reported as the ratio sample / baseline.
2. **Memory** of the series after ``--samples`` samples (default 60: an hour at the default
   interval), by tracemalloc, per watcher.
3. **The graph**: ``GET /api/v1/graph`` against ``GET /api/v1/watchers``, both over HTTP on
   the same server.

Writes ``benchmarks/results/page.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import DaemonStatus, EventBatchCommit, TriggerStatus, encode_json
from watchkeeper.triggerer.api import api_context, make_token, serve_app
from watchkeeper.triggerer.api._series import WatcherSeries
from watchkeeper.triggerer.daemon._controls import watcher_rows
from watchkeeper.triggerer.settings import ApiSettings

RESULTS = Path(__file__).parent / "results"


async def fill(backend: SqliteStateBackend, watchers: int) -> None:
    now = datetime.now(UTC)
    names = [f"w{i:05d}" for i in range(watchers)]
    await backend.events.aregister_assets([Asset(f"a{i:05d}") for i in range(watchers)])
    await backend.status.asave_daemon_status(
        DaemonStatus("bench", started_at=now, heartbeat_at=now, lease_ttl=3600.0, watchers_path=".")
    )
    await backend.status.asave_trigger_status(
        [
            TriggerStatus(
                trigger_id=name,
                classpath="bench.Trigger",
                assets=(f"a{i:05d}",),
                watchers=(name,),
                state="running",
                events=1,
                last_event_at=now,
                updated_at=now,
                owner="bench",
            )
            for i, name in enumerate(names)
        ]
    )
    for i, name in enumerate(names):
        batch = EventBatchCommit(name, (f"a{i:05d}",), ((encode_json({"n": i}), None),))
        await backend.events.acommit_batch(batch)


async def timed(call: Any) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with SqliteStateBackend(Path(tmp) / "state.db") as backend:
            await fill(backend, args.watchers)
            series = WatcherSeries(backend, interval=60)
            samples, baseline = [], []
            for _ in range(args.rounds):  # alternated: the machine's load hits both
                baseline.append(await timed(lambda: watcher_rows(backend)))
                series._since = backend.clock() - timedelta(seconds=60)
                samples.append(await timed(series.sample))
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            fresh = WatcherSeries(backend, interval=60)
            for _ in range(args.samples):
                await fresh.sample()
            grown = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()

            text, row = make_token("bench", ["read"], now=datetime.now(UTC))
            await backend.controls.acreate_token(row)
            ctx = api_context(backend, ApiSettings(port=0))
            ctx.series = None  # no sampling during the HTTP timings
            graph, listing = [], []
            async with anyio.create_task_group() as tg:
                port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
                headers = {"Authorization": f"Bearer {text}"}
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=120
                ) as http:
                    for _ in range(args.rounds):
                        listing.append(await timed(lambda: http.get("/api/v1/watchers")))
                        graph.append(await timed(lambda: http.get("/api/v1/graph")))
                tg.cancel_scope.cancel()
    sample, base = statistics.median(samples), statistics.median(baseline)
    g, w = statistics.median(graph), statistics.median(listing)
    return {
        "watchers": args.watchers,
        "sample_seconds": round(sample, 4),
        "watcher_rows_seconds": round(base, 4),
        "sample_over_watcher_rows": round(sample / base, 2),
        "series_bytes_after_samples": grown,
        "samples": args.samples,
        "series_bytes_per_watcher": round(grown / args.watchers, 1),
        "graph_seconds": round(g, 4),
        "watchers_route_seconds": round(w, 4),
        "graph_over_watchers_route": round(g / w, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    result = anyio.run(main, parser.parse_args(), backend="asyncio")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "page.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
