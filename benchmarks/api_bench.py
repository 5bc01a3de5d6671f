"""API benchmark: what serving the HTTP API costs the daemon, and how long a scrape takes.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/api_bench.py [--quick] [--watchers N] [--window SECONDS]

1. **Cost of the API.** ``--watchers`` firehose watchers (default 100) commit events on a fresh
   SQLite file through a ``TriggerRunner`` for ``--window`` seconds, in the modes below,
   ``--rounds`` times each (alternating, so a change in the machine's load hits all); with the
   API served in the same process, a separate client process scraping ``/metrics`` every second
   and one Server-Sent Events client attached to ``/api/v1/events/stream`` (``api-one-asset``:
   tailing one asset; ``api-all-events``: receiving every event, the worst case). Reported:
   durable events/s and the p99 of the commit latency (each ``acommit_event`` call, timed by
   the runtime's own hook), medians of the runs of each mode. Goal: under 5 % lower with the
   API. The client runs in its own process but on the same machine, so its CPU is charged too.
   A fourth mode, ``api-process-all-events``, runs no API in the daemon: the same client gets
   every event from a separate ``watchkeeper api`` process on the same SQLite file: what
   moving the stream out of the daemon's process buys when it stays on the same machine.
2. **Scrape time.** 10,000 idle watchers in a runner (memory backend); the time of
   ``GET /metrics`` over HTTP, with the default ``max_watcher_series`` (2000) and uncapped.
   Goal: under 100 ms.

Writes ``benchmarks/results/api.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
from _bench_measure import loadavg, pct
from watchkeeper.store import Asset, MemoryStateBackend, SqliteStateBackend
from watchkeeper.triggerer import (
    BaseEventTrigger,
    RunnerConfig,
    TriggerEvent,
    TriggerRunner,
    WatchSpec,
    configure_logging,
)
from watchkeeper.triggerer.api import api_context, make_token, serve_app
from watchkeeper.triggerer.runtime._metrics import RuntimeMetrics
from watchkeeper.triggerer.settings import ApiSettings

RESULTS = Path(__file__).parent / "results"


class Firehose(BaseEventTrigger):
    """Yields events as fast as they commit, each advancing the watermark."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"name": self.name}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        n = await self.asset_state_store.aget("wm", 0)
        while True:
            n += 1
            yield TriggerEvent({"n": n}, state={"wm": n})


class Idle(BaseEventTrigger):
    """One event, then nothing: a watcher with a series and no load."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"name": self.name}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"hello": self.name})
        await anyio.sleep_forever()


class SampledMetrics(RuntimeMetrics):
    """The runtime's metrics, also keeping every commit latency inside the window."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = False
        self.latencies: list[float] = []

    def observe_commit(self, seconds: float) -> None:
        super().observe_commit(seconds)
        if self.recording:
            self.latencies.append(seconds)


CLIENT = r"""
import sys, threading, time, httpx
base, token, seconds, query = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
stop = time.monotonic() + seconds
seen = [0]
def sse():
    headers = {"Authorization": "Bearer " + token}
    try:
        url = base + "/api/v1/events/stream" + query
        with httpx.stream("GET", url, headers=headers, timeout=None) as r:
            # Raw chunks, frames counted by their "data: " lines: a client that keeps up with
            # the firehose for a small share of a core (iter_lines took about a tenth of one,
            # on the same two cores as the daemon it measures).
            tail = b""
            for chunk in r.iter_raw():
                block = tail + chunk
                seen[0] += block.count(b"\ndata: ")
                tail = block[-6:]
                if time.monotonic() > stop:
                    return
    except httpx.HTTPError:
        pass
threading.Thread(target=sse, daemon=True).start()
scrapes, failed = [], 0
with httpx.Client(base_url=base, timeout=10) as client:
    while time.monotonic() < stop:
        t = time.perf_counter()
        try:
            client.get("/metrics").raise_for_status()
        except httpx.HTTPError:
            failed += 1  # reported, not fatal: the run's figures still come back
        else:
            scrapes.append(time.perf_counter() - t)
        time.sleep(1.0)
print(len(scrapes), max(scrapes) if scrapes else 0.0, seen[0], time.process_time(), failed)
"""


MODES = {
    "none": None,
    "api-one-asset": "?asset=a0",  # a scrape every second, SSE tailing one asset
    "api-all-events": "",  # a scrape every second, SSE receiving every event (worst case)
    # The same client served by a separate `watchkeeper api` process on the same file: the
    # daemon runs no API at all, and the stream's reads and sends are the other process's.
    "api-process-all-events": "",
}
SEPARATE = {"api-process-all-events"}


WATCHKEEPER = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for_port(port: int) -> None:
    with anyio.fail_after(20.0):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
            else:
                await stream.aclose()
                return


async def open_client(port: int, token: str, window: float, query: str | None) -> anyio.abc.Process:
    return await anyio.open_process(
        [
            sys.executable,
            "-c",
            CLIENT,
            f"http://127.0.0.1:{port}",
            token,
            str(window + 2),
            query or "",
        ],
        stderr=subprocess.DEVNULL,
    )


async def one_run(tmp: Path, watchers: int, window: float, mode: str) -> dict[str, Any]:
    query = MODES[mode]
    with_api = query is not None and mode not in SEPARATE
    assets = [Asset(f"a{i}") for i in range(watchers)]
    config = RunnerConfig(capacity=watchers + 10, status_interval=2.0)
    db = tmp / f"bench-{time.monotonic_ns()}.db"
    async with SqliteStateBackend(db) as backend:
        await backend.events.aregister_assets(assets)
        async with TriggerRunner(backend, config) as runner, anyio.create_task_group() as tg:
            metrics = SampledMetrics()
            runner.metrics = metrics
            client: anyio.abc.Process | None = None
            server: anyio.abc.Process | None = None
            if mode in SEPARATE:
                text, row = make_token("bench", ["read"], now=backend.clock())
                await backend.controls.acreate_token(row)
                port = free_port()
                server = await anyio.open_process(
                    [
                        *WATCHKEEPER,
                        "--database-url",
                        f"sqlite:///{db}",
                        "--log-level",
                        "warning",
                        "api",
                        "--port",
                        str(port),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                await wait_for_port(port)
                client = await open_client(port, text, window, query)
            elif with_api:
                text, row = make_token("bench", ["read"], now=backend.clock())
                await backend.controls.acreate_token(row)
                ctx = api_context(backend, ApiSettings(port=0))
                ctx.runner = runner
                ctx.metrics.runner = runner
                port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
                client = await open_client(port, text, window, query)
            for i, asset in enumerate(assets):
                await runner.start_trigger(WatchSpec(f"w{i}", Firehose(f"w{i}"), (asset,)))
            await anyio.sleep(2.0)  # warm up (and let the client connect)
            before = sum(metrics.events.values())
            metrics.recording = True
            started, cpu = time.perf_counter(), time.process_time()
            await anyio.sleep(window)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            metrics.recording = False
            committed = sum(metrics.events.values()) - before
            result: dict[str, Any] = {
                "mode": mode,
                "events_per_s": committed / elapsed,
                "p99_commit_ms": pct(metrics.latencies, 0.99) * 1000,
                "p50_commit_ms": pct(metrics.latencies, 0.50) * 1000,
                # This process's CPU (all its threads) per 1000 events: the daemon's own cost,
                # steadier than events/s on a machine shared with other work.
                "cpu_ms_per_1000_events": cpu * 1000 / max(committed / 1000, 1e-9),
            }
            if client is not None:
                assert client.stdout is not None
                # One receive may hold part of the line: read to the end.
                out = b"".join([chunk async for chunk in client.stdout]).decode().split()
                await client.wait()
                await client.aclose()
                if len(out) != 5:
                    raise RuntimeError(f"the client process failed (exit {client.returncode})")
                result.update(scrapes=int(out[0]), max_scrape_ms=float(out[1]) * 1000)
                result["failed_scrapes"] = int(out[4])
                result["sse_events_seen"] = int(out[2])
                # The client's own CPU (its process, all of its run): on the same machine it
                # competes with the daemon for the cores.
                result["client_cpu_s"] = float(out[3])
            if server is not None:
                server.terminate()
                await server.wait()
                await server.aclose()
            tg.cancel_scope.cancel()
    return result


async def cost_of_api(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    modes = list(MODES)
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = modes if round_ % 2 == 0 else modes[::-1]
            for mode in order:
                run = await one_run(Path(tmp), args.watchers, args.window, mode)
                print(json.dumps(run))
                runs.append(run)

    def median(key: str, mode: str) -> float:
        return float(statistics.median(r[key] for r in runs if r["mode"] == mode))

    out: dict[str, Any] = {"watchers": args.watchers, "window_s": args.window, "runs": runs}
    base_eps, base_p99 = median("events_per_s", "none"), median("p99_commit_ms", "none")
    for mode in modes:
        eps, p99 = median("events_per_s", mode), median("p99_commit_ms", mode)
        out[mode] = {
            "cpu_ms_per_1000_events": median("cpu_ms_per_1000_events", mode),
            "events_per_s": eps,
            "p99_commit_ms": p99,
            "events_per_s_change_pct": (eps / base_eps - 1) * 100,
            "p99_commit_change_pct": (p99 / base_p99 - 1) * 100,
        }
    return out


async def scrape_time(args: argparse.Namespace) -> dict[str, Any]:
    n = args.scrape_watchers
    assets = [Asset(f"a{i}") for i in range(n)]
    out: dict[str, Any] = {"watchers": n}
    async with MemoryStateBackend() as backend:
        await backend.events.aregister_assets(assets)
        config = RunnerConfig(capacity=n + 10, status_interval=0, lag_threshold=0)
        async with TriggerRunner(backend, config) as runner:
            started = time.perf_counter()
            for i, asset in enumerate(assets):
                await runner.start_trigger(WatchSpec(f"w{i}", Idle(f"w{i}"), (asset,)))
            out["start_s"] = time.perf_counter() - started
            while sum(runner.metrics.events.values()) < n:  # noqa: ASYNC110 - a benchmark's wait
                await anyio.sleep(0.1)
            for cap in (2000, n):
                async with anyio.create_task_group() as tg:
                    ctx = api_context(backend, ApiSettings(port=0, max_watcher_series=cap))
                    ctx.runner = runner
                    ctx.metrics.runner = runner
                    port = await tg.start(
                        functools.partial(serve_app, ctx, host="127.0.0.1", port=0)
                    )
                    times, cpus, size = [], [], 0
                    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                        for _ in range(args.scrapes):
                            t, cpu = time.perf_counter(), time.process_time()
                            response = await client.get("/metrics")
                            times.append(time.perf_counter() - t)
                            cpus.append(time.process_time() - cpu)
                            size = len(response.content)
                    tg.cancel_scope.cancel()
                out[f"cap_{cap}"] = {
                    "median_ms": statistics.median(times) * 1000,
                    "max_ms": max(times) * 1000,
                    # The process's CPU for one scrape (the server and this client: one
                    # process), steadier than the wall time on a busy machine.
                    "median_cpu_ms": statistics.median(cpus) * 1000,
                    "bytes": size,
                }
                print(json.dumps({f"cap_{cap}": out[f"cap_{cap}"]}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows, one round each")
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scrape-watchers", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--skip-scrape", action="store_true", help="only the cost of the API")
    parser.add_argument("--skip-cost", action="store_true", help="only the scrape time")
    parser.add_argument("--out", type=Path, default=RESULTS / "api.json")
    args = parser.parse_args()
    if args.quick:
        args.window, args.rounds, args.scrapes = 4.0, 1, 5
    configure_logging("warning", "json")
    result: dict[str, Any] = {"loadavg_before": loadavg(), "cpus": os.cpu_count()}
    if not args.skip_cost:
        result["cost"] = anyio.run(cost_of_api, args, backend="asyncio")
    if not args.skip_scrape:
        result["scrape"] = anyio.run(scrape_time, args, backend="asyncio")
    result["loadavg_after"] = loadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    cost, scrape = result.get("cost"), result.get("scrape")
    print()
    print(f"load average {result['loadavg_before']} -> {result['loadavg_after']}")
    for mode in MODES if cost is not None else ():
        assert cost is not None
        row = cost[mode]
        print(
            f"{mode:15} {row['events_per_s']:8.0f} events/s ({row['events_per_s_change_pct']:+.1f} %),"
            f" p99 commit {row['p99_commit_ms']:7.2f} ms ({row['p99_commit_change_pct']:+.1f} %),"
            f" CPU {row['cpu_ms_per_1000_events']:.0f} ms per 1000 events"
        )
    if scrape is None:
        return
    for key in ("cap_2000", f"cap_{scrape['watchers']}"):
        s = scrape[key]
        print(
            f"/metrics with {scrape['watchers']} watchers, {key}: median {s['median_ms']:.1f} ms, "
            f"max {s['max_ms']:.1f} ms, CPU {s['median_cpu_ms']:.1f} ms, {s['bytes']} bytes "
            "(goal < 100 ms)"
        )


if __name__ == "__main__":
    main()
