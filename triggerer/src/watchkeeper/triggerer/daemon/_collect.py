"""The daemon's garbage collection: one pass with the configured retentions, and its loop.

A pass deletes task state past its retention, the state of inactive assets and events (and
their dedup keys) past ``[events]`` retention, in batches (see the store's GC service); the
loop also forgets the status rows of daemons and triggers nobody refreshes any more.
"""

from __future__ import annotations

from collections.abc import Collection

import anyio
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import GcReport, get_logger

from .._core import describe_error
from ..runtime import StoreHealth
from ..settings import Settings
from ._placement import TriggerPlacement
from ._status import DaemonStatusKeeper

__all__ = ["collect_garbage", "collect_garbage_every"]

log = get_logger(__name__)


async def collect_garbage(backend: BaseStateBackend, settings: Settings) -> GcReport:
    """One GC pass with the ``[state_store]`` and ``[events]`` retentions and batch size."""
    store, events = settings.state_store, settings.events
    report = await backend.gc.acollect_garbage(
        default_retention_days=store.default_retention_days,
        batch_size=store.state_cleanup_batch_size,
        event_retention_days=events.retention_days,
        dedup_retention_days=events.dedup_retention_days,
    )
    log.info(
        "gc_done",
        expired=len(report.expired),
        retention=len(report.retention),
        orphaned=len(report.orphaned),
        events=report.events,
        logs=report.logs,
    )
    return report


async def collect_garbage_every(
    interval: float,
    backend: BaseStateBackend,
    settings: Settings,
    *,
    health: StoreHealth,
    status: DaemonStatusKeeper,
    placement: TriggerPlacement,
) -> None:
    """Every ``interval``: one GC pass, then prune the status rows of triggers no daemon runs
    any more. While the store is unavailable a pass is skipped (``health`` logs the outage)."""
    while True:
        await anyio.sleep(interval)
        if not health.available:
            continue
        try:
            await collect_garbage(backend, settings)
            running: Collection[str] = placement.running
            await status.prune(running, placement.wanted)
        except Exception as exc:  # noqa: BLE001 - the next pass tries again
            if health.report(exc) is None:  # an outage is logged once, by the health
                log.error("gc_failed", error=describe_error(exc))
