"""The daemon's lease loops (a mixin of :class:`~._daemon.Daemon`): renewing the node lease and
claiming, waking on released leases, and stopping the triggers when the node lease lapsed.

Several daemons on one PostgreSQL database share the watchers, each trigger run by the one
daemon holding its lease; a single daemon (SQLite) holds every lease. The lease loop never
waits for a reload: the reconcile loop starts the triggers whose lease was got (the lease's
token as their fence) and stops those whose lease is gone. A node lease lasts ``lease_ttl``,
so the triggers of a daemon that died move to the others that long after; after an outage
the leases are renewed before any trigger writes again. See :mod:`._leases` for the rules.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from watchkeeper.store import BaseStateBackend, DatabaseFileRemovedError
from watchkeeper.store.protocols import get_logger

from .._core import describe_error
from ..runtime import TriggerRunner
from ..settings import Settings
from ._leases import LeaseKeeper
from ._placement import ReloadReport, TriggerPlacement

__all__ = ["DaemonLeases"]

log = get_logger(__name__)


class DaemonLeases:
    """The lease loops of a daemon; :class:`~._daemon.Daemon` provides the parts they use."""

    owner: str
    settings: Settings
    _wake: anyio.Event

    if TYPE_CHECKING:

        @property
        def backend(self) -> BaseStateBackend: ...
        @property
        def runner(self) -> TriggerRunner: ...
        @property
        def placement(self) -> TriggerPlacement: ...
        @property
        def leases(self) -> LeaseKeeper: ...

    async def renew_leases(self) -> ReloadReport:
        """One heartbeat's work: renew and take leases, then start and stop triggers to match.

        It is public so that an embedding (or a test) can run a heartbeat at a moment of its
        choosing. The lease loop does the same in two tasks, so that renewing never waits for
        a reload or for triggers being stopped.
        """
        await self.placement.claim()
        return await self.placement.apply_last_claim()

    async def _lease_loop(self, interval: float, claimed: MemoryObjectSendStream[None]) -> None:
        """Every ``lease_renew_interval``: check the store is the one opened, renew the node
        lease, claim or shed leases, and hand the claim to the reconcile loop. Sooner when
        another daemon released leases, or when another node lease is due to expire (it is
        reaped then, and its triggers taken over). Waits on nothing else, so the node lease
        is renewed on time however long a reload, a trigger's stop or a status save takes."""
        health = self.runner.store_health
        with claimed:
            while True:
                with anyio.move_on_after(self._next_renewal(interval)):
                    await self._wake.wait()
                self._wake = anyio.Event()
                await self.verify_store()
                if not health.available:
                    continue  # renewed by the recovery hook, once the store answers again
                try:
                    await self.placement.claim()
                except Exception as exc:  # noqa: BLE001 - the next renewal tries again
                    if health.report(exc) is None:  # an outage is logged once, by the health
                        log.error("lease_renewal_failed", error=describe_error(exc))
                else:
                    with contextlib.suppress(anyio.WouldBlock):
                        claimed.send_nowait(None)  # one pending is enough: it takes the latest

    async def _renew_while_starting(self, interval: float) -> None:
        """Renew the node lease (only) every ``interval`` while the daemon starts, before its
        lease loop runs: starting thousands of triggers takes longer than a lease lives."""
        while True:
            await anyio.sleep(interval)
            try:
                await self.leases.renew()
            except Exception as exc:  # noqa: BLE001 - the next renewal tries again
                log.warning("lease_renewal_failed", error=describe_error(exc))

    def _next_renewal(self, interval: float) -> float:
        """Seconds to the next renewal: ``interval``, or just past the moment another live
        node lease expires, if that comes first (the store's clock, seen at our last beat)."""
        beat = self.leases.last_beat
        if beat is None:
            return interval
        others = [n.expires_at for n in beat.live() if n.owner != self.owner]
        if not others:
            return interval
        due = (min(others) - beat.now).total_seconds() + 0.02
        return max(0.02, min(interval, due))

    async def _release_listener(self) -> None:
        """Wake the lease loop whenever a daemon releases leases (a clean shutdown, a daemon
        shedding its excess): the free leases are claimed now, not at the next renewal."""
        health = self.runner.store_health
        while True:
            try:
                await self.leases.await_release()
            except Exception as exc:  # noqa: BLE001 - the renewals claim anyway
                if health.report(exc) is None:
                    log.warning("lease_listen_failed", error=describe_error(exc))
                await anyio.sleep(self.settings.triggerer.lease_renew_interval)
            self._wake.set()

    async def _deadline_loop(self, interval: float) -> None:
        """Stop every trigger of this daemon once its node lease's deadline passed without a
        renewal: past it, another daemon may already run them."""
        keeper = self.leases
        while True:
            deadline = keeper.deadline
            if deadline is not None and not keeper.lapsed():
                await anyio.sleep(max(0.0, deadline - time.monotonic()))
            if not keeper.lapsed():
                if deadline is None:
                    await anyio.sleep(interval)
                continue
            stopped = await self.placement.stop_lapsed()
            if stopped:
                log.error(
                    "node_lease_lapsed",
                    owner=self.owner,
                    stopped=len(stopped),
                    ttl=keeper.ttl,
                    margin=keeper.margin,
                )
            await keeper.wait_renewal()

    async def verify_store(self) -> None:
        """Check, as every heartbeat does, that the store is still the one opened.

        Raises :class:`~watchkeeper.store.DatabaseFileRemovedError` (logged once as
        ``database_file_removed``) when the SQLite file was removed or replaced: the daemon
        then stops with that error instead of committing into a file nobody can read back.
        """
        try:
            await self.backend.averify()
        except Exception as exc:
            if isinstance(self.runner.store_health.report(exc), DatabaseFileRemovedError):
                raise
            log.error("store_verify_failed", error=describe_error(exc))

    async def _renew_after_outage(self) -> None:
        """The store answers again: renew the leases (they may have lapsed meanwhile) before
        the triggers write again, so none of them meets a lapsed fence."""
        await self.renew_leases()

    async def _reconcile_loop(self, to_apply: MemoryObjectReceiveStream[None]) -> None:
        health = self.runner.store_health
        with to_apply:
            async for _ in to_apply:
                try:
                    await self.placement.apply_last_claim()
                except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
                    if health.report(exc) is None:
                        log.error("lease_reconcile_failed", error=describe_error(exc))
