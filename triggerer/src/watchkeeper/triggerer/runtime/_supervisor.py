"""Running one trigger, and supervising it: the heart of the runtime.

:func:`drive_trigger` runs ``trigger.run()`` once: it binds the trigger's
``asset_state_store``, iterates the generator (closing it at the end, as
:func:`contextlib.aclosing` would), validates each yielded event, commits it (with its
``state``) through ``backend.events.acommit`` and only then resumes the generator, so the code
after ``yield`` runs with the event durable and the generator never runs ahead of its commits (one event in flight per trigger). A yielded
:class:`~watchkeeper.triggerer.TriggerEventBatch` is one commit (``backend.events.acommit_batch``):
the generator resumes once all of it is durable. ``cleanup()`` is awaited
after every run, however it ended, shielded and bounded.

:func:`supervise` wraps it in the restart loop: a run that raises or returns is restarted after
an exponential, jittered backoff; after ``max_failures`` consecutive failures the trigger is
``failed`` and left alone. A trigger's exceptions never leave its supervisor (one failing trigger
degrades only itself); cancellation always passes through.

A slot with a :class:`~watchkeeper.store.protocols.Fence` (the daemon's lease on the trigger) writes
through a fenced :class:`~watchkeeper.store.protocols.Writer`: its events and its accessors' ``set`` calls
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
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import greenback
import structlog
from watchkeeper.store import (
    AssetEvent,
    AssetStateStoreAccessors,
    BaseStateBackend,
    DatabaseFileRemovedError,
)
from watchkeeper.store.protocols import (
    SYNC_CALL_WITHOUT_PORTAL,
    EventCommit,
    get_logger,
)

from .._core import describe_error, lease_lost
from ..errors import InvalidEventError
from ._commit import EventEncoder
from ._config import RunnerConfig, backoff_delay
from ._portal import note_portal_class, open_portal_for, wants_portal_up_front
from ._slot import Publish, TriggerSlot, TriggerState

if TYPE_CHECKING:
    from watchkeeper.store.protocols import EventBatchCommit

    from ._health import StoreHealth
    from ._metrics import RuntimeMetrics

__all__ = ["backoff_delay", "drive_trigger", "supervise"]

log = get_logger(__name__)

_CHECKPOINT_EVERY = 32
"""Commits between two forced checkpoints of a trigger's task."""


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
    encoder = EventEncoder(
        slot.watcher_name,
        slot.asset_names,
        writer=slot.writer,
        max_value_bytes=backend.max_value_bytes,
        max_payload_bytes=backend.max_payload_bytes,
    )
    event_log = backend.events  # checked once per run
    commit_event = event_log.acommit
    commit_events = event_log.acommit_batch
    # Checked once per run: no logger is kept per trigger when debug logging is off.
    debug = _debug_enabled(log)
    _bind(slot, backend)
    try:
        events = _start_run(slot)
        since_checkpoint = 0
        try:  # contextlib.aclosing's work, without an object kept per idle trigger
            async for item in events:
                if slot.portal_missing:
                    return  # what run() yields after that call is not committed
                commit = _encode(slot, encoder, item)
                started = time.perf_counter()
                if isinstance(commit, EventCommit):
                    written = await commit_event(commit)
                else:  # a TriggerEventBatch: one commit for all its events
                    written = await commit_events(commit)
                if metrics is not None:
                    metrics.observe_commit(time.perf_counter() - started)
                if written:
                    _count_written(slot, commit, written, publish, debug)
                    if max_events is not None and slot.events >= max_events:
                        return
                elif debug:
                    _log_deduplicated(commit)
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
        _bind(slot, None)
        await _cleanup(slot, cleanup_timeout)


def _bind(slot: TriggerSlot, backend: BaseStateBackend | None) -> None:
    """Give the trigger its store accessors, watcher name and source-status hook for a run
    (``backend`` None: take them back)."""
    trigger = slot.trigger
    if backend is None:
        trigger.bind_asset_state_store(None)
        trigger.bind_watcher_name(None)
        trigger.bind_source_status(None)
        return
    trigger.bind_asset_state_store(
        AssetStateStoreAccessors(backend, slot.assets, writer=slot.writer)
    )
    trigger.bind_watcher_name(slot.watcher_name)
    trigger.bind_source_status(slot.source_status)


def _start_run(slot: TriggerSlot) -> AsyncIterator[Any]:
    """Call ``run()``; what it returned, checked to be an async iterator."""
    events: object = slot.trigger.run()
    if not isinstance(events, AsyncIterator):
        if inspect.iscoroutine(events):
            events.close()  # an 'async def' without 'yield'; closing avoids a warning
        raise InvalidEventError(
            f"{slot.classpath}.run() returned a {type(events).__name__}; it must be an "
            "async generator ('async def run(self)' containing 'yield')"
        )
    return events


def _encode(
    slot: TriggerSlot, encoder: EventEncoder, item: object
) -> EventCommit | EventBatchCommit:
    """The commit for ``item``; an error says which trigger yielded what could not be stored."""
    try:
        return encoder.build(item)
    except Exception as exc:
        exc.add_note(
            f"raised for an event yielded by {slot.classpath}.run() "
            f"(trigger {slot.trigger_id!r}); nothing was committed"
        )
        raise


def _count_written(
    slot: TriggerSlot,
    commit: EventCommit | EventBatchCommit,
    written: list[AssetEvent],
    publish: Publish | None,
    debug: bool,
) -> None:
    """Book a commit that wrote ``written``: progress resets the failure count."""
    slot.failures = 0
    slot.events += len(written)
    slot.last_event_at = written[-1].created_at
    if publish is not None:
        publish(written)
    if debug:
        log.debug("event_committed", event_id=written[-1].id, count=len(written))
        # A batch's asset events its dedup_keys suppressed (redeliveries of committed ones).
        if not isinstance(commit, EventCommit) and (
            n := len(commit.events) * len(commit.assets) - len(written)
        ):
            log.debug("batch_partly_deduplicated", suppressed=n)


def _log_deduplicated(commit: EventCommit | EventBatchCommit) -> None:
    if isinstance(commit, EventCommit):
        log.debug("event_deduplicated", dedup_key=commit.dedup_key)
    else:
        log.debug("batch_deduplicated", count=len(commit.events))


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
    runs this as its task's own coroutine and keeps its books there. A run ended by a store
    that did not answer is not a failure (see :func:`_wait_for_store`).
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
        await _ensure_portal(slot)
        waits = 0  # runs in a row ended by an unavailable store without committing anything
        while True:
            events_before = slot.events
            error = await _run_once(slot, backend, config, publish, metrics, quiet=waits > 0)
            if slot.portal_missing:
                return  # run() ended (or raised) after a sync call without a portal
            if _stopped_by_lost_lease(slot, error, metrics):
                return  # not a failure: the lease moved (or lapsed); the daemon decides
            cause = health.report(error)
            if isinstance(cause, DatabaseFileRemovedError):
                slot.last_error = describe_error(cause)  # the daemon stops; health logged it
                return
            if cause is not None:  # not the trigger's failure: wait for the store, run again
                waits = 1 if slot.events > events_before else waits + 1
                await _wait_for_store(slot, cause, waits, health, config)
                continue
            waits = 0
            if _count_failure(slot, error, config, metrics) == "failed":
                return
            await _back_off(slot, config)
    finally:
        if slot.portal_missing and not greenback.has_portal():
            note_portal_class(slot.trigger)  # started again (state "running") by the caller
        elif slot.state != "failed":
            slot.state = "stopped"
        SYNC_CALL_WITHOUT_PORTAL.reset(hook)
        structlog.contextvars.reset_contextvars(**tokens)
        if ended is not None:
            ended(slot)


async def _ensure_portal(slot: TriggerSlot) -> None:
    """Open a greenback portal in this task when the trigger needs one.

    Sync store calls (``self.asset_state_store.get``) go through a portal, ~3 KiB per idle
    trigger: a trigger gets one once its class is seen to need it (its first sync call
    cancelled the trigger's task; the caller runs :func:`supervise` again in a new task).
    """
    if slot.portal_missing:
        await open_portal_for(slot.trigger)
        log.debug("trigger_portal_opened", classpath=slot.classpath)
    elif wants_portal_up_front(slot.trigger):
        await greenback.ensure_portal()


async def _run_once(
    slot: TriggerSlot,
    backend: BaseStateBackend,
    config: RunnerConfig,
    publish: Publish | None,
    metrics: RuntimeMetrics | None,
    *,
    quiet: bool,
) -> Exception | None:
    """One run of the trigger; the exception it ended with (None when ``run()`` returned).
    ``quiet``: log the start at debug level (a run again after waiting for the store)."""
    slot.state = "running"
    slot.runs += 1
    slot.portal_missing = False
    (log.debug if quiet else log.info)(
        "trigger_started", classpath=slot.classpath, watchers=list(slot.watchers), run=slot.runs
    )
    try:
        await drive_trigger(
            slot, backend, cleanup_timeout=config.cleanup_timeout, publish=publish, metrics=metrics
        )
    except Exception as exc:  # noqa: BLE001 - a trigger's bug degrades only itself
        return exc
    return None


def _stopped_by_lost_lease(
    slot: TriggerSlot, error: Exception | None, metrics: RuntimeMetrics | None
) -> bool:
    """Whether the run ended because the store refused a write as fenced (the lease moved or
    lapsed); the trigger then stops, nothing counted as its failure."""
    lost = lease_lost(error)
    if lost is None:
        return False
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
    return True


async def _wait_for_store(
    slot: TriggerSlot, cause: BaseException, waits: int, health: StoreHealth, config: RunnerConfig
) -> None:
    """Wait (state ``backing_off``) until ``health`` has seen the store answer.

    ``health`` classified the run's error as the store not answering: the trigger then starts
    again from its stored watermark, nothing counted and nothing logged above debug
    (``health`` logs the outage once). Should it meet the store unavailable again while the
    store answers others (``waits`` > 1), it also backs off on its own.
    """
    slot.last_error = describe_error(cause)
    slot.state = "backing_off"
    log.debug("trigger_waiting_for_store", error=slot.last_error, waits=waits)
    await health.wait_available()
    if waits > 1 and health.available:
        await anyio.sleep(min(backoff_delay(waits - 1, config), config.store_retry_max))


async def _back_off(slot: TriggerSlot, config: RunnerConfig) -> None:
    """Sleep the backoff after ``slot.failures`` failed runs in a row (state ``backing_off``)."""
    delay = backoff_delay(slot.failures, config)
    slot.state = "backing_off"
    log.warning("trigger_backoff", delay=round(delay, 3), failures=slot.failures)
    await anyio.sleep(delay)


def _count_failure(
    slot: TriggerSlot, error: Exception | None, config: RunnerConfig, metrics: RuntimeMetrics | None
) -> TriggerState:
    """Count a failed run (it raised, or returned) and log it; ``failed`` once
    ``max_failures`` runs in a row failed, else the state it keeps."""
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
    return slot.state
