"""``run_asset_task``: run one ``asset_task`` on given events exactly as a worker does.

The task is declared on the backend, the events are committed to the assets it schedules, and
a real :class:`~watchkeeper.triggerer.Worker` creates, claims and executes its runs (the same
context, outlets, retries, timeouts and state stores as in production) until every run is
finished for good. What the runs did is returned: their records and the events they emitted
on their outlets.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
from watchkeeper.store import Asset, AssetEvent, BaseStateBackend, MemoryStateBackend
from watchkeeper.store.protocols import (
    EventCommit,
    TaskRun,
    encode_payload,
)

from ..settings import WorkerSettings
from ..worker import AssetTask, Worker

__all__ = ["TaskResult", "run_asset_task"]

TEST_WATCHER = "run_asset_task"
"""The watcher name the events given to :func:`run_asset_task` are committed under."""

_FAST = WorkerSettings(poll_interval=0.01, heartbeat_interval=1.0)


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What :func:`run_asset_task` saw: the task's runs, oldest first, and the events they
    emitted on the task's outlets, in commit order."""

    runs: list[TaskRun]
    outlet_events: list[AssetEvent]

    @property
    def run(self) -> TaskRun:
        """The only run (an :class:`AssertionError` naming the count when there are several)."""
        if len(self.runs) != 1:
            raise AssertionError(f"expected one run, got {len(self.runs)}: {self.runs!r}")
        return self.runs[0]

    def outlet(self, asset: Asset | str) -> list[AssetEvent]:
        """The events emitted on one outlet.

        :param asset: the outlet asset, or its name.
        """
        name = asset.name if isinstance(asset, Asset) else asset
        return [event for event in self.outlet_events if event.asset == name]


async def run_asset_task(
    task: AssetTask,
    *,
    events: Sequence[Any] | Mapping[Asset | str, Sequence[Any]],
    backend: BaseStateBackend | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109 - the documented API of the test kit
    retry_delay: timedelta | None = timedelta(0),
    settings: WorkerSettings | None = None,
) -> TaskResult:
    """Run ``task`` on ``events`` as a worker does and return its runs and outlet events.

    :param task: a function decorated with ``@asset_task``.
    :param events: the payloads to commit, in order: a sequence when the task schedules one
        asset, or a mapping from each scheduled asset (or its name) to its payloads.
    :param backend: an open backend to run on (its state, events and runs stay there for the test
        to look at); by default a fresh :class:`MemoryStateBackend`, closed afterwards.
    :param timeout: seconds to wait for every run to finish for good.
    :param retry_delay: the wait before each retry, in place of the task's own (``None``: the
        task's), so a test of retries does not sleep through them.
    :param settings: the worker's settings (by default it looks for runs every 10 ms).
    :returns: the task's runs (oldest first) and the events they emitted on its outlets. The runs of
        the task from before this call are not included.

    :raises TypeError: ``task`` is not an ``asset_task``, or ``events`` has the wrong shape.
    :raises ValueError: ``events`` names an asset the task does not schedule, or is empty.
    :raises TimeoutError: a run was still queued or running after ``timeout`` seconds.
    """
    if not isinstance(task, AssetTask):
        raise TypeError(f"run_asset_task needs an @asset_task function, got {task!r}")
    per_asset = _events_per_asset(task, events)
    if retry_delay is not None:
        task = dataclasses.replace(task, retry_delay=retry_delay)
    async with _opened(backend) as store:
        worker = Worker(store, [task], settings or _FAST)
        await worker.declare()
        queue = store.tasks
        known = {run.id for run in await queue.alist_runs(task=task.name)}
        log = store.events
        first = None
        for asset, payloads in per_asset.items():
            for payload in payloads:
                commit = EventCommit(TEST_WATCHER, (asset,), encode_payload(payload))
                (event,) = await log.acommit(commit)
                first = event.id if first is None else first
        runs: list[TaskRun] | None = None
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            with anyio.move_on_after(timeout):
                runs = await _finished_runs(store, task.name, known)
                await worker.drained()  # the task's callbacks have returned too
            tg.cancel_scope.cancel()
        if runs is None:
            states = [(r.id, r.state) for r in await queue.alist_runs(task=task.name)]
            unfinished = [f"#{i} {state}" for i, state in states if i not in known]
            raise TimeoutError(
                f"task {task.name!r} did not finish within {timeout:g} s "
                f"(its runs: {', '.join(reversed(unfinished)) or 'none created'})"
            )
        outlets = {asset.name for asset in task.outlets}
        emitted = [
            e
            for e in await log.alist_events(since_id=(first or 1) - 1)
            if e.asset in outlets and e.watcher != TEST_WATCHER
        ]
        return TaskResult(runs, emitted)


def _events_per_asset(
    task: AssetTask, events: Sequence[Any] | Mapping[Asset | str, Sequence[Any]]
) -> dict[str, list[Any]]:
    scheduled = [asset.name for asset in task.schedule]
    if isinstance(events, Mapping):
        per_asset: dict[str, list[Any]] = {}
        for key, payloads in events.items():
            name = key.name if isinstance(key, Asset) else key
            if not isinstance(name, str):
                raise TypeError(f"events are keyed by Asset or asset name, got {key!r}")
            if name not in scheduled:
                raise ValueError(
                    f"task {task.name!r} does not schedule asset {name!r} "
                    f"(it schedules {', '.join(map(repr, scheduled))})"
                )
            if isinstance(payloads, str | bytes) or not isinstance(payloads, Sequence):
                raise TypeError(f"the events of asset {name!r} must be a sequence of payloads")
            per_asset[name] = list(payloads)
    elif isinstance(events, str | bytes) or not isinstance(events, Sequence):
        raise TypeError("events must be a sequence of payloads or a mapping of asset to payloads")
    elif len(scheduled) != 1:
        raise ValueError(
            f"task {task.name!r} schedules {len(scheduled)} assets: give events as a mapping "
            "from each asset to its payloads"
        )
    else:
        per_asset = {scheduled[0]: list(events)}
    if not any(per_asset.values()):
        raise ValueError("events is empty: a task runs only on events")
    return per_asset


@contextlib.asynccontextmanager
async def _opened(backend: BaseStateBackend | None) -> AsyncIterator[BaseStateBackend]:
    if backend is not None:
        yield backend
        return
    async with MemoryStateBackend() as memory:
        yield memory


async def _finished_runs(store: BaseStateBackend, task: str, known: set[int]) -> list[TaskRun]:
    """Once the task has no event pending and no run queued or running, its new runs."""
    queue = store.tasks
    while True:
        (info,) = [t for t in await queue.alist_tasks() if t.name == task]
        runs = [r for r in await queue.alist_runs(task=task) if r.id not in known]
        settled = all(r.state in ("success", "failed") for r in runs)
        if runs and settled and not any(info.pending.values()):
            return sorted(runs, key=lambda r: r.id)
        await anyio.sleep(0.01)
