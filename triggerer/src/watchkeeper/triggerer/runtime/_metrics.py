"""The runner's own counters, kept as plain numbers for the ``/metrics`` collector.

Everything here is written from the event loop's thread only (the supervisors call it after
each commit), so it needs no lock; the collector reads it at scrape time, also on the loop.
Per-event cost: one ``bisect`` and a few integer additions.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from watchkeeper.store import AssetEvent

__all__ = ["COMMIT_SECONDS_BUCKETS", "Histogram", "RuntimeMetrics", "StoppedTrigger"]

COMMIT_SECONDS_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Upper bounds (seconds) of ``watchkeeper_commit_seconds``' buckets (and +Inf)."""


class Histogram:
    """Fixed buckets: counts per bucket (the last is +Inf), their sum and their number."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs as Prometheus wants them, ending with ``+Inf``."""
        running = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


@dataclass(frozen=True, slots=True)
class StoppedTrigger:
    """What ``/metrics`` keeps of a trigger the runner stopped, so its series persist."""

    watcher_name: str
    watchers: tuple[str, ...]
    last_event_at: datetime | None


class RuntimeMetrics:
    """What a :class:`~watchkeeper.triggerer.runner.TriggerRunner` counts for ``/metrics``."""

    def __init__(self) -> None:
        self.commit_seconds = Histogram(COMMIT_SECONDS_BUCKETS)
        self.fenced_writes = 0
        """Writes the store refused because the trigger's lease had moved."""
        self.events: dict[tuple[str, str], int] = {}
        """Committed asset events by (asset, watcher name), kept across restarts of a trigger."""
        self.failures: dict[str, int] = {}
        """Failed runs by trigger_id, in total (the status's ``failures`` is consecutive)."""
        self.stopped: dict[str, StoppedTrigger] = {}
        """Triggers stopped by the runner (and not started again), by trigger_id."""

    def observe_commit(self, seconds: float) -> None:
        self.commit_seconds.observe(seconds)

    def count_events(self, events: list[AssetEvent]) -> None:
        counts = self.events
        for event in events:
            key = (event.asset, event.watcher)
            counts[key] = counts.get(key, 0) + 1

    def count_failure(self, trigger_id: str) -> None:
        self.failures[trigger_id] = self.failures.get(trigger_id, 0) + 1

    def trigger_stopped(
        self,
        trigger_id: str,
        watcher_name: str,
        watchers: tuple[str, ...],
        last_event_at: datetime | None,
    ) -> None:
        self.stopped[trigger_id] = StoppedTrigger(watcher_name, watchers, last_event_at)

    def trigger_started(self, trigger_id: str) -> None:
        self.stopped.pop(trigger_id, None)
