"""A task's ``on_success``, ``on_failure`` and ``on_retry``: which one a recorded outcome calls,
and calling it within ``[worker] callback_timeout`` without letting it fail the run."""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import anyio
from watchkeeper.store.protocols import LoopThreads, RunOutcome, TaskRun, get_logger

from .._core import describe_error
from ._asset_task import AssetTask

__all__ = ["call_back"]

log = get_logger(__name__)


def _callback_for(task: AssetTask, outcome: RunOutcome, done: TaskRun) -> tuple[str, Any]:
    """The callback a recorded outcome calls (its name and the callable, None when unset)."""
    if outcome.success:
        return "on_success", task.on_success
    if done.state == "failed":
        return "on_failure", task.on_failure
    return "on_retry", task.on_retry


async def call_back(
    task: AssetTask,
    outcome: RunOutcome,
    done: TaskRun,
    error: BaseException | None,
    *,
    time_limit: float,
    threads: LoopThreads,
) -> None:
    """Call ``task``'s callback for the recorded outcome ``done`` (a sync one on ``threads``),
    within ``time_limit`` seconds; its failure (or its being late) is logged, never raised:
    the run is recorded already."""
    which, callback = _callback_for(task, outcome, done)
    if callback is None:
        return
    try:
        with anyio.move_on_after(time_limit) as late:
            if inspect.iscoroutinefunction(callback):
                await callback(done, error)
            else:
                await threads.call(partial(callback, done, error))
    except Exception as exc:  # noqa: BLE001 - a callback never fails its run or the worker
        log.error(
            "task_callback_failed", task=task.name, run_id=done.id, callback=which,
            error=describe_error(exc),
        )  # fmt: skip
        return
    if late.cancelled_caught:
        log.error(
            "task_callback_failed", task=task.name, run_id=done.id, callback=which,
            error=f"took longer than callback_timeout ({time_limit:g} s)",
        )  # fmt: skip
