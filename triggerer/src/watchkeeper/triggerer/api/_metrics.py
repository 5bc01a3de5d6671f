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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.backend import StatusTable, TaskQueue, TriggerStatus

from ._task_metrics import TaskMetrics

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
        self._task_metrics: TaskMetrics | None = None
        self._labels: dict[str, str] = {}  # watcher name -> its escaped label text

    async def prepare(self) -> None:
        """Read the status rows when no runner is in this process (``watchkeeper api``)."""
        if self.runner is None and isinstance(self.backend, StatusTable):
            self._statuses = await self.backend.alist_trigger_status()
        backend = self.backend
        if isinstance(backend, TaskQueue):
            tasks = TaskMetrics(backend)
            await tasks.prepare()
            self._task_metrics = tasks

    # -- the collector ------------------------------------------------------------------------

    def _samples(self) -> tuple[dict[str, int], list[WatcherSample], int]:
        """Watchers by state (every watcher), the samples of the ``max_watcher_series`` with
        the most events, and how many watchers there are in all.

        Only the watchers that keep their series are turned into samples: with 10,000
        watchers and the default cap, 8,000 are counted and never built.
        """
        cap = self.max_watcher_series
        by_state = dict.fromkeys(STATES, 0)
        runner = self.runner
        if runner is None:
            statuses = self._statuses
            for s in statuses:
                by_state[s.state] = by_state.get(s.state, 0) + 1
            if len(statuses) > cap:
                statuses = heapq.nlargest(cap, statuses, key=lambda s: s.events)
            shown = [
                WatcherSample(
                    s.watchers[0] if s.watchers else s.trigger_id,
                    s.state,
                    {",".join(s.assets): s.events},
                    s.failures,
                    s.last_event_at,
                )
                for s in statuses
            ]
            return by_state, shown, len(self._statuses)
        metrics = runner.metrics
        by_watcher: dict[str, dict[str, int]] = {}
        for (asset, watcher), count in metrics.events.items():
            by_watcher.setdefault(watcher, {})[asset] = count
        slots = runner.slots()
        for slot in slots:
            by_state[slot.state] = by_state.get(slot.state, 0) + 1
        kept = slots
        if len(slots) > cap:
            no_events: dict[str, int] = {}
            kept = heapq.nlargest(
                cap,
                slots,
                key=lambda slot: sum(by_watcher.get(slot.watcher_name, no_events).values()),
            )
        shown = [
            WatcherSample(
                slot.watcher_name,
                slot.state,
                by_watcher.get(slot.watcher_name, {}),
                metrics.failures.get(slot.trigger_id, 0),
                slot.last_event_at,
            )
            for slot in kept
        ]
        return by_state, shown, len(slots)

    def collect(self) -> Iterator[Metric]:
        """The families of :meth:`render`'s text (prometheus-client's collector protocol)."""
        yield from text_string_to_metric_families(self.render().decode())

    def render(self) -> bytes:
        """The exposition text (call :meth:`prepare` first, on the same loop).

        Written directly rather than through ``generate_latest``: with thousands of watchers
        the generic path spends most of a scrape building and formatting sample objects.
        """
        by_state, shown, watchers = self._samples()
        out: list[str] = []

        def family(name: str, kind: str, text: str, rows: list[str]) -> None:
            out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
            out.extend(rows)

        family(
            "watchkeeper_watchers",
            "gauge",
            "Watchers by state (every watcher).",
            [f'watchkeeper_watchers{{state="{_esc(k)}"}} {v}\n' for k, v in by_state.items()],
        )
        family(
            "watchkeeper_watcher_series_dropped",
            "gauge",
            "Watchers left out of the per-watcher series by [api] max_watcher_series.",
            [f"watchkeeper_watcher_series_dropped {watchers - len(shown)}\n"],
        )
        events: list[str] = []
        up: list[str] = []
        states: list[str] = []
        last: list[str] = []
        failures: list[str] = []
        labels = self._labels
        if len(labels) > 2 * watchers + 1024:
            labels.clear()
        for sample in shown:
            name = sample.watcher
            label = labels.get(name)
            if label is None:
                label = labels[name] = f'watcher="{_esc(name)}"'
            for asset, count in sample.events.items():
                events.append(
                    f'watchkeeper_events_total{{asset="{_esc(asset)}",{label}}} {count}\n'
                )
            current = sample.state
            up.append(f"watchkeeper_watcher_up{{{label}}} {1 if current == 'running' else 0}\n")
            for each in STATES:
                flag = 1 if current == each else 0
                states.append(f'watchkeeper_watcher_state{{{label},state="{each}"}} {flag}\n')
            if sample.last_event_at is not None:
                stamp = sample.last_event_at.timestamp()
                last.append(
                    f"watchkeeper_watcher_last_event_timestamp_seconds{{{label}}} {stamp!r}\n"
                )
            failures.append(f"watchkeeper_watcher_failures_total{{{label}}} {sample.failures}\n")
        family("watchkeeper_events_total", "counter", "Asset events committed.", events)
        family("watchkeeper_watcher_up", "gauge", "1 while the watcher runs, else 0.", up)
        family(
            "watchkeeper_watcher_state",
            "gauge",
            "1 for the watcher's current state, 0 for the others.",
            states,
        )
        family(
            "watchkeeper_watcher_last_event_timestamp_seconds",
            "gauge",
            "Unix time of the watcher's last committed event.",
            last,
        )
        family(
            "watchkeeper_watcher_failures_total",
            "counter",
            "Failed runs of the watcher (run() raised or returned).",
            failures,
        )
        backend = f'backend="{_esc(_backend_label(self.backend))}"'
        runner = self.runner
        if runner is not None:
            hist = runner.metrics.commit_seconds
            family(
                "watchkeeper_commit_seconds",
                "histogram",
                "Seconds from an event's commit call to its durable commit.",
                _histogram("watchkeeper_commit_seconds", backend, hist.cumulative(), hist.total),
            )
            family(
                "watchkeeper_fenced_writes_total",
                "counter",
                "Writes the store refused because the watcher's lease had moved.",
                [f"watchkeeper_fenced_writes_total {runner.metrics.fenced_writes}\n"],
            )
        sizes = getattr(self.backend, "commit_batch_sizes", None)
        if sizes is not None:
            family(
                "watchkeeper_commit_batch_size",
                "histogram",
                "Operations per group-commit transaction.",
                _histogram(
                    "watchkeeper_commit_batch_size", backend, sizes.cumulative(), sizes.total
                ),
            )
        if self.lag is not None:
            family(
                "watchkeeper_loop_lag_seconds",
                "gauge",
                "How late the event loop last woke a task that slept 0.25 s.",
                [f"watchkeeper_loop_lag_seconds {self.lag.lag!r}\n"],
            )
        if self.daemon is not None:
            try:
                held = len(self.daemon.leases.held)
            except RuntimeError:  # the daemon is closing
                held = 0
            family(
                "watchkeeper_leases_held",
                "gauge",
                "Watcher leases this daemon holds.",
                [f"watchkeeper_leases_held {held}\n"],
            )
        if self._task_metrics is not None:
            out.append(self._task_metrics.render())
        return "".join(out).encode()


def _esc(value: str) -> str:
    """A label value escaped for the text format."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _histogram(
    name: str, label: str, buckets: Sequence[tuple[str, float]], total: float
) -> list[str]:
    rows = [f'{name}_bucket{{{label},le="{le}"}} {count}\n' for le, count in buckets]
    rows.append(f"{name}_count{{{label}}} {buckets[-1][1]}\n")
    rows.append(f"{name}_sum{{{label}}} {float(total)!r}\n")
    return rows
