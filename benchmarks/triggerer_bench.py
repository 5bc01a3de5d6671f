"""Triggerer benchmark: watchers started, idle cost, durable events/s and event-to-commit latency.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/triggerer_bench.py [--quick] [--no-postgres] [--stretch] [--loop uvloop]

It measures the real runtime (``TriggerRunner`` supervising ``BaseEventTrigger`` watchers over
``SqliteStateBackend`` / ``PostgresStateBackend``) with fake in-process sources, and beside it,
in the same process and the same run, a baseline doing the same work without the runtime:

- idle watchers: bare anyio tasks iterating the same trigger generators;
- events: the raw group-commit pipeline on aiosqlite / asyncpg (see ``_raw_pipeline.py``).

Our figures are printed as ratios to the baseline, next to the project's goals. The idle
measurements (start time, RSS per watcher, idle CPU) each run in a fresh child process, because
an RSS delta is only meaningful in a process that has not freed memory before (freed memory is
reused without growing RSS). Writes ``benchmarks/results/triggerer.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from _bench_measure import LOGS, CpuWindow, loadavg, pct, rss_bytes
from _raw_pipeline import open_raw_pipeline
from _triggerer_fixtures import (
    PLANS,
    SOURCES,
    Database,
    Firehose,
    IdleSource,
    Paced,
    Plan,
    PollingWatcher,
    commit_firehose,
    firehose_producer,
    open_database,
    paced_producer,
)
from _triggerer_report import report
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer import (
    BaseEventTrigger,
    RunnerConfig,
    TriggerRunner,
    WatchSpec,
    configure_logging,
)
from watchkeeper.triggerer.daemon._gctune import raise_gen0_threshold, startup_gc

PG_DSN = os.environ.get("WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
RAW_MAX_BATCH = {"sqlite": 1024, "postgres": 2048}  # the backends' own writer batch limits

# -- idle watchers (run in a child process) ---------------------------------------------------


async def _drive_bare(trigger: BaseEventTrigger) -> None:
    """The baseline: iterate the trigger's generator in a bare task, no runtime around it."""
    async for _ in trigger.run():
        pass


async def idle_child(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging("warning", "json", stream=LOGS)  # type: ignore[arg-type]
    if args.no_gc:
        gc.disable()  # a diagnosis: how much of the cost is the cyclic garbage collector
    n = args.count
    source = IdleSource(n)
    SOURCES["idle"] = source
    out: dict[str, Any] = {"count": n, "interval_s": args.interval, "load_before": loadavg()}

    async def measure(start: Callable[[list[BaseEventTrigger]], Awaitable[None]]) -> None:
        gc.collect()
        rss0 = rss_bytes()
        # --tune-gc: what Daemon(tune_gc=True) does around its first load (which builds and
        # starts the triggers): the collector paused, then gc.freeze() of what is alive.
        with startup_gc() if args.tune_gc else contextlib.nullcontext():
            triggers: list[BaseEventTrigger] = [
                PollingWatcher("idle", args.interval) for _ in range(n)
            ]
            t0 = time.perf_counter()
            await start(triggers)
            out["start_s"] = time.perf_counter() - t0
        await source.all_started.wait()
        out["all_running_s"] = time.perf_counter() - t0
        await anyio.sleep(args.settle)
        gc.collect()
        out["rss_per_watcher_bytes"] = (rss_bytes() - rss0) / n
        out["rss_total_bytes"] = rss_bytes()  # the whole process: the stretch's 1 GiB goal
        polls0 = source.polls
        with CpuWindow() as cpu:
            await anyio.sleep(args.window)
        out.update(
            idle_cores=cpu.cores,
            user_s=cpu.user,
            system_s=cpu.system,
            window_s=cpu.wall,
            polls_per_s=(source.polls - polls0) / cpu.wall,
            cpu_us_per_poll=cpu.cpu / max(1, source.polls - polls0) * 1e6,
        )

    if args.mode == "raw":
        async with anyio.create_task_group() as tg:

            async def start_bare(triggers: list[BaseEventTrigger]) -> None:
                for trigger in triggers:
                    tg.start_soon(_drive_bare, trigger)

            await measure(start_bare)
            t_stop = time.perf_counter()
            tg.cancel_scope.cancel()
        out["stop_s"] = time.perf_counter() - t_stop
    else:
        with tempfile.TemporaryDirectory(prefix="wk-bench-") as tmp:
            async with (
                open_database(args.backend, Path(tmp), args.dsn) as db,
                db.backend() as backend,
            ):
                assets = [Asset(f"a{i}") for i in range(n)]
                t0 = time.perf_counter()
                await backend.events.aregister_assets(assets)
                out["register_assets_s"] = time.perf_counter() - t0
                config = RunnerConfig(capacity=n, status_interval=args.status_interval)
                runner = TriggerRunner(backend, config)
                async with runner:
                    if args.tune_gc:
                        raise_gen0_threshold()  # as the daemon, once its runner is entered

                    async def start_ours(triggers: list[BaseEventTrigger]) -> None:
                        for i, trigger in enumerate(triggers):
                            spec = WatchSpec(f"w{i}", trigger, (assets[i],))
                            await runner.start_trigger(spec)

                    await measure(start_ours)
                    t_stop = time.perf_counter()
                out["stop_s"] = time.perf_counter() - t_stop
    out["logs"] = LOGS.take()
    out["load_after"] = loadavg()
    return out


def run_idle_child(
    mode: str, backend: str, count: int, interval: float, args: Any, *extra: str
) -> Any:
    cmd = [
        sys.executable, __file__, "--child", "idle", "--mode", mode, "--backend", backend,
        "--count", str(count), "--interval", str(interval), "--settle", str(args.settle),
        "--window", str(args.idle_window), "--dsn", args.dsn, "--loop", args.loop, *extra,
    ]  # fmt: skip
    label = f"idle {mode} {backend if mode == 'ours' else ''} x{count} {' '.join(extra)}"
    print(f"  running {label} (child process) ...", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return {"error": f"child exited {done.returncode}", "stderr": done.stderr[-3000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- durable events per second ----------------------------------------------------------------


async def _window(db: Database, seconds: float) -> tuple[float, float]:
    """Events committed per second over ``seconds``, read from the database; and CPU cores."""
    first = await db.last_event_id()
    t0 = time.perf_counter()
    with CpuWindow() as cpu:
        await anyio.sleep(seconds)
        last = await db.last_event_id()
    return (last - first) / (time.perf_counter() - t0), cpu.cores


async def _start_all(runner: TriggerRunner, specs: list[WatchSpec]) -> float:
    t0 = time.perf_counter()
    for spec in specs:
        await runner.start_trigger(spec)
    return time.perf_counter() - t0


async def throughput_ours(kind: str, n: int, args: Any, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"watchers": n}
    async with open_database(kind, tmp, args.dsn) as db:
        backend: BaseStateBackend
        async with db.backend() as backend:
            assets = [Asset(f"a{i}") for i in range(n)]
            await backend.events.aregister_assets(assets)
            async with TriggerRunner(backend, RunnerConfig(capacity=max(n, 1000))) as runner:
                specs = [WatchSpec(f"w{i}", Firehose(f"w{i}"), (assets[i],)) for i in range(n)]
                out["start_s"] = await _start_all(runner, specs)
                await anyio.sleep(args.warmup)
                stats0 = backend.commit_stats if isinstance(backend, SqliteStateBackend) else None
                out["events_per_s"], out["cores"] = await _window(db, args.tp_window)
                if isinstance(backend, SqliteStateBackend) and stats0 is not None:
                    stats = backend.commit_stats
                    out["mean_batch"] = (stats.writes - stats0.writes) / max(
                        1, stats.batches - stats0.batches
                    )
        out["check"] = await db.consistency()
    out["logs"] = LOGS.take()
    return out


async def throughput_backend(kind: str, n: int, args: Any, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"watchers": n}
    async with open_database(kind, tmp, args.dsn) as db:
        async with db.backend() as backend, anyio.create_task_group() as tg:
            await backend.events.aregister_assets([Asset(f"a{i}") for i in range(n)])
            for i in range(n):
                tg.start_soon(commit_firehose, i, backend)
            await anyio.sleep(args.warmup)
            stats0 = backend.commit_stats if isinstance(backend, SqliteStateBackend) else None
            out["events_per_s"], out["cores"] = await _window(db, args.tp_window)
            if isinstance(backend, SqliteStateBackend) and stats0 is not None:
                stats = backend.commit_stats
                out["mean_batch"] = (stats.writes - stats0.writes) / max(
                    1, stats.batches - stats0.batches
                )
            tg.cancel_scope.cancel()
        out["check"] = await db.consistency()
    return out


async def throughput_raw(kind: str, n: int, args: Any, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"watchers": n}
    async with open_database(kind, tmp, args.dsn) as db:
        async with (
            open_raw_pipeline(db, RAW_MAX_BATCH[kind]) as pipe,
            anyio.create_task_group() as tg,
        ):
            for i in range(n):
                tg.start_soon(firehose_producer, i, i + 1, pipe.submit)
            await anyio.sleep(args.warmup)
            items0, batches0 = pipe.items, pipe.batches
            out["events_per_s"], out["cores"] = await _window(db, args.tp_window)
            out["mean_batch"] = (pipe.items - items0) / max(1, pipe.batches - batches0)
            tg.cancel_scope.cancel()
        out["check"] = await db.consistency()
    return out


# -- open-loop event-to-commit latency --------------------------------------------------------


def _plan(name: str, rate: int, args: Any) -> Plan:
    watchers = args.paced_watchers
    t0 = time.perf_counter() + 1.0  # time to start the emitters
    start = t0 + args.warmup
    plan = Plan(watchers, watchers / rate, t0, start, start + args.lat_window)
    PLANS[name] = plan
    return plan


async def _await_plan(plan: Plan) -> float:
    """Sleep through the schedule, then give the emitters up to 10 s to catch up."""
    with CpuWindow() as cpu:
        await anyio.sleep(max(0.0, plan.end - time.perf_counter()))
    with anyio.move_on_after(10):
        await plan.caught_up.wait()
    return cpu.cores


def _latency_summary(plan: Plan, cores: float) -> dict[str, Any]:
    lat = plan.latencies
    window = plan.end - plan.start
    return {
        "scheduled": plan.expected(),
        "committed": len(lat),
        "sustained_per_s": plan.committed_in_window / window,
        "p50_ms": pct(lat, 0.50) * 1000,
        "p90_ms": pct(lat, 0.90) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
        "p999_ms": pct(lat, 0.999) * 1000,
        "max_ms": max(lat, default=float("nan")) * 1000,
        "mean_ms": (statistics.fmean(lat) if lat else float("nan")) * 1000,
        "cores": cores,
    }


async def latency_ours(kind: str, rate: int, args: Any, tmp: Path) -> dict[str, Any]:
    async with open_database(kind, tmp, args.dsn) as db:
        async with db.backend() as backend:
            assets = [Asset(f"a{i}") for i in range(args.paced_watchers)]
            await backend.events.aregister_assets(assets)
            name = f"ours-{kind}-{rate}"
            plan = _plan(name, rate, args)
            async with TriggerRunner(backend) as runner:
                for i, asset in enumerate(assets):
                    await runner.start_trigger(WatchSpec(f"p{i}", Paced(name, i), (asset,)))
                cores = await _await_plan(plan)
        out = _latency_summary(plan, cores)
        out["check"] = await db.consistency()
    out["logs"] = LOGS.take()
    return out


async def latency_raw(kind: str, rate: int, args: Any, tmp: Path) -> dict[str, Any]:
    async with open_database(kind, tmp, args.dsn) as db:
        async with open_raw_pipeline(db, RAW_MAX_BATCH[kind]) as pipe:
            plan = _plan(f"raw-{kind}-{rate}", rate, args)
            async with anyio.create_task_group() as tg:
                for i in range(args.paced_watchers):
                    tg.start_soon(paced_producer, plan, i, i + 1, pipe.submit)
                cores = await _await_plan(plan)
                tg.cancel_scope.cancel()
        out = _latency_summary(plan, cores)
        out["check"] = await db.consistency()
    return out


# -- the whole run ----------------------------------------------------------------------------


async def event_scenarios(kind: str, args: Any, tmp: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"throughput": {}, "latency": {}}
    for n in args.tp_watchers:
        print(f"  {kind}: durable events/s with {n} watcher(s) ...", flush=True)
        load = loadavg()
        raw = await throughput_raw(kind, n, args, tmp)
        backend = await throughput_backend(kind, n, args, tmp)
        ours = await throughput_ours(kind, n, args, tmp)
        res["throughput"][str(n)] = {"raw": raw, "backend": backend, "ours": ours, "load": load}
    for rate in (1000, 10_000):
        print(f"  {kind}: open-loop latency at {rate} events/s ...", flush=True)
        load = loadavg()
        raw = await latency_raw(kind, rate, args, tmp)
        ours = await latency_ours(kind, rate, args, tmp)
        res["latency"][str(rate)] = {"raw": raw, "ours": ours, "load": load}
    return res


async def run_events(args: Any) -> dict[str, Any]:
    configure_logging("warning", "json", stream=LOGS)  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wk-bench-") as tmp:
        for kind in args.backends:
            out[kind] = await event_scenarios(kind, args, Path(tmp))
    return out


def configure(args: argparse.Namespace) -> None:
    quick = args.quick
    args.backends = ["sqlite"] if args.no_postgres else ["sqlite", "postgres"]
    args.idle_count = 2000 if quick else 10_000
    args.settle = 1.0 if quick else 2.0
    args.idle_window = 3.0 if quick else 10.0
    args.tp_watchers = (1, 100, 1000) if quick else (1, 100, 10_000)
    args.tp_window = 2.0 if quick else 4.0
    args.warmup = 0.5 if quick else 1.0
    args.lat_window = 3.0 if quick else 6.0
    args.paced_watchers = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts and windows")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--stretch", action="store_true", help="also start 100,000 watchers")
    parser.add_argument(
        "--stretch-interval",
        type=float,
        default=10.0,
        help="seconds between two polls of one stretch watcher (10: the same 10,000 polls/s)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop every measurement runs on (uvloop: the daemon's default)",
    )
    parser.add_argument("--only", choices=("idle", "events"), help="run one half only")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="also run the idle watchers without status saving, and without the cyclic GC",
    )
    parser.add_argument("--out", default="benchmarks/results/triggerer.json")
    parser.add_argument("--dsn", default=PG_DSN)
    parser.add_argument("--child", choices=("idle",), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("raw", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--settle", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--window", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--status-interval", type=float, default=2.0, help=argparse.SUPPRESS)
    parser.add_argument("--no-gc", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tune-gc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    options = {"use_uvloop": True} if args.loop == "uvloop" else {}
    if args.child == "idle":
        print(json.dumps(anyio.run(idle_child, args, backend="asyncio", backend_options=options)))
        return

    configure(args)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "quick": args.quick,
        "loop": args.loop,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_start": loadavg(),
        "idle": {},
    }
    if args.only in (None, "idle"):
        print(f"idle watchers (load {loadavg()})", flush=True)
        n = args.idle_count
        idle = results["idle"]
        idle["raw"] = run_idle_child("raw", "sqlite", n, 1.0, args)
        for kind in args.backends:
            idle[kind] = run_idle_child("ours", kind, n, 1.0, args)
        idle["sqlite_tuned"] = run_idle_child("ours", "sqlite", n, 1.0, args, "--tune-gc")
        if args.diagnose:
            idle["diag_no_status"] = run_idle_child(
                "ours", "sqlite", n, 1.0, args, "--status-interval", "0"
            )
            idle["diag_no_gc"] = run_idle_child("ours", "sqlite", n, 1.0, args, "--no-gc")
            idle["diag_raw_no_gc"] = run_idle_child("raw", "sqlite", n, 1.0, args, "--no-gc")
        if args.stretch:
            every = args.stretch_interval
            idle["stretch_raw"] = run_idle_child("raw", "sqlite", 100_000, every, args)
            # As the daemon runs them (Daemon(tune_gc=True)).
            idle["stretch_sqlite"] = run_idle_child(
                "ours", "sqlite", 100_000, every, args, "--tune-gc"
            )
    if args.only in (None, "events"):
        print(f"events (load {loadavg()})", flush=True)
        results["events"] = anyio.run(run_events, args, backend="asyncio", backend_options=options)
    results["load_end"] = loadavg()
    results["elapsed_s"] = time.perf_counter() - started

    report(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out} ({results['elapsed_s']:.0f} s)")


if __name__ == "__main__":
    main()
