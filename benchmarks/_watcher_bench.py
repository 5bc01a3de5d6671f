"""The watcher side and the report of the benchmarks that set a watcher against a raw loop.

Each of those benchmarks (Kafka, Pub/Sub, SQS, S3, PostgreSQL changes) times a raw loop of its
own, then the watcher through the real runtime on a fresh SQLite file, for a few runs, and
reports each side's best rate and the ratio watcher/raw. The watcher's side and the report are
the same for all of them, so they live here. Not part of any package.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from watchkeeper.store import SqliteStateBackend
from watchkeeper.triggerer import Asset, BaseEventTrigger
from watchkeeper.triggerer.testing import run_trigger

__all__ = ["Rates", "timed_watcher"]


async def timed_watcher(watcher: BaseEventTrigger, count: int, db: Path, items: str) -> float:
    """Seconds ``watcher`` takes, under ``run_trigger`` on a fresh SQLite store at ``db``, to
    commit ``count`` events; raises ``RuntimeError`` naming ``items`` when fewer came."""
    async with SqliteStateBackend(db) as backend:
        start = time.perf_counter()
        events = await run_trigger(
            watcher, assets=Asset("bench"), backend=backend, max_events=count, watcher_name="b"
        )
        elapsed = time.perf_counter() - start
    if len(events) < count:
        raise RuntimeError(f"the watcher committed {len(events)} of {count} {items}")
    return elapsed


class Rates:
    """Each side's rate (``count`` items per second) in every run, printed as a run ends."""

    def __init__(self, count: int, *sides: str) -> None:
        self.count = count
        self.rates: dict[str, list[float]] = {side: [] for side in sides}

    def add(self, run: int, **seconds: float) -> None:
        """Record run ``run`` (0-based): the seconds each side took."""
        shown = []
        for side, elapsed in seconds.items():
            rate = self.count / elapsed
            self.rates[side].append(rate)
            shown.append(f"{side.replace('_', ' ')} {rate:,.0f}/s")
        print(f"run {run + 1}: {', '.join(shown)}")

    def write(self, name: str, **settings: Any) -> None:
        """Print and write ``benchmarks/results/<name>.json``: ``settings``, each side's best
        rate (``<side>_per_s``), the ratio of the watcher's best to the raw loop's, and the
        load average."""
        best = {side: max(rates) for side, rates in self.rates.items()}
        summary = {
            **settings,
            **{f"{side}_per_s": round(rate) for side, rate in best.items()},
            "ratio": round(best["watcher"] / best["raw"], 2),
            "load": [round(x, 1) for x in os.getloadavg()],
        }
        print(json.dumps(summary))
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
