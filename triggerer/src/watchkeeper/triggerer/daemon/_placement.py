"""Which of the loaded triggers run in this daemon, decided by the leases it holds.

:class:`TriggerPlacement` keeps the daemon's two sets of triggers, the *wanted* ones (what
the last load of the watcher files defined) and the *running* ones (started on the runner
with a fence token), and brings the second in line with the first and with the leases:

- :meth:`~TriggerPlacement.claim` renews the node lease, and takes free leases up to this
  daemon's share of the wanted triggers, or marks those over it to shed (see :mod:`._leases`);
- :meth:`~TriggerPlacement.reconcile` carries out the pure step of :mod:`._reconcile` on
  the runner and releases the leases of triggers that do not run here;
- :meth:`~TriggerPlacement.apply_last_claim` reconciles with the latest claim, unless a
  reload applied a newer one meanwhile (claims are numbered).

Reconciling holds :attr:`~TriggerPlacement.lock`; claiming never does, so the daemon's lease
loop renews on time however long a reload or a trigger's stop takes.

Operators' watcher controls (see :mod:`._controls`) are read before each claim: a
paused watcher is neither claimed nor run (a running one is stopped, its status row saying
``paused``), and a retry restarts a failed trigger at the next reconcile.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import anyio.lowlevel
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import get_logger

from .._core import describe_error
from ..errors import TriggererError
from ..runtime import TriggerRunner, WatchSpec
from ._controls import ControlsTracker
from ._leases import LeaseKeeper
from ._loader import WatcherGroup
from ._reconcile import Claim, RunningTrigger, plan_reconcile

__all__ = ["ReloadReport", "TriggerPlacement"]

log = get_logger(__name__)

_AT_ONCE = 64
"""Triggers started (or stopped) concurrently by one reconcile: more would make one turn of
the event loop run thousands of first steps (or cancellations) while the renewals wait."""


@dataclass(slots=True)
class ReloadReport:
    """What one reload changed (trigger ids and asset names).

    :param started: ids of the triggers started.
    :param stopped: ids of the triggers stopped (removed from the files, or changed).
    :param deactivated: names of the assets no definition declares any more.
    :param not_started: ids of the triggers wanted but not started (leased elsewhere, or
        refused).
    :param errors: how many definition files or watchers were refused.
    """

    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    deactivated: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)
    errors: int = 0


class TriggerPlacement:
    """The wanted and the running triggers of one daemon, and the claims between them."""

    def __init__(
        self,
        runner: TriggerRunner,
        leases: LeaseKeeper,
        capacity: int,
        *,
        backend: BaseStateBackend,
        controls: ControlsTracker | None = None,
    ) -> None:
        self.runner = runner
        self.leases = leases
        self.capacity = capacity
        self.backend = backend
        self.controls = controls
        self._retried: set[str] = set()
        self._shed: set[str] = set()
        self._renewed_at: float | None = None
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
        self._retried.clear()  # every failed trigger restarts anyway
        seq, claim = await self.claim()
        self._applied_claim = seq
        await self.reconcile(report, claim, failed)

    async def claim(self) -> tuple[int, Claim]:
        """Renew the node lease, then claim or shed leases toward this daemon's share (see
        :mod:`._leases`); never takes the lock.

        The watcher controls are read first: paused watchers are not claimed, and retries
        asked since the last read are kept for the next apply. Leases over the share are
        not released here but once their triggers have stopped (by :meth:`reconcile`), so
        that the daemon taking one over never meets its writes.
        """
        leases = self.leases
        if leases.supported:
            # First: reading the controls takes a pooled connection, which thousands of
            # watchers reading their state at start-up can keep busy for seconds.
            await leases.renew()
        if self.controls is not None:
            self._retried |= await self.controls.refresh()
        tokens: dict[str, int] | None = None
        if leases.supported:
            want = [t for t in sorted(self.wanted) if not self._paused(self.wanted[t])]
            held = leases.held
            mine = [t for t in want if t in held]
            share = leases.share(len(want), self.capacity)
            self._shed = set()
            if len(mine) < share and leases.free_hint(len(want), len(mine)):
                others = [t for t in want if t not in held]
                await leases.claim(others, limit=share - len(mine))
            elif len(mine) > share:
                # The ones not running go first, then the last by id: a stable choice.
                order = sorted(mine, key=lambda t: (t not in self.running, t))
                self._shed = set(order[share:])
            lapsed = leases.lapsed()
            tokens = {} if lapsed else {t: n for t, n in leases.held.items() if t not in self._shed}
        self._renewed_at = time.monotonic()
        self._claims += 1
        asked = frozenset(self.wanted) | frozenset(self.running)
        self._last_claim = (self._claims, Claim(asked, tokens))
        return self._last_claim

    async def stop_lapsed(self) -> list[str]:
        """Stop every fenced trigger at once, when the node lease's deadline passed without a
        renewal (the leases are kept: a later renewal may find them still ours)."""
        async with self.lock:
            if not self.leases.lapsed():
                return []
            report = ReloadReport()
            await self.reconcile(report, Claim(frozenset(self.running), {}))
        return report.stopped

    async def apply_last_claim(self) -> ReloadReport:
        """Start and stop triggers to match the latest claim, unless a reload applied a newer
        one meanwhile."""
        report = ReloadReport()
        async with self.lock:
            last = self._last_claim
            if last is None or last[0] <= self._applied_claim:
                return report
            self._applied_claim = last[0]
            await self.reconcile(report, last[1], self._take_retries())
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
        if claim.tokens is not None and self.leases.lapsed():
            claim = Claim(claim.asked, {})  # a claim from before the lapse: start nothing
        dead = {s.trigger_id for s in runner.statuses() if s.state == "stopped"}
        paused = {t for t, g in self.wanted.items() if self._paused(g)}
        paused |= {t for t, r in self.running.items() if self._paused(r.group)}
        plan = plan_reconcile(self.running, self.wanted, claim, {*restart, *dead}, paused)
        # Stops run concurrently: each waits for its task (a turn of the event loop at least),
        # which, one after the other, adds up to seconds with thousands of triggers on a busy
        # loop, and so would a failover. They go a few dozen at a time.
        limiter = anyio.CapacityLimiter(_AT_ONCE)

        async def stop(trigger_id: str, save_status: bool) -> None:
            async with limiter:
                # A trigger another daemon holds now is theirs, status row included.
                await runner.stop_trigger(trigger_id, save_status=save_status)

        async with anyio.create_task_group() as tg:
            for trigger_id, save_status in plan.stop:
                tg.start_soon(stop, trigger_id, save_status)
        for trigger_id, _ in plan.stop:
            del self.running[trigger_id]
            report.stopped.append(trigger_id)
        for trigger_id in plan.pause:
            await self._pause_trigger(trigger_id)
            del self.running[trigger_id]
            report.stopped.append(trigger_id)
        refused: dict[str, str] = {}
        # A start only creates the trigger's task (it runs from the loop's next turn): one
        # after the other, with a turn of the loop every _AT_ONCE starts for those first steps.
        for count, (trigger_id, token) in enumerate(plan.start, 1):
            group = self.wanted[trigger_id]
            try:
                await runner.start_trigger(_spec(group, token))
            except (TriggererError, ValueError) as exc:  # over capacity: retried next claim
                refused[trigger_id] = str(exc)
            else:
                self.running[trigger_id] = RunningTrigger(group, token)
            if count % _AT_ONCE == 0:
                await anyio.lowlevel.checkpoint()
        for trigger_id, _ in plan.start:
            if trigger_id in refused:
                report.not_started.append(trigger_id)
                log.error("trigger_not_started", trigger_id=trigger_id, reason=refused[trigger_id])
            else:
                report.started.append(trigger_id)
        idle = [t for t in self.leases.held if t not in self.running]
        if idle and not self.leases.lapsed():
            # Removed from the files, not startable here, or over this daemon's share: let
            # another daemon have it (not while lapsed: a renewal may find them ours still).
            await self.leases.release(idle)
            self._shed.clear()

    def lease_renewal_age(self) -> float | None:
        """Seconds since the leases were last claimed or renewed (None before the first)."""
        return None if self._renewed_at is None else time.monotonic() - self._renewed_at

    def unleased(self) -> list[str]:
        """Triggers running here on a lease no longer held (unfenced ones never count)."""
        held = self.leases.held
        return sorted(t for t, r in self.running.items() if r.token is not None and t not in held)

    # -- watcher controls (pause, resume, retry: rows in the store) -----------------------------

    def _paused(self, group: WatcherGroup) -> bool:
        controls = self.controls
        return controls is not None and controls.is_paused(group.watchers or (group.trigger_id,))

    def _take_retries(self) -> set[str]:
        """The failed triggers whose watcher an operator retried since the last apply."""
        retried, self._retried = self._retried, set()
        if not retried:
            return set()
        return {
            s.trigger_id
            for s in self.runner.statuses()
            if s.state == "failed" and any(w in retried for w in s.watchers or (s.trigger_id,))
        }

    async def _pause_trigger(self, trigger_id: str) -> None:
        """Stop a trigger whose watcher an operator paused; its status row says ``paused``."""
        runner = self.runner
        before = next((s for s in runner.statuses() if s.trigger_id == trigger_id), None)
        await runner.stop_trigger(trigger_id, save_status=False)
        log.info("watcher_paused", trigger_id=trigger_id)
        if before is not None and self.backend.services.status is not None:
            paused = dataclasses.replace(before, state="paused", updated_at=datetime.now(UTC))
            try:
                await self.backend.status.asave_trigger_status([paused])
            except Exception as exc:  # noqa: BLE001 - a status is advisory
                log.warning("trigger_status_save_failed", error=describe_error(exc))


def _spec(group: WatcherGroup, fence_token: int | None) -> WatchSpec:
    return WatchSpec(
        trigger_id=group.trigger_id,
        trigger=group.trigger,
        assets=group.assets,
        watchers=group.watchers,
        fence_token=fence_token,
    )
