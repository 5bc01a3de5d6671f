"""A supervised trigger's slot: what it runs, its counters, and how its task is stopped.

The runner keeps one :class:`TriggerSlot` per trigger; the supervisor (:mod:`._supervisor`)
updates its counters as the trigger runs, and its status row is built from them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Literal

import anyio
from watchkeeper.store import Asset, AssetEvent
from watchkeeper.store.protocols import Fence, TriggerStatus, Writer

from ..trigger import BaseEventTrigger

if TYPE_CHECKING:
    from anyio import TaskHandle

__all__ = ["Publish", "TriggerSlot", "TriggerState"]

TriggerState = Literal["running", "backing_off", "failed", "stopped"]
Publish = Callable[[list[AssetEvent]], None]
"""Called with the asset events of each commit, in commit order (it must not block)."""


class TriggerSlot:
    """One supervised trigger: what it runs, and the counters its status is built from.

    ``events`` counts the asset events committed (one per watched asset per trigger event that
    was not a suppressed duplicate); ``failures`` counts consecutive failed runs and is reset by
    every commit that wrote an event (re-delivering duplicates is not progress).
    ``watcher_name``, bound as the trigger's ``watcher_name`` in ``run()``, is the one name of
    ``watchers``, or ``trigger_id`` when none is given.
    """

    __slots__ = (
        "_done",
        "asset_names",
        "assets",
        "classpath",
        "cleanup_error",
        "events",
        "failures",
        "fence",
        "finished",
        "handle",
        "in_cleanup",
        "last_error",
        "last_event_at",
        "portal_missing",
        "runs",
        "saved",
        "state",
        "stopping",
        "trigger",
        "trigger_id",
        "watcher_name",
        "watchers",
        "writer",
    )

    def __init__(
        self,
        trigger_id: str,
        trigger: BaseEventTrigger,
        assets: tuple[Asset, ...],
        watchers: tuple[str, ...] = (),
        fence: Fence | None = None,
    ) -> None:
        self.trigger_id = trigger_id
        self.trigger = trigger
        self.assets = assets
        self.watchers = watchers
        # Also the name each committed event carries (the AssetWatcher's name).
        self.watcher_name = watchers[0] if watchers else trigger_id
        self.asset_names = tuple(asset.name for asset in assets)
        self.classpath = sys.intern(type(trigger).classpath())  # one string per class
        self.fence = fence
        self.writer = Writer("watcher", trigger_id, fence=fence)
        self.state: TriggerState = "running"
        self.failures = 0
        self.runs = 0
        self.events = 0
        self.last_error: str | None = None
        self.last_event_at: datetime | None = None
        self.cleanup_error: BaseException | None = None
        self.in_cleanup = False
        self.portal_missing = False  # run() made a sync store call without a portal
        self.handle: TaskHandle[None] | None = None
        """The handle of the task running the trigger (set by whoever starts that task)."""
        self.stopping = False
        """Set once the trigger is asked to stop: its task must not be started again."""
        self.finished = False
        """True once the trigger's task has ended (see :meth:`wait_done`)."""
        self.saved: tuple[object, ...] | None = None
        """What :meth:`change_key` was when this status was last saved (None: never)."""
        # Created only when someone waits: most triggers run until the process exits, and an
        # idle Event per trigger adds up over thousands of them.
        self._done: anyio.Event | None = None

    def __repr__(self) -> str:
        return (
            f"<TriggerSlot {self.trigger_id!r} {self.classpath} state={self.state} "
            f"events={self.events} failures={self.failures}>"
        )

    def __call__(self) -> None:
        """The store's missing-portal hook in the trigger's task: a sync store call without a
        greenback portal stops ``run()``, at its next await (the task is cancelled) or its
        next yield (``portal_missing``), whichever comes first; nothing it yields after that
        call is committed, and the task is started again with a portal."""
        self.portal_missing = True
        if self.handle is not None:
            self.handle.cancel()

    def cancel(self) -> None:
        """Ask the trigger's task to stop (it is not started again)."""
        self.stopping = True
        if self.handle is not None:
            self.handle.cancel()

    def mark_done(self) -> None:
        """Record that the trigger's task ended, waking whoever waits in :meth:`wait_done`."""
        self.finished = True
        if self._done is not None:
            self._done.set()

    async def wait_done(self) -> None:
        """Wait until :meth:`mark_done` was called (returns at once if it was)."""
        if self.finished:
            return
        if self._done is None:
            self._done = anyio.Event()
        await self._done.wait()

    def source_status(self, trouble: str | None) -> None:
        """``backing_off`` with ``trouble`` (see ``BaseEventTrigger.report_source``), or back."""
        if trouble is not None:
            self.state, self.last_error = "backing_off", trouble
        elif self.state == "backing_off":
            self.state = "running"

    def change_key(self) -> tuple[object, ...]:
        """The parts of the status that change while the trigger runs (not ``updated_at``)."""
        return (self.state, self.failures, self.last_error, self.events, self.last_event_at)

    def status(self, *, now: datetime, owner: str | None) -> TriggerStatus:
        return TriggerStatus(
            trigger_id=self.trigger_id,
            classpath=self.classpath,
            assets=self.asset_names,
            watchers=self.watchers,
            state=self.state,
            failures=self.failures,
            last_error=self.last_error,
            last_event_at=self.last_event_at,
            events=self.events,
            updated_at=now,
            owner=owner,
        )
