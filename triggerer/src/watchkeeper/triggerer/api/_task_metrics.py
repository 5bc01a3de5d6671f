"""The task series of ``/metrics``, read from the store at each scrape.

Counters only grow: they count what the store keeps for good (a successful run stays
successful; a failed try stays recorded in its run, a retry adds tries), so a scrape never
sees one go down, whichever process serves it. Current numbers (runs by state, pending
events, the age of the oldest pending event) are gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from watchkeeper.store.protocols import RUN_STATES, TRY_CAUSES, TaskQueue

__all__ = ["DURATION_BUCKETS", "TaskMetrics"]

DURATION_BUCKETS: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0,
)  # fmt: skip
"""The upper bounds (seconds) of ``watchkeeper_task_run_duration_seconds``'s buckets."""


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class TaskMetrics:
    """The task families: :meth:`prepare` reads the store, :meth:`render` writes the text."""

    def __init__(self, queue: TaskQueue, clock: Callable[[], datetime]) -> None:
        self.queue = queue
        self.clock = clock
        """The store's clock: the ages of pending events are measured on it."""
        self._tasks: list[tuple[str, tuple[str, ...], dict[str, int]]] = []
        self._runs: dict[tuple[str, str], int] = {}
        self._tries: dict[tuple[str, str, bool], int] = {}
        self._oldest: dict[tuple[str, str], datetime] = {}
        self._durations: dict[str, tuple[list[int], float]] = {}
        self._now = datetime.now(UTC)

    async def prepare(self) -> None:
        """Read the counts (each counted by the store: a scrape reads no run)."""
        queue = self.queue
        infos = await queue.alist_tasks()
        self._tasks = [(i.name, i.spec.assets, dict(i.pending)) for i in infos]
        self._runs = await queue.acount_runs()
        self._tries = await queue.acount_tries()
        self._oldest = await queue.aoldest_pending()
        self._durations = await queue.arun_durations(DURATION_BUCKETS)
        self._now = self.clock()

    def render(self) -> str:
        """The exposition text of the task families."""
        return "".join(self._lines())

    def _lines(self) -> Iterator[str]:
        """Each task family in turn, every task's rows under its ``HELP`` and ``TYPE``."""
        labels = {name: f'task="{_esc(name)}"' for name, _, _ in self._tasks}
        yield from self._runs_by_state(labels)
        yield from self._runs_finished(labels)
        yield from self._failed_tries(labels)
        yield from self._run_durations(labels)
        yield from self._pending_events(labels)
        yield from self._oldest_pending(labels)

    def _runs_by_state(self, labels: dict[str, str]) -> Iterator[str]:
        yield _head("watchkeeper_task_runs", "gauge", "Runs of the task in the store, by state.")
        for name, label in labels.items():
            for state in RUN_STATES:
                count = self._runs.get((name, state), 0)
                yield f'watchkeeper_task_runs{{{label},state="{state}"}} {count}\n'

    def _runs_finished(self, labels: dict[str, str]) -> Iterator[str]:
        yield _head(
            "watchkeeper_task_runs_finished_total",
            "counter",
            "Runs finished, by outcome: success, or failed (no tries left; a retried run "
            "that fails again counts again).",
        )
        for name, label in labels.items():
            failed = sum(n for (t, _, final), n in self._tries.items() if t == name and final)
            success = self._runs.get((name, "success"), 0)
            yield f'watchkeeper_task_runs_finished_total{{{label},outcome="success"}} {success}\n'
            yield f'watchkeeper_task_runs_finished_total{{{label},outcome="failed"}} {failed}\n'

    def _failed_tries(self, labels: dict[str, str]) -> Iterator[str]:
        yield _head(
            "watchkeeper_task_tries_total",
            "counter",
            "Failed tries, by cause: task_error, timeout (both count against retries), "
            "worker_lost (the try's worker stopped renewing its lease).",
        )
        for name, label in labels.items():
            for cause in TRY_CAUSES:
                count = sum(n for (t, c, _), n in self._tries.items() if t == name and c == cause)
                yield f'watchkeeper_task_tries_total{{{label},cause="{cause}"}} {count}\n'

    def _run_durations(self, labels: dict[str, str]) -> Iterator[str]:
        yield _head(
            "watchkeeper_task_run_duration_seconds",
            "histogram",
            "Seconds the successful try of each successful run took.",
        )
        empty = ([0] * (len(DURATION_BUCKETS) + 1), 0.0)
        for name, label in labels.items():
            counts, total = self._durations.get(name, empty)
            seen = 0
            for bound, count in zip((*DURATION_BUCKETS, None), counts, strict=True):
                seen += count
                le = "+Inf" if bound is None else repr(bound)
                yield f'watchkeeper_task_run_duration_seconds_bucket{{{label},le="{le}"}} {seen}\n'
            yield f"watchkeeper_task_run_duration_seconds_count{{{label}}} {seen}\n"
            yield f"watchkeeper_task_run_duration_seconds_sum{{{label}}} {total!r}\n"

    def _pending_events(self, labels: dict[str, str]) -> Iterator[str]:
        yield _head(
            "watchkeeper_task_pending_events",
            "gauge",
            "Events past the task's cursor on a scheduled asset (not yet in a run).",
        )
        for name, assets, pending in self._tasks:
            for asset in assets:
                yield (
                    f'watchkeeper_task_pending_events{{{labels[name]},asset="{_esc(asset)}"}} '
                    f"{pending.get(asset, 0)}\n"
                )

    def _oldest_pending(self, labels: dict[str, str]) -> Iterator[str]:
        yield _head(
            "watchkeeper_task_oldest_pending_event_age_seconds",
            "gauge",
            "Age of the oldest event waiting for a run of the task (0: none waiting).",
        )
        for name, label in labels.items():
            ages = [
                (self._now - at).total_seconds() for (t, _), at in self._oldest.items() if t == name
            ]
            age = max(0.0, max(ages, default=0.0))
            yield f"watchkeeper_task_oldest_pending_event_age_seconds{{{label}}} {age!r}\n"


def _head(name: str, kind: str, text: str) -> str:
    return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"
