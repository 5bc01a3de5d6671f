"""The daemon's reconcile step, as a pure function: what is wanted and what runs, in; what to
stop and what to start, out.

The daemon (see :mod:`._daemon`) calls :func:`plan_reconcile` after each load of the watcher
files and after each claim of leases, then carries the plan out on its runner. Keeping the
decision apart from the doing lets it be tested without a loop, a store or a runner.

A trigger keeps running here while all of these hold:

- it is still loaded (wanted) with the same identity, assets and watcher names
  (:attr:`WatcherGroup.key <._loader.WatcherGroup.key>`);
- its lease is held, with the fence token it was started with;
- it is not to be restarted (it gave up and a reload or an operator retries it, or it
  stopped itself because the store refused one of its writes as stale);
- its watcher is not paused by an operator.

Otherwise it is stopped (*paused*, when its lease is held and its watcher paused); and a
wanted trigger that does not run (any more) is started when its lease is held and its
watcher is not paused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ._loader import WatcherGroup

__all__ = ["Claim", "ReconcilePlan", "RunningTrigger", "plan_reconcile"]


@dataclass(frozen=True, slots=True)
class RunningTrigger:
    """A trigger the daemon runs: the definition it was started from and its fence token."""

    group: WatcherGroup
    token: int | None


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim of leases: the trigger ids asked for and the tokens got.

    ``tokens`` is None when the backend has no leases: every wanted trigger runs here,
    unfenced.
    """

    asked: frozenset[str]
    tokens: Mapping[str, int] | None

    def lease(
        self, trigger_id: str, running: Mapping[str, RunningTrigger]
    ) -> tuple[bool, int | None]:
        """``(may run here, fence token)`` of ``trigger_id`` by this claim; an id that was not
        asked for keeps what it runs with (held while it runs)."""
        if self.tokens is None:
            return True, None
        if trigger_id not in self.asked:
            current = running.get(trigger_id)
            return current is not None, current.token if current else None
        return trigger_id in self.tokens, self.tokens.get(trigger_id)


@dataclass(slots=True)
class ReconcilePlan:
    """What to do: the triggers to stop (with whether to save their status row: not when
    another daemon holds them now) or to pause (their row then says ``paused``), then the
    triggers to start with their fence tokens."""

    stop: list[tuple[str, bool]] = field(default_factory=list)
    pause: list[str] = field(default_factory=list)
    start: list[tuple[str, int | None]] = field(default_factory=list)


def _keeps(
    current: RunningTrigger,
    wanted: WatcherGroup | None,
    lease: tuple[bool, int | None],
    restart: bool,
) -> bool:
    """True when a running trigger goes on unchanged (see the module's docstring)."""
    held, token = lease
    unchanged = wanted is not None and wanted.key == current.group.key
    return held and unchanged and token == current.token and not restart


def plan_reconcile(
    running: Mapping[str, RunningTrigger],
    wanted: Mapping[str, WatcherGroup],
    claim: Claim,
    restart: Collection[str] = frozenset(),
    paused: Collection[str] = frozenset(),
) -> ReconcilePlan:
    """The stops and starts that bring ``running`` in line with ``wanted`` and ``claim``.

    ``restart`` names triggers to start afresh even when nothing else changed (failed ones
    on a reload, and those that stopped on a refused write); ``paused`` names the triggers
    whose watcher an operator paused. Starts come in ``wanted``'s order.
    """
    plan = ReconcilePlan()
    for trigger_id, current in running.items():
        lease = claim.lease(trigger_id, running)
        fresh = trigger_id in restart or trigger_id in paused
        if _keeps(current, wanted.get(trigger_id), lease, fresh):
            continue
        if lease[0] and trigger_id in paused:
            plan.pause.append(trigger_id)
        else:
            plan.stop.append((trigger_id, lease[0]))
    stopped = {trigger_id for trigger_id, _ in plan.stop} | set(plan.pause)
    for trigger_id in wanted:
        if trigger_id in running and trigger_id not in stopped:
            continue
        if trigger_id not in claim.asked and claim.tokens is not None:
            continue  # not claimed: not ours to start
        held, token = claim.lease(trigger_id, running)
        if held and trigger_id not in paused:
            plan.start.append((trigger_id, token))
    return plan
