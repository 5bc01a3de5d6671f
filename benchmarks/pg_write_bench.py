"""PostgreSQL write-path benchmark: durable events/s with watermarks, and state writes.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/pg_write_bench.py [--rounds 3] [--watchers 100 1000] [--profile]

The write-path figures of ``triggerer_bench.py`` and ``store_bench.py`` on PostgreSQL alone,
each beside its baseline in the same run, in rounds (baseline and ours take turns, so a load
change hits both):

- *events*: N watchers each committing ``{"n": n}`` with ``state={"watermark": n}`` as fast
  as its commits return, through the raw asyncpg group-commit pipeline
  (``_raw_pipeline.py``), through the backend alone (``acommit_event``), and through the
  runtime (``TriggerRunner``); events/s over a window, read from the database;
- *state writes*: 1,000 coroutines each upserting distinct keys with ``aset``, against the
  raw loop of 1,000-row transactions (``executemany``) on one asyncpg connection.

``--profile`` runs pyinstrument over the backend-only and runtime windows and writes its
HTML next to the JSON. ``--sqlite`` runs the events rows on SQLite instead (the same three
pipelines, the raw one on aiosqlite; no state writes). Writes
``benchmarks/results/pg_write.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import store_bench
import triggerer_bench
from _bench_measure import loadavg
from watchkeeper.store import PostgresStateBackend
from watchkeeper.triggerer import configure_logging


async def _events(kind: str, n: int, args: Any, tmp: Path) -> dict[str, Any]:
    return {
        "raw": await triggerer_bench.throughput_raw(kind, n, args, tmp),
        "backend": await triggerer_bench.throughput_backend(kind, n, args, tmp),
        "ours": await triggerer_bench.throughput_ours(kind, n, args, tmp),
        "load": loadavg(),
    }


async def _writes(n: int, writers: int) -> dict[str, Any]:
    raw = await store_bench.raw_asyncpg_batched(n)
    async with store_bench.fresh_schema() as schema:
        ours, _ = await store_bench.with_backend(
            partial(PostgresStateBackend, store_bench.PG_DSN, schema=schema),
            partial(store_bench.ours_throughput, n=n, writers=writers),
        )
    return {"raw_batch1000": raw, "ours": ours, "load": loadavg()}


async def run(args: Any) -> dict[str, Any]:
    configure_logging("warning", "json", stream=triggerer_bench.LOGS)  # type: ignore[arg-type]
    kind = "sqlite" if args.sqlite else "postgres"
    out: dict[str, Any] = {
        "kind": kind,
        "events": {str(n): [] for n in args.watchers},
        "writes": [],
    }
    with tempfile.TemporaryDirectory(prefix="wk-bench-") as tmp:
        for r in range(args.rounds):
            for n in args.watchers:
                print(f"  round {r + 1}: events, {n} watchers ...", flush=True)
                out["events"][str(n)].append(await _events(kind, n, args, Path(tmp)))
            if args.writes and kind == "postgres":
                print(f"  round {r + 1}: 1,000 writers' state writes ...", flush=True)
                out["writes"].append(await _writes(args.writes_n, 1000))
    return out


def report(out: dict[str, Any]) -> None:
    for n, rounds in out["events"].items():
        print(f"{out['kind']}: events/s with watermarks, {n} watchers")
        ratios = []
        for i, r in enumerate(rounds, 1):
            raw = r["raw"]["events_per_s"]
            be, ours = r["backend"]["events_per_s"], r["ours"]["events_per_s"]
            ratios.append(ours / raw)
            print(
                f"  {i}: raw {raw:>8.0f}  backend {be:>8.0f} ({be / raw:.2f}x)  "
                f"ours {ours:>8.0f} ({ours / raw:.2f}x)  load {r['load']}"
                f"  check {r['ours']['check']}"
            )
        print(f"  median ours/raw {statistics.median(ratios):.2f}x")
    if out["writes"]:
        print("1,000 writers' state writes (goal: >= 0.5x the raw 1000-row transactions)")
        ratios = []
        for i, r in enumerate(out["writes"], 1):
            ratios.append(r["ours"] / r["raw_batch1000"])
            print(
                f"  {i}: raw {r['raw_batch1000']:>8.0f}/s  ours {r['ours']:>8.0f}/s "
                f"({ratios[-1]:.2f}x)  load {r['load']}"
            )
        print(f"  median {statistics.median(ratios):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--watchers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--no-writes", dest="writes", action="store_false")
    parser.add_argument("--sqlite", action="store_true", help="the events rows on SQLite")
    parser.add_argument("--writes-n", type=int, default=20_000)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--profile", action="store_true", help="pyinstrument over ours")
    parser.add_argument("--dsn", default=triggerer_bench.PG_DSN)
    parser.add_argument("--out", default="benchmarks/results/pg_write.json")
    args = parser.parse_args()
    args.tp_window, args.warmup = args.window, 1.0
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(async_mode="disabled")
        profiler.start()
    out = anyio.run(run, args)
    if args.profile:
        profiler.stop()
        Path(args.out).with_suffix(".html").write_text(profiler.output_html())
        print(profiler.output_text(unicode=False, color=False, show_all=False)[:20000])
    report(out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
