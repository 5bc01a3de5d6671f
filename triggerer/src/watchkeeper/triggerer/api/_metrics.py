"""``GET /metrics``: one prometheus-client collector computed at scrape time.

Nothing is registered per watcher and nothing is locked per event: the runner keeps plain
counters (:mod:`..runtime._metrics`, the trigger slots), and at each scrape :class:`Metrics`
turns them into metric families. In ``watchkeeper api`` (no runner in the process) the watcher
series come from the status rows the daemons save.

Per-watcher series are capped by ``[api] max_watcher_series`` (the watchers with the most
events keep theirs); the per-state totals ``watchkeeper_watchers{state}`` always count every
watcher, and ``watchkeeper_watcher_series_dropped`` says how many were left out.

A watcher's series persist when it stops: one paused reads ``paused``, one the runner stopped
(its lease lapsed or moved) reads ``stopped``, until it runs again or leaves the watcher files.

A scrape never fails for the store: its reads are bounded by :data:`STORE_READ_TIMEOUT`, and a
failed or late one gives ``watchkeeper_store_up 0`` with the figures of the last read that
succeeded (``watchkeeper_store_read_timestamp_seconds`` is its time).
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import TriggerStatus, get_logger

from .._core import describe_error
from ._task_metrics import TaskMetrics

if TYPE_CHECKING:
    from ..daemon import ControlsTracker, Daemon, WatcherGroup
    from ..runtime import TriggerRunner

__all__ = ["CONTENT_TYPE", "LoopLagProbe", "Metrics", "SourceGauges", "WatcherSample"]

log = get_logger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STORE_READ_TIMEOUT = 2.0
"""Seconds a scrape waits for the store before it answers from the last read."""
STATES = ("running", "backing_off", "failed", "stopped", "paused")
_GAUGE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@runtime_checkable
class SourceGauges(Protocol):
    """A trigger that measures its source: each scrape shows ``source_gauges()``'s values as
    ``watchkeeper_source_<name>{watcher}`` gauges (names in snake case with their unit,
    ``slot_lag_bytes``; a name that is not is left out). Read on the event loop at scrape
    time, so it must return at once, from figures the trigger already holds."""

    def source_gauges(self) -> Mapping[str, float]: ...


class LoopLagProbe:
    """Measures how late the event loop wakes a task that sleeps ``interval`` seconds.

    :param interval: seconds between two wake-ups; ``lag`` is how late the last one came.
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.lag = 0.0

    async def run(self) -> None:
        """Measure until cancelled (start it in the server's task group)."""
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
    gauges: Mapping[str, float] | None = None
    """What the watcher measures of its source (see :class:`SourceGauges`)."""


def _backend_label(backend: BaseStateBackend) -> str:
    name = type(backend).__name__
    return name.removesuffix("StateBackend").lower() or name


class Metrics:
    """The ``/metrics`` collector: :meth:`prepare` (async, reads what needs the store) then
    :meth:`render`.
    :param backend: the open store (task figures; watcher figures when there is no runner).
    :param runner: the runner in this process, whose counters give the watcher figures.
    :param daemon: the daemon in this process (its leases held, its paused watchers).
    :param max_watcher_series: most watchers with series of their own (those with the most events).
    :param lag: the event loop's lag probe, reported when given.
    """

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
        self.store_up: bool | None = None
        """Whether the last :meth:`prepare` read the store (None before the first)."""
        self.read_at: float | None = None
        """Unix time of the last read of the store that succeeded."""

    async def prepare(self) -> None:
        """Read what comes from the store, within :data:`STORE_READ_TIMEOUT`; never raises
        for the store: a failed or late read sets ``store_up`` to False and keeps the figures
        of the last read that succeeded (``read_at`` says when that was).

        The reads: the status rows when no runner is in this process (``watchkeeper api``),
        and the tasks' runs and pending events; a ping when there is nothing to read.
        """
        try:
            with anyio.fail_after(STORE_READ_TIMEOUT):
                await self._read_store()
        except Exception as exc:  # noqa: BLE001 - reported as watchkeeper_store_up 0
            if self.store_up is not False:  # once per outage, not once per scrape
                log.warning("metrics_store_read_failed", error=describe_error(exc))
            self.store_up = False
        else:
            self.store_up = True
            self.read_at = time.time()

    async def _read_store(self) -> None:
        backend = self.backend
        read = False
        statuses: list[TriggerStatus] | None = None
        if self.runner is None and backend.services.status is not None:
            statuses = await backend.status.alist_trigger_status()
            read = True
        task_metrics: TaskMetrics | None = None
        if backend.services.tasks is not None:
            task_metrics = TaskMetrics(backend.tasks, backend.clock)
            await task_metrics.prepare()
            read = True
        if not read:
            await backend.aping()
        # Taken together, once every read succeeded: a scrape never mixes two reads.
        if statuses is not None:
            self._statuses = statuses
        if task_metrics is not None:
            self._task_metrics = task_metrics

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
        watchers = self._runner_watchers(runner)
        for _, _, state, _ in watchers:
            by_state[state] = by_state.get(state, 0) + 1
        kept = watchers
        if len(watchers) > cap:
            no_events: dict[str, int] = {}
            kept = heapq.nlargest(
                cap, watchers, key=lambda w: sum(by_watcher.get(w[1], no_events).values())
            )
        gauges = _source_gauges(runner)
        shown = [
            WatcherSample(
                name,
                state,
                by_watcher.get(name, {}),
                metrics.failures.get(tid, 0),
                at,
                gauges.get(tid),
            )
            for tid, name, state, at in kept
        ]
        return by_state, shown, len(watchers)

    def _runner_watchers(
        self, runner: TriggerRunner
    ) -> list[tuple[str, str, str, datetime | None]]:
        """``(trigger_id, watcher name, state, last event time)`` of every watcher this
        process reports: those in the runner, those it stopped (``stopped``, or ``paused``
        when an operator paused them) and, in a daemon, the paused watchers of its files that
        never ran here. A stopped trigger that left the watcher files is forgotten."""
        rows = [
            (slot.trigger_id, slot.watcher_name, str(slot.state), slot.last_event_at)
            for slot in runner.slots()
        ]
        here = {row[0] for row in rows}
        stopped = runner.metrics.stopped
        wanted: Mapping[str, WatcherGroup] | None = None
        controls: ControlsTracker | None = None
        if self.daemon is not None:
            try:
                placement = self.daemon.placement
            except RuntimeError:  # the daemon is closing
                placement = None
            if placement is not None:
                wanted, controls = placement.wanted, placement.controls
        if wanted is not None:
            for gone in [t for t in stopped if t not in wanted and t not in here]:
                del stopped[gone]

        def paused(tid: str, names: tuple[str, ...]) -> bool:
            return controls is not None and controls.is_paused(names or (tid,))

        for tid, trigger in stopped.items():
            if tid not in here:
                state = "paused" if paused(tid, trigger.watchers) else "stopped"
                rows.append((tid, trigger.watcher_name, state, trigger.last_event_at))
        for tid, group in (wanted or {}).items():
            if tid not in here and tid not in stopped and paused(tid, group.watchers):
                name = group.watchers[0] if group.watchers else tid
                rows.append((tid, name, "paused", None))
        return rows

    def collect(self) -> Iterator[Metric]:
        """The families of :meth:`render`'s text (prometheus-client's collector protocol)."""
        yield from text_string_to_metric_families(self.render().decode())

    def render(self) -> bytes:
        """The exposition text (call :meth:`prepare` first, on the same loop).

        Written directly rather than through ``generate_latest``: with thousands of watchers
        the generic path spends most of a scrape building and formatting sample objects.
        """
        by_state, shown, watchers = self._samples()
        out = _Exposition()
        _watcher_totals(out, by_state, dropped=watchers - len(shown))
        self._watcher_series(out, shown, watchers)
        self._runtime_families(out)
        self._daemon_and_store_families(out)
        if self._task_metrics is not None:
            out.parts.append(self._task_metrics.render())
        return out.text()

    def _watcher_series(self, out: _Exposition, shown: list[WatcherSample], watchers: int) -> None:
        """The per-watcher families: events, up, state, last event time, failures."""
        events: list[str] = []
        up: list[str] = []
        states: list[str] = []
        last: list[str] = []
        failures: list[str] = []
        sources: dict[str, list[str]] = {}
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
            for gauge, value in (sample.gauges or {}).items():
                metric = f"watchkeeper_source_{gauge}"
                sources.setdefault(metric, []).append(f"{metric}{{{label}}} {value!r}\n")
        out.family("watchkeeper_events_total", "counter", "Asset events committed.", events)
        out.family("watchkeeper_watcher_up", "gauge", "1 while the watcher runs, else 0.", up)
        out.family(
            "watchkeeper_watcher_state",
            "gauge",
            "1 for the watcher's current state, 0 for the others.",
            states,
        )
        out.family(
            "watchkeeper_watcher_last_event_timestamp_seconds",
            "gauge",
            "Unix time of the watcher's last committed event.",
            last,
        )
        out.family(
            "watchkeeper_watcher_failures_total",
            "counter",
            "Failed runs of the watcher (run() raised or returned).",
            failures,
        )
        for metric, rows in sources.items():
            out.family(metric, "gauge", "Measured by the watcher of its source.", rows)

    def _runtime_families(self, out: _Exposition) -> None:
        """The runner's commit latency and fenced writes, the store's commit batch sizes, and
        the event loop's lag: what this process measures of itself."""
        backend = f'backend="{_esc(_backend_label(self.backend))}"'
        runner = self.runner
        if runner is not None:
            hist = runner.metrics.commit_seconds
            out.family(
                "watchkeeper_commit_seconds",
                "histogram",
                "Seconds from an event's commit call to its durable commit.",
                _histogram("watchkeeper_commit_seconds", backend, hist.cumulative(), hist.total),
            )
            out.family(
                "watchkeeper_fenced_writes_total",
                "counter",
                "Writes the store refused because the watcher's lease had moved.",
                [f"watchkeeper_fenced_writes_total {runner.metrics.fenced_writes}\n"],
            )
        sizes = getattr(self.backend, "commit_batch_sizes", None)
        if sizes is not None:
            out.family(
                "watchkeeper_commit_batch_size",
                "histogram",
                "Operations per group-commit transaction.",
                _histogram(
                    "watchkeeper_commit_batch_size", backend, sizes.cumulative(), sizes.total
                ),
            )
        if self.lag is not None:
            out.family(
                "watchkeeper_loop_lag_seconds",
                "gauge",
                "How late the event loop last woke a task that slept 0.25 s.",
                [f"watchkeeper_loop_lag_seconds {self.lag.lag!r}\n"],
            )

    def _daemon_and_store_families(self, out: _Exposition) -> None:
        """The daemon's leases held, and whether (and when) the last read of the store
        succeeded."""
        if self.daemon is not None:
            try:
                leases = self.daemon.leases
                # Past the node lease's deadline none of them may still be ours.
                held = 0 if leases.lapsed() else len(leases.held)
            except RuntimeError:  # the daemon is closing
                held = 0
            out.family(
                "watchkeeper_leases_held",
                "gauge",
                "Watcher leases this daemon holds (0 once its node lease lapsed).",
                [f"watchkeeper_leases_held {held}\n"],
            )
        if self.store_up is not None:
            out.family(
                "watchkeeper_store_up",
                "gauge",
                f"1 when this scrape read the store within {STORE_READ_TIMEOUT:g} s, else 0.",
                [f"watchkeeper_store_up {1 if self.store_up else 0}\n"],
            )
        if self.read_at is not None:
            out.family(
                "watchkeeper_store_read_timestamp_seconds",
                "gauge",
                "Unix time of the last read of the store that succeeded (what the task "
                "figures and, without a runner, the watcher figures come from).",
                [f"watchkeeper_store_read_timestamp_seconds {self.read_at!r}\n"],
            )


class _Exposition:
    """The text format being written: each family's ``HELP`` and ``TYPE`` lines, its rows."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def family(self, name: str, kind: str, text: str, rows: list[str]) -> None:
        self.parts.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
        self.parts.extend(rows)

    def text(self) -> bytes:
        return "".join(self.parts).encode()


def _watcher_totals(out: _Exposition, by_state: Mapping[str, int], dropped: int) -> None:
    """Watchers by state (every watcher), and how many the series cap left out."""
    out.family(
        "watchkeeper_watchers",
        "gauge",
        "Watchers by state (every watcher).",
        [f'watchkeeper_watchers{{state="{_esc(k)}"}} {v}\n' for k, v in by_state.items()],
    )
    out.family(
        "watchkeeper_watcher_series_dropped",
        "gauge",
        "Watchers left out of the per-watcher series by [api] max_watcher_series.",
        [f"watchkeeper_watcher_series_dropped {dropped}\n"],
    )


_MEASURES: dict[type, bool] = {}
"""Trigger classes checked once each: do they measure their source?"""


def _source_gauges(runner: TriggerRunner) -> dict[str, dict[str, float]]:
    """``{trigger_id: {name: value}}`` of the running triggers that measure their source."""
    found: dict[str, dict[str, float]] = {}
    for slot in runner.slots():
        trigger = slot.trigger
        kind = type(trigger)
        measures = _MEASURES.get(kind)
        if measures is None:
            measures = _MEASURES[kind] = isinstance(trigger, SourceGauges)
        if not measures:
            continue
        try:
            values = trigger.source_gauges()  # type: ignore[attr-defined]
            kept = {
                str(name): float(value)
                for name, value in values.items()
                if isinstance(name, str) and _GAUGE_NAME.fullmatch(name)
            }
        except Exception as exc:  # noqa: BLE001 - a watcher's bug must not fail the scrape
            log.warning("source_gauges_failed", trigger_id=slot.trigger_id, error=repr(exc))
            continue
        if kept:
            found[slot.trigger_id] = kept
    return found


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
