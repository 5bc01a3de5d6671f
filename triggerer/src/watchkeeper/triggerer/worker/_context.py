"""What one try of a run gets: its context (the store's task context plus the run's events and
outlets), and the delay before the next try after a failure."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from watchkeeper.store import BaseStateBackend, build_task_context
from watchkeeper.store.protocols import TaskRun

from ._asset_task import AssetTask, OutletEvents

__all__ = ["retry_delay_for", "run_context"]

_JITTER = 0.2


def retry_delay_for(
    task: AssetTask, try_number: int, rng: random.Random | None = None
) -> timedelta:
    """The delay before the try after ``try_number``: ``retry_delay`` doubled per failed try,
    capped at ``max_retry_delay``, varied by up to ±20 % so failed runs do not retry in step."""
    base = task.retry_delay.total_seconds() * 2 ** max(0, try_number - 1)
    base = min(base, task.max_retry_delay.total_seconds())
    factor = 1 + _JITTER * (2 * (rng or random).random() - 1)
    return timedelta(seconds=max(0.0, base * factor))


def run_context(backend: BaseStateBackend, task: AssetTask, run: TaskRun) -> dict[str, Any]:
    """The context of one try of ``run``: ``build_task_context``'s plus the run's events."""
    context = build_task_context(
        backend,
        dag_id=task.name,
        run_id=str(run.id),
        task_id=task.name,
        try_number=run.try_number,
        inlets=(*task.schedule, *task.inlets),
        outlets=task.outlets,
    )
    context["triggering_asset_events"] = {
        asset: [e for e in run.events if e.asset == asset.name] for asset in task.schedule
    }
    context["outlet_events"] = OutletEvents(task.outlets)
    return context
