"""A worker's slots finishing at once on PostgreSQL: their steps as one statement.

Each slot of a worker finishes its run and claims its next in one step. Sent one by one, eight
slots make eight statements, each reading the open runs to claim one; under load the
server's share of that was as large as the worker's own CPU (``BENCHMARKS.md``). So the
backend queues the common step (a plain success that wants at most one run; one that comes
back without a run and may create creates after it, in :mod:`.tasks`) on a
:class:`~.._commit_queue.CommitQueue` with one group in flight: the steps that arrive
while a group's statement runs go together in the next (:func:`~.runs.step_sql` with
``group``), one per owner, lease and task list. Each finish in it is fenced on its own: a
refused one changes nothing and its caller gets the reason (read as a lone step's would be);
the runs claimed go one each to the steps that finished and want one, in order.

A step whose worker has other slots running a task says so (``peers``, the write's
``company``), and the queue waits a moment for them before it sends a group that starts with
it (its linger).

Cancellation is the queue's: a caller that stops waiting leaves its step queued, and it may
still commit.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from .._commit_queue import CommitQueue, QueuedWrite
from .._tasks import RunOutcome, RunStep
from ..errors import BackendUnavailableError
from .runs import step_rows

__all__ = ["StepQueue", "StepWrite"]

Group = tuple[str, timedelta, tuple[str, ...] | None]


class StepWrite(QueuedWrite):
    """One queued step: ``finish`` (a plain success) and whether it wants a run."""

    __slots__ = ("finish", "group", "wants")

    def __init__(self, group: Group, finish: RunOutcome, wants: bool) -> None:
        super().__init__()
        self.group = group
        self.finish = finish
        self.wants = wants


class StepQueue:
    """The queue of one backend's grouped steps (see the module docstring).

    ``run_group(group, steps)`` runs one statement for ``steps`` and returns its rows (those
    of :func:`~.runs.step_sql`); ``refuse(step)`` raises why the finish of ``step`` was
    refused.
    """

    def __init__(
        self,
        owner: object,
        run_group: Callable[[Group, builtins.list[StepWrite]], Awaitable[builtins.list[Any]]],
        refuse: Callable[[StepWrite], Awaitable[None]],
    ) -> None:
        self._run_group, self._refuse = run_group, refuse
        self.queue: CommitQueue[StepWrite] = CommitQueue(
            owner,
            self._run_batch,
            in_flight_error=lambda: BackendUnavailableError(
                "the backend closed while this step was in flight; it may or may not have committed"
            ),
            max_batch=1024,
        )

    async def step(self, group: Group, finish: RunOutcome, wants: bool, peers: int) -> RunStep:
        step = StepWrite(group, finish, wants)
        step.company = peers
        result: RunStep = await self.queue.submit(step)
        return result

    async def _run_batch(self, batch: builtins.list[StepWrite]) -> None:
        groups: dict[Group, builtins.list[StepWrite]] = {}
        for step in batch:
            groups.setdefault(step.group, []).append(step)
        for group, steps in groups.items():
            try:
                rows = await self._run_group(group, steps)
            except Exception as exc:  # noqa: BLE001 - each step of the group gets it
                for step in steps:
                    step.fail(exc)
                continue
            self._settle(steps, rows)
            for step in steps:
                if not step.ran:
                    try:
                        await self._refuse(step)  # raises why
                    except Exception as exc:  # noqa: BLE001 - the refusal is its caller's
                        step.fail(exc)

    @staticmethod
    def _settle(steps: builtins.list[StepWrite], rows: builtins.list[Any]) -> None:
        finished, runs = step_rows(rows)
        by_id = {run.id: run for run in finished}
        for step in steps:
            done = by_id.get(step.finish.run_id)
            if done is None:
                continue  # refused: read why, after
            take = runs[:1] if step.wants else []
            del runs[: len(take)]
            step.ran, step.result, step.error = True, RunStep(done, tuple(take)), None
