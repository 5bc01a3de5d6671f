"""Which of the loaded triggers run in this daemon, decided by the leases it holds.

:class:`TriggerPlacement` keeps the daemon's two sets of triggers, the *wanted* ones (what
the last load of the watcher files defined) and the *running* ones (started on the runner
with a fence token), and brings the second in line with the first and with the leases:

- :meth:`~TriggerPlacement.claim` renews and takes leases (see :mod:`._leases`): those of
  the triggers running here unchanged, then as many others as ``capacity`` leaves room for,
  skipping those another live daemon holds;
- :meth:`~TriggerPlacement.reconcile` carries out the pure step of :mod:`._reconcile` on
  the runner and releases the leases of triggers that do not run here;
- :meth:`~TriggerPlacement.apply_last_claim` reconciles with the latest claim, unless a
  reload applied a newer one meanwhile (claims are numbered).

Reconciling holds :attr:`~TriggerPlacement.lock`; claiming never does, so the daemon's lease
loop renews on time however long a reload or a trigger's stop takes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import anyio
from watchkeeper.store.backend import get_logger

from ._leases import LeaseKeeper
from ._loader import WatcherGroup
from ._reconcile import Claim, RunningTrigger, plan_reconcile
from .errors import TriggererError
from .runner import TriggerRunner, WatchSpec

__all__ = ["ReloadReport", "TriggerPlacement"]

log = get_logger(__name__)


@dataclass(slots=True)
class ReloadReport:
    """What one reload changed (trigger ids and asset names)."""

    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    deactivated: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)
    errors: int = 0


class TriggerPlacement:
    """The wanted and the running triggers of one daemon, and the claims between them."""

    def __init__(self, runner: TriggerRunner, leases: LeaseKeeper, capacity: int) -> None:
        self.runner = runner
        self.leases = leases
        self.capacity = capacity
        self.wanted: dict[str, WatcherGroup] = {}
        self.running: dict[str, RunningTrigger] = {}
        self.lock = anyio.Lock()
        """Held while the runner is brought in line with a load or a claim (short)."""
        self._claims = 0
        self._last_claim: tuple[int, Claim] | None = None
        self._applied_claim = 0

    async def apply_load(self, groups: Iterable[WatcherGroup], report: ReloadReport) -> None:
        """Want ``groups`` from now on, claim their leases and reconcile. Call under the lock.

        A trigger that gave up ("failed") gets a fresh start, so an operator retries it by
        touching its file once the source is fixed.
        """
        self.wanted = {g.trigger_id: g for g in groups}
        failed = {s.trigger_id for s in self.runner.statuses() if s.state == "failed"}
        seq, claim = await self.claim()
        self._applied_claim = seq
        await self.reconcile(report, claim, failed)

    async def _to_claim(self) -> list[str]:
        """The wanted triggers to claim: those running here unchanged, then as many others
        as ``capacity`` leaves room for (a lease taken beyond it would only keep the trigger
        from a daemon that has room), skipping those another live daemon holds."""
        keep = sorted(
            t
            for t, running in self.running.items()
            if t in self.wanted and self.wanted[t].key == running.group.key
        )
        room = max(self.capacity - len(keep), 0)
        others = [t for t in sorted(self.wanted) if t not in self.running]
        if others:
            # Skips leases another live daemon holds; frees those of a dead local daemon.
            others = await self.leases.free_among(others)
        return keep + others[:room]

    async def claim(self) -> tuple[int, Claim]:
        """Renew and take the leases of the triggers to run here (never takes the lock)."""
        claimed = await self._to_claim()
        tokens = await self.leases.claim(claimed)
        self._claims += 1
        self._last_claim = (self._claims, Claim(frozenset(claimed), tokens))
        return self._last_claim

    async def apply_last_claim(self) -> ReloadReport:
        """Start and stop triggers to match the latest claim, unless a reload applied a newer
        one meanwhile."""
        report = ReloadReport()
        async with self.lock:
            last = self._last_claim
            if last is None or last[0] <= self._applied_claim:
                return report
            self._applied_claim = last[0]
            await self.reconcile(report, last[1])
        if report.started or report.stopped or report.not_started:
            log.info(
                "leases_changed",
                triggers=len(self.running),
                started=report.started,
                stopped=report.stopped,
                not_started=report.not_started,
            )
        return report

    async def reconcile(
        self, report: ReloadReport, claim: Claim, restart: Collection[str] = frozenset()
    ) -> None:
        """Carry out :func:`~._reconcile.plan_reconcile` for ``claim`` on the runner, then
        release the leases held for triggers that do not run here. Call under the lock.

        Triggers in ``restart`` (failed ones, on a reload) and those that stopped on a
        refused write start afresh.
        """
        runner = self.runner
        dead = {s.trigger_id for s in runner.statuses() if s.state == "stopped"}
        plan = plan_reconcile(self.running, self.wanted, claim, {*restart, *dead})
        for trigger_id, save_status in plan.stop:
            # A trigger another daemon holds now is theirs, status row included.
            await runner.stop_trigger(trigger_id, save_status=save_status)
            del self.running[trigger_id]
            report.stopped.append(trigger_id)
        for trigger_id, token in plan.start:
            group = self.wanted[trigger_id]
            try:
                await runner.start_trigger(_spec(group, token))
            except (TriggererError, ValueError) as exc:  # over capacity: retried next claim
                report.not_started.append(trigger_id)
                log.error("trigger_not_started", trigger_id=trigger_id, reason=str(exc))
                continue
            self.running[trigger_id] = RunningTrigger(group, token)
            report.started.append(trigger_id)
        idle = [t for t in self.leases.held if t not in self.running]
        if idle:  # removed from the files, or not startable here: let another daemon have it
            await self.leases.release(idle)


def _spec(group: WatcherGroup, fence_token: int | None) -> WatchSpec:
    return WatchSpec(
        trigger_id=group.trigger_id,
        trigger=group.trigger,
        assets=group.assets,
        watchers=group.watchers,
        fence_token=fence_token,
    )
