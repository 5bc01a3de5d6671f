"""A worker's slots finishing at once on PostgreSQL: their steps as one statement, run by the
group-commit writer.

Each slot of a worker finishes its run and claims its next in one step. Sent one by one, eight
slots make eight statements, each reading the open runs to claim one; under load the
server's share of that was as large as the worker's own CPU (``BENCHMARKS.md``). So the
backend queues the common step (a plain success that wants at most one run; one that comes
back without a run and may create creates after it, in :mod:`.tasks`) as a :class:`StepOp` on
the writer's queue, beside the other writes: the steps of a batch go together in one statement
per owner, lease and task list (``runner``: :func:`~.runs.step_sql` with ``group``), sent on
the batch's connection after its transaction, in a transaction of its own. Each finish in it is
fenced on its own: a refused one changes nothing and its caller gets the reason (read as a
lone step's would be); the runs claimed go one each to the steps that finished and want one,
in order.

A step whose worker has other slots running a task says so (``peers``, the write's
``company``), and the queue waits a moment for them before it sends a batch that starts with
it (its linger).

Cancellation is the queue's: a caller that stops waiting leaves its step queued, and it may
still commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from .._tasks import RunOutcome, RunStep, TaskRun
from .ops import Op

if TYPE_CHECKING:
    import asyncpg

__all__ = ["STEP", "Group", "StepOp", "StepRunner", "settle_steps", "step_groups"]

STEP: Final = 7
"""A step's phase: after the batch's transaction, in statements of their own."""

Group = tuple[str, timedelta, tuple[str, ...] | None]
"""The steps one statement can carry: one owner, lease and task list."""

StepRunner = Callable[["asyncpg.Connection", Group, list["StepOp"]], Awaitable[None]]
"""Runs the statement of one group of steps on a connection and gives each step its outcome
(``ran``, ``result`` or ``error``); raises what the statement raised."""


class StepOp(Op):
    """One queued step: ``finish`` (a plain success) and whether it wants a run."""

    __slots__ = ("finish", "group", "runner", "wants")

    def __init__(
        self, group: Group, finish: RunOutcome, wants: bool, peers: int, runner: StepRunner
    ) -> None:
        super().__init__(STEP)
        self.group, self.finish, self.wants, self.runner = group, finish, wants, runner
        self.company = peers


def step_groups(steps: Sequence[StepOp]) -> dict[tuple[StepRunner, Group], list[StepOp]]:
    """The steps of a batch by the statement that carries them, in order."""
    groups: dict[tuple[StepRunner, Group], list[StepOp]] = {}
    for step in steps:
        groups.setdefault((step.runner, step.group), []).append(step)
    return groups


def settle_steps(steps: Sequence[StepOp], finished: Sequence[TaskRun], runs: list[TaskRun]) -> None:
    """Give each step of a group whose finish went through its run, and the claimed ``runs``
    one each, in order, to those that want one; a refused step is left as it was (its
    ``ran`` false: the caller reads why)."""
    by_id = {run.id: run for run in finished}
    for step in steps:
        done = by_id.get(step.finish.run_id)
        if done is None:
            continue
        take = runs[:1] if step.wants else []
        del runs[: len(take)]
        step.ran, step.result, step.error = True, RunStep(done, tuple(take)), None
