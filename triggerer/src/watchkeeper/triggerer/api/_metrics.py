"""``GET /metrics``: one prometheus-client collector computed at scrape time.

Nothing is registered per watcher and nothing is locked per event: the runner keeps plain
counters (:mod:`.._runtime_metrics`, the trigger slots), and at each scrape :class:`Metrics`
turns them into metric families. In ``watchkeeper api`` (no runner in the process) the watcher
series come from the status rows the daemons save.

Per-watcher series are capped by ``[api] max_watcher_series`` (the watchers with the most
events keep theirs); the per-state totals ``watchkeeper_watchers{state}`` always count every
watcher, and ``watchkeeper_watcher_series_dropped`` says how many were left out.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from watchkeeper.store import BaseStateBackend, TriggerStatus

if TYPE_CHECKING:
    from ..daemon import Daemon
    from ..runner import TriggerRunner

__all__ = ["CONTENT_TYPE", "LoopLagProbe", "Metrics", "WatcherSample"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("running", "backing_off", "failed", "stopped", "paused")


class LoopLagProbe:
    """Measures how late the event loop wakes a task that sleeps ``interval`` seconds."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.lag = 0.0

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await anyio.sleep(self.interval)
            self.lag = max(time.perf_counter() - start - self.interval, 0.0)


@dataclass(slots=True)
class WatcherSample:
    """One watcher's numbers at scrape time."""

    watcher: str
    state: str
    events: dict[str, int]
    failures: int
    last_event_at: datetime | None

    @property
    def total(self) -> int:
        return sum(self.events.values())


def _backend_label(backend: BaseStateBackend) -> str:
    name = type(backend).__name__
    return name.removesuffix("StateBackend").lower() or name


class Metrics:
    """The collector: :meth:`prepare` (async, reads what needs the store) then :meth:`render`."""

    def __init__(
        self,
        backend: BaseStateBackend,
        *,
        runner: TriggerRunner | None = None,
        daemon: Daemon | None = None,
        max_watcher_series: int = 2000,
        lag: LoopLagProbe | None = None,
    ) -> None:
        self.backend = backend
        self.runner = runner
        self.daemon = daemon
        self.max_watcher_series = max_watcher_series
        self.lag = lag
        self._statuses: list[TriggerStatus] = []
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)

    async def prepare(self) -> None:
        """Read the status rows when no runner is in this process (``watchkeeper api``)."""
        if self.runner is None:
            self._statuses = await self.backend.alist_trigger_status()

    def render(self) -> bytes:
        """The exposition text (call :meth:`prepare` first, on the same loop)."""
        return generate_latest(self._registry)

    # -- the collector ------------------------------------------------------------------------

    def _samples(self) -> list[WatcherSample]:
        runner = self.runner
        if runner is None:
            return [
                WatcherSample(
                    s.watchers[0] if s.watchers else s.trigger_id,
                    s.state,
                    {",".join(s.assets): s.events},
                    s.failures,
                    s.last_event_at,
                )
                for s in self._statuses
            ]
        metrics = runner.metrics
        by_trigger: dict[str, dict[str, int]] = {}
        for (asset, trigger_id), count in metrics.events.items():
            by_trigger.setdefault(trigger_id, {})[asset] = count
        return [
            WatcherSample(
                slot.watcher_name,
                slot.state,
                by_trigger.get(slot.trigger_id, {}),
                metrics.failures.get(slot.trigger_id, 0),
                slot.last_event_at,
            )
            for slot in runner.slots()
        ]

    def collect(self) -> Iterator[Metric]:
        samples = self._samples()
        totals = GaugeMetricFamily(
            "watchkeeper_watchers", "Watchers by state (every watcher).", labels=["state"]
        )
        by_state = dict.fromkeys(STATES, 0)
        for sample in samples:
            by_state[sample.state] = by_state.get(sample.state, 0) + 1
        for state, count in by_state.items():
            totals.add_metric([state], count)
        yield totals

        cap = self.max_watcher_series
        shown = samples
        if len(samples) > cap:
            shown = heapq.nlargest(cap, samples, key=lambda s: s.total)
        dropped = GaugeMetricFamily(
            "watchkeeper_watcher_series_dropped",
            "Watchers left out of the per-watcher series by [api] max_watcher_series.",
        )
        dropped.add_metric([], len(samples) - len(shown))
        yield dropped

        events = CounterMetricFamily(
            "watchkeeper_events", "Asset events committed.", labels=["asset", "watcher"]
        )
        up = GaugeMetricFamily(
            "watchkeeper_watcher_up", "1 while the watcher runs, else 0.", labels=["watcher"]
        )
        states = GaugeMetricFamily(
            "watchkeeper_watcher_state",
            "1 for the watcher's current state, 0 for the others.",
            labels=["watcher", "state"],
        )
        last = GaugeMetricFamily(
            "watchkeeper_watcher_last_event_timestamp_seconds",
            "Unix time of the watcher's last committed event.",
            labels=["watcher"],
        )
        failures = CounterMetricFamily(
            "watchkeeper_watcher_failures",
            "Failed runs of the watcher (run() raised or returned).",
            labels=["watcher"],
        )
        for sample in shown:
            name = sample.watcher
            for asset, count in sample.events.items():
                events.add_metric([asset, name], count)
            up.add_metric([name], 1 if sample.state == "running" else 0)
            for each in STATES:
                states.add_metric([name, each], 1 if sample.state == each else 0)
            if sample.last_event_at is not None:
                last.add_metric([name], sample.last_event_at.timestamp())
            failures.add_metric([name], sample.failures)
        yield from (events, up, states, last, failures)

        label = _backend_label(self.backend)
        runner = self.runner
        if runner is not None:
            hist = runner.metrics.commit_seconds
            commit = HistogramMetricFamily(
                "watchkeeper_commit_seconds",
                "Seconds from an event's commit call to its durable commit.",
                labels=["backend"],
            )
            commit.add_metric([label], hist.cumulative(), sum_value=hist.total)
            yield commit
            fenced = CounterMetricFamily(
                "watchkeeper_fenced_writes",
                "Writes the store refused because the watcher's lease had moved.",
            )
            fenced.add_metric([], runner.metrics.fenced_writes)
            yield fenced
        sizes = getattr(self.backend, "commit_batch_sizes", None)
        if sizes is not None:
            buckets = [(le, float(count)) for le, count in sizes.cumulative()]
            batch = HistogramMetricFamily(
                "watchkeeper_commit_batch_size",
                "Operations per group-commit transaction.",
                labels=["backend"],
            )
            batch.add_metric([label], buckets, sum_value=float(sizes.total))
            yield batch
        if self.lag is not None:
            lag = GaugeMetricFamily(
                "watchkeeper_loop_lag_seconds",
                "How late the event loop last woke a task that slept 0.25 s.",
            )
            lag.add_metric([], self.lag.lag)
            yield lag
        if self.daemon is not None:
            leases = GaugeMetricFamily(
                "watchkeeper_leases_held", "Watcher leases this daemon holds."
            )
            try:
                leases.add_metric([], len(self.daemon.leases.held))
            except RuntimeError:  # the daemon is closing
                leases.add_metric([], 0)
            yield leases
