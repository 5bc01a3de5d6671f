"""Running one trigger, and supervising it: the heart of the runtime.

:func:`drive_trigger` runs ``trigger.run()`` once: it binds the trigger's
``asset_state_store``, iterates the generator (closing it at the end, as
:func:`contextlib.aclosing` would), validates each yielded event, commits it (with its
``state``) through ``backend.acommit_event`` and only then resumes the generator, so the code
after ``yield`` runs with the event durable and the generator never runs ahead of its commits (one event in flight per trigger). A yielded
:class:`~watchkeeper.triggerer.TriggerEventBatch` is one commit (``backend.acommit_events``):
the generator resumes once all of it is durable. ``cleanup()`` is awaited
after every run, however it ended, shielded and bounded.

:func:`supervise` wraps it in the restart loop: a run that raises or returns is restarted after
an exponential, jittered backoff; after ``max_failures`` consecutive failures the trigger is
``failed`` and left alone. A trigger's exceptions never leave its supervisor (one failing trigger
degrades only itself); cancellation always passes through.

A slot with a :class:`~watchkeeper.store.backend.Fence` (the daemon's lease on the trigger) writes
through a fenced :class:`~watchkeeper.store.backend.Writer`: its events and its accessors' ``set`` calls
are refused by the store once the lease is gone. On :class:`~watchkeeper.store.LeaseLostError`
the supervisor stops the trigger (state ``stopped``, log ``lease_lost``) without counting a
failure: another daemon runs it now, and this one's daemon restarts it if it gets the lease back.

A store that does not answer (:class:`~watchkeeper.store.StoreUnavailableError`) is not the
trigger's failure either: the supervisor waits on the runner's shared
:class:`~._health.StoreHealth` and starts the trigger again once the store answers.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
import greenback
import structlog
from watchkeeper.store import (
    Asset,
    AssetEvent,
    AssetStateStoreAccessors,
    BaseStateBackend,
    DatabaseFileRemovedError,
)
from watchkeeper.store.backend import (
    SYNC_CALL_WITHOUT_PORTAL,
    EventCommit,
    Fence,
    TriggerStatus,
    Writer,
    get_logger,
    require_event_log,
)

from ._commit import EventEncoder
from ._config import RunnerConfig, backoff_delay
from ._describe import describe_error, lease_lost
from ._portal import note_portal_class, open_portal_for, wants_portal_up_front
from .errors import InvalidEventError
from .trigger import BaseEventTrigger

if TYPE_CHECKING:
    from anyio import TaskHandle

    from ._health import StoreHealth
    from ._runtime_metrics import RuntimeMetrics

__all__ = [
    "Publish",
    "TriggerSlot",
    "TriggerState",
    "backoff_delay",
    "drive_trigger",
    "supervise",
]

log = get_logger(__name__)

_CHECKPOINT_EVERY = 32
"""Commits between two forced checkpoints of a trigger's task."""

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


def _debug_enabled(logger: Any) -> bool:
    is_enabled_for = getattr(logger, "is_enabled_for", None)
    return True if is_enabled_for is None else bool(is_enabled_for(logging.DEBUG))


async def drive_trigger(
    slot: TriggerSlot,
    backend: BaseStateBackend,
    *,
    cleanup_timeout: float,
    publish: Publish | None = None,
    max_events: int | None = None,
    metrics: RuntimeMetrics | None = None,
) -> None:
    """Run ``slot.trigger.run()`` once, committing each event before resuming the generator.

    Returns when ``run()`` returns, or once ``slot.events`` reaches ``max_events`` (the
    generator is then closed at its ``yield``, as when breaking out of ``async for``; a batch
    is never split, so the count may pass ``max_events`` by the rest of a batch). Raises
    what ``run()`` raised, :class:`InvalidEventError` or the store's validation errors for an
    event that cannot be stored, and what the commit raised. ``cleanup()`` is always awaited.
    """
    trigger = slot.trigger
    encoder = EventEncoder(
        slot.watcher_name,
        slot.asset_names,
        writer=slot.writer,
        max_value_bytes=backend.max_value_bytes,
        max_payload_bytes=backend.max_payload_bytes,
    )
    event_log = require_event_log(backend)  # checked once per run
    commit_event = event_log.acommit_event
    commit_events = event_log.acommit_events
    # Checked once per run: no logger is kept per trigger when debug logging is off.
    debug = _debug_enabled(log)
    trigger.bind_asset_state_store(
        AssetStateStoreAccessors(backend, slot.assets, writer=slot.writer)
    )
    trigger.bind_watcher_name(slot.watcher_name)
    trigger.bind_source_status(slot.source_status)
    try:
        events: object = trigger.run()
        if not isinstance(events, AsyncIterator):
            if inspect.iscoroutine(events):
                events.close()  # an 'async def' without 'yield'; closing avoids a warning
            raise InvalidEventError(
                f"{slot.classpath}.run() returned a {type(events).__name__}; it must be an "
                "async generator ('async def run(self)' containing 'yield')"
            )
        since_checkpoint = 0
        try:  # contextlib.aclosing's work, without an object kept per idle trigger
            async for item in events:
                if slot.portal_missing:
                    return  # what run() yields after that call is not committed
                try:
                    commit = encoder.build(item)
                except Exception as exc:
                    exc.add_note(
                        f"raised for an event yielded by {slot.classpath}.run() "
                        f"(trigger {slot.trigger_id!r}); nothing was committed"
                    )
                    raise
                started = time.perf_counter()
                if isinstance(commit, EventCommit):
                    written = await commit_event(commit)
                else:  # a TriggerEventBatch: one commit for all its events
                    written = await commit_events(commit)
                if metrics is not None:
                    metrics.observe_commit(time.perf_counter() - started)
                if written:
                    slot.failures = 0
                    slot.events += len(written)
                    slot.last_event_at = written[-1].created_at
                    if publish is not None:
                        publish(written)
                    if debug:
                        log.debug("event_committed", event_id=written[-1].id, count=len(written))
                        # A batch's asset events its dedup_keys suppressed (redeliveries).
                        if not isinstance(commit, EventCommit) and (
                            n := len(commit.events) * len(commit.assets) - len(written)
                        ):
                            log.debug("batch_partly_deduplicated", suppressed=n)
                    if max_events is not None and slot.events >= max_events:
                        return
                elif debug:
                    if isinstance(commit, EventCommit):
                        log.debug("event_deduplicated", dedup_key=commit.dedup_key)
                    else:
                        log.debug("batch_deduplicated", count=len(commit.events))
                since_checkpoint += 1
                if since_checkpoint == _CHECKPOINT_EVERY:
                    # A backend that commits without suspending (memory) and a generator that
                    # yields without awaiting would otherwise never let another task run.
                    since_checkpoint = 0
                    await anyio.lowlevel.checkpoint()
        finally:
            if isinstance(events, AsyncGenerator):
                await events.aclose()
    finally:
        trigger.bind_asset_state_store(None)
        trigger.bind_watcher_name(None)
        trigger.bind_source_status(None)
        await _cleanup(slot, cleanup_timeout)


async def _cleanup(slot: TriggerSlot, limit: float) -> None:
    """Await ``cleanup()``, shielded from cancellation but never for longer than ``limit``."""
    slot.in_cleanup = True
    try:
        with anyio.move_on_after(limit, shield=True) as scope:
            try:
                await slot.trigger.cleanup()
            except Exception as exc:
                slot.cleanup_error = exc
                log.error(
                    "trigger_cleanup_failed",
                    classpath=slot.classpath,
                    error=describe_error(exc),
                    exc_info=exc,
                )
        if scope.cancelled_caught:
            slot.cleanup_error = TimeoutError(
                f"{slot.classpath}.cleanup() did not finish within {limit} s"
            )
            log.error(
                "trigger_cleanup_failed",
                classpath=slot.classpath,
                error=describe_error(slot.cleanup_error),
                timeout=limit,
            )
    finally:
        slot.in_cleanup = False


async def supervise(
    slot: TriggerSlot,
    backend: BaseStateBackend,
    config: RunnerConfig,
    publish: Publish | None = None,
    *,
    health: StoreHealth,
    metrics: RuntimeMetrics | None = None,
    started: Callable[[TriggerSlot], None] | None = None,
    ended: Callable[[TriggerSlot], None] | None = None,
) -> None:
    """Run the trigger, restarting it with backoff, until it is cancelled or ``failed``.

    Returns normally only when the trigger reached ``max_failures`` (state ``failed``), its
    lease was lost or its database file was removed (state ``stopped``), or when ``run()``
    made a sync store call without a greenback portal (``slot.portal_missing``, state still
    ``running``; the store's hook also cancelled ``slot.handle``'s task): the caller then
    runs this again in a new task, which opens a portal first. Otherwise it runs until
    cancelled. Never raises a trigger's exception. The caller calls ``slot.mark_done()``.
    ``started(slot)`` is called first and ``ended(slot)`` last, whatever happens: the runner
    runs this as its task's own coroutine and keeps its books there.

    A run that ended because the store did not answer (``health`` classifies the error) is
    not a failure: the trigger waits (state ``backing_off``) until ``health`` has seen the
    store answer, then starts again from its stored watermark, nothing counted and nothing
    logged above debug (``health`` logs the outage once). Should it meet the store
    unavailable again while the store answers others, it also backs off on its own.
    """
    # Bound in this task's own context (anyio runs each task in a copy), and reset at the end
    # for a caller that runs supervise() in a task of its own making. Not the bound_contextvars
    # context manager: its generator would stay alive, per trigger, for as long as it runs.
    if started is not None:
        started(slot)
    tokens = structlog.contextvars.bind_contextvars(
        trigger_id=slot.trigger_id, assets=list(slot.asset_names)
    )
    hook = SYNC_CALL_WITHOUT_PORTAL.set(slot)
    try:
        # Sync store calls (self.asset_state_store.get) go through a greenback portal, ~3 KiB
        # per idle trigger: a trigger gets one once its class is seen to need it (its first
        # sync call cancelled the trigger's task; the caller runs this again in a new task).
        if slot.portal_missing:
            await open_portal_for(slot.trigger)
            log.debug("trigger_portal_opened", classpath=slot.classpath)
        elif wants_portal_up_front(slot.trigger):
            await greenback.ensure_portal()
        waits = 0  # runs in a row ended by an unavailable store without committing anything
        while True:
            slot.state = "running"
            slot.runs += 1
            slot.portal_missing = False
            (log.debug if waits else log.info)(
                "trigger_started",
                classpath=slot.classpath,
                watchers=list(slot.watchers),
                run=slot.runs,
            )
            events_before = slot.events
            error: Exception | None = None
            try:
                await drive_trigger(
                    slot,
                    backend,
                    cleanup_timeout=config.cleanup_timeout,
                    publish=publish,
                    metrics=metrics,
                )
            except Exception as exc:  # noqa: BLE001 - a trigger's bug degrades only itself
                error = exc
            if slot.portal_missing:
                return  # run() ended (or raised) after a sync call without a portal
            lost = lease_lost(error)
            if lost is not None:
                # Not a failure: the lease moved (or lapsed). Stop; the daemon decides.
                if metrics is not None:
                    metrics.fenced_writes += 1
                slot.last_error = describe_error(lost)
                log.warning(
                    "lease_lost",
                    classpath=slot.classpath,
                    owner=lost.owner,
                    token=lost.token,
                    reason=lost.reason,
                )
                return
            cause = health.report(error)
            if isinstance(cause, DatabaseFileRemovedError):
                slot.last_error = describe_error(cause)  # the daemon stops; health logged it
                return
            if cause is not None:
                # Not the trigger's failure: wait for the store, then start again.
                waits = 1 if slot.events > events_before else waits + 1
                slot.last_error = describe_error(cause)
                slot.state = "backing_off"
                log.debug("trigger_waiting_for_store", error=slot.last_error, waits=waits)
                await health.wait_available()
                if waits > 1 and health.available:
                    # The store answers, yet this trigger met it unavailable again.
                    delay = min(backoff_delay(waits - 1, config), config.store_retry_max)
                    await anyio.sleep(delay)
                continue
            waits = 0
            slot.failures += 1
            if metrics is not None:
                metrics.count_failure(slot.trigger_id)
            if error is None:
                slot.last_error = "run() returned"
                log.warning("trigger_returned", failures=slot.failures, events=slot.events)
            else:
                slot.last_error = describe_error(error)
                log.error(
                    "trigger_error",
                    classpath=slot.classpath,
                    error=slot.last_error,
                    failures=slot.failures,
                    exc_info=error,
                )
            if config.max_failures and slot.failures >= config.max_failures:
                slot.state = "failed"
                log.error(
                    "trigger_failed",
                    classpath=slot.classpath,
                    error=slot.last_error,
                    failures=slot.failures,
                )
                return
            delay = backoff_delay(slot.failures, config)
            slot.state = "backing_off"
            log.warning("trigger_backoff", delay=round(delay, 3), failures=slot.failures)
            await anyio.sleep(delay)
    finally:
        if slot.portal_missing and not greenback.has_portal():
            note_portal_class(slot.trigger)  # started again (state "running") by the caller
        elif slot.state != "failed":
            slot.state = "stopped"
        SYNC_CALL_WITHOUT_PORTAL.reset(hook)
        structlog.contextvars.reset_contextvars(**tokens)
        if ended is not None:
            ended(slot)
