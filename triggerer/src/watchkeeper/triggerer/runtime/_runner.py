"""The embeddable runner: supervises watcher triggers inside the caller's event loop.

::

    async with SqliteStateBackend("state.db") as backend, TriggerRunner(backend) as runner:
        await backend.events.aregister_assets([orders])
        await runner.start_trigger(WatchSpec("orders-watcher", OrdersTrigger(), (orders,)))
        with runner.subscribe() as events:
            async for event in events:  # committed asset events, for a UI or a test
                ...

Each trigger runs in its own task of the runner's task group, under the supervisor of
:mod:`._supervisor`: its ``asset_state_store`` is bound before ``run()``, each yielded event is
committed (with its ``state``) before the generator resumes, a failing trigger is restarted
with backoff and finally marked ``failed``, and ``cleanup()`` is always awaited. A loop-lag
monitor names the trigger that blocked the loop, and the statuses are saved to the backend
once at exit and, every ``status_interval`` seconds, those that changed since their last save
(each unchanged row is also saved again every 20 s, or every ``status_interval`` if that is
longer, so that its ``updated_at`` shows the runner is alive).

A spec with a ``fence_token`` runs fenced: its writes carry ``Fence(trigger_id,
config.owner, fence_token)``, the lease the caller (the daemon) claimed for it, and the store
refuses them once that lease is gone; the trigger then stops (state ``stopped``) and stays in
the runner until the caller stops or replaces it.

A store that does not answer (:class:`~watchkeeper.store.StoreUnavailableError`: a database
outage) fails no trigger: the supervisors wait on the runner's :attr:`TriggerRunner.store_health`,
which logs ``store_unavailable`` once, pings the store until it answers, logs
``store_available`` and lets every trigger start again from its stored watermark.

Stopping (``stop_trigger`` or leaving the ``async with``) cancels the trigger and waits up to
``stop_grace`` seconds for it to finish. A trigger that catches the cancellation and carries on
is logged as ``trigger_ignored_cancellation``; anyio cancels it again at each of its following
awaits, so it ends as soon as it lets one through. One that swallows every cancellation forever
cannot be killed from inside the process: leaving the runner then waits for it (a daemon's
process exit is the backstop).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from watchkeeper.store import Asset, AssetEvent, BaseStateBackend
from watchkeeper.store.protocols import Fence, TriggerStatus, get_logger

from .._core import AsyncService, describe_error
from ..errors import CapacityError
from ..trigger import BaseEventTrigger, BaseTrigger
from ._config import RunnerConfig
from ._health import StoreHealth
from ._lag import Culprit, LoopLagMonitor
from ._metrics import RuntimeMetrics
from ._slot import TriggerSlot
from ._supervisor import supervise

__all__ = ["RunnerConfig", "TriggerRunner", "WatchSpec"]

log = get_logger(__name__)

_STATUS_SAVE_TIMEOUT = 5.0
_STATUS_REFRESH = 20.0
"""Seconds within which every status row is saved again even if nothing in it changed
(or every ``status_interval``, when that is longer); the daemon prunes rows of other daemons
after ``3 * heartbeat + 30`` seconds without a refresh."""

_TASK_NAME = "watchkeeper.triggerer.runner.TriggerRunner.supervise"
"""The name of every trigger's task: one string for all (without a name, anyio builds one per
task, and materializes the coroutine's frame object to find its module)."""

_IDLE_KEY: tuple[object, ...] = ("running", 0, None, 0, None)
"""The :meth:`TriggerSlot.change_key` of a trigger that runs and has committed nothing yet:
kept once, not once per trigger, as the ``saved`` key of every such trigger."""


@dataclass(frozen=True, slots=True)
class WatchSpec:
    """One trigger to run: a stable id, the instance, and the (registered) assets it watches.

    ``watchers`` names the :class:`~watchkeeper.triggerer.AssetWatcher` objects the trigger
    serves; each committed event carries them as its ``watcher`` (joined by ", " when there
    are several), or ``trigger_id`` when there are none.

    ``fence_token`` is the token of the lease held on ``trigger_id`` by the runner's
    ``config.owner``; with it, every write of the trigger is fenced on that lease.
    ``watchers`` holds at most one name, the trigger's ``watcher_name`` inside ``run()`` (the
    namespace of its state keys); without one, ``trigger_id`` is its name.

    :param trigger_id: the trigger's stable id (the daemon derives it from ``serialize()``).
    :param trigger: the trigger instance.
    :param assets: the registered assets it watches.
    :param watchers: the names of the watchers it serves.
    :param fence_token: the token of the lease held on ``trigger_id``, or None.
    :raises TypeError: a trigger that is not a ``BaseEventTrigger``, or assets that are not
        ``Asset`` objects.
    :raises ValueError: an empty id, or no asset.
    """

    trigger_id: str
    trigger: BaseEventTrigger
    assets: tuple[Asset, ...]
    watchers: tuple[str, ...] = ()
    fence_token: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trigger_id, str) or not self.trigger_id:
            raise ValueError(
                f"WatchSpec.trigger_id must be a non-empty str, got {self.trigger_id!r}"
            )
        if not isinstance(self.trigger, BaseEventTrigger):
            raise TypeError(
                f"WatchSpec {self.trigger_id!r}: trigger must be a BaseEventTrigger, "
                f"got {type(self.trigger).__name__}"
            )
        given: object = self.assets
        assets = (given,) if isinstance(given, Asset) else tuple(self.assets)
        if not assets:
            raise ValueError(f"WatchSpec {self.trigger_id!r} watches no asset; give at least one")
        for asset in assets:
            if not isinstance(asset, Asset):
                raise TypeError(
                    f"WatchSpec {self.trigger_id!r}: assets must be Asset objects, "
                    f"got {type(asset).__name__}"
                )
        object.__setattr__(self, "assets", assets)
        object.__setattr__(self, "watchers", tuple(self.watchers))
        if len(self.watchers) > 1:
            raise ValueError(
                f"WatchSpec {self.trigger_id!r} names {len(self.watchers)} watchers "
                f"{list(self.watchers)!r}; a running trigger has one watcher name"
            )
        token = self.fence_token
        if token is not None and (type(token) is not int or token < 1):
            raise ValueError(
                f"WatchSpec {self.trigger_id!r}: fence_token must be None or an int >= 1, "
                f"got {token!r}"
            )


class TriggerRunner(AsyncService):
    """An async context manager that owns a task group and supervises triggers in it.

    :param backend: an open backend the triggers' events and state are committed to.
    :param config: the runner's settings (default: :class:`RunnerConfig`'s defaults).
    """

    def __init__(self, backend: BaseStateBackend, config: RunnerConfig | None = None) -> None:
        self.backend = backend
        self.config = config if config is not None else RunnerConfig()
        self.dropped_events = 0
        """Events not delivered to a subscriber whose buffer was full."""
        self._slots: dict[str, TriggerSlot] = {}
        self._by_task: dict[object, TriggerSlot] = {}
        self._by_trigger: dict[int, TriggerSlot] = {}
        self._subscribers: list[MemoryObjectSendStream[AssetEvent]] = []
        self._closing = False
        self._status_table = backend.services.status
        self._save_status = self.config.status_interval > 0 and self._status_table is not None
        if self.config.status_interval > 0 and self._status_table is None:
            log.info("trigger_status_unsupported", backend=type(backend).__name__)
        self.lag_monitor: LoopLagMonitor | None = None
        self.metrics = RuntimeMetrics()
        """Commit latencies, fenced writes and events per asset, for ``/metrics``."""
        # Bound once: every trigger's task keeps these, and a bound method per task is 48 B.
        self._hooks = (self._publish, self._slot_started, self._slot_ended)
        self.store_health = StoreHealth(backend, self.config)
        """Whether the store answers, shared by the supervisors (and the daemon's loops)."""

    def __repr__(self) -> str:
        running = sum(1 for slot in self._slots.values() if slot.state == "running")
        return (
            f"<TriggerRunner triggers={len(self._slots)} running={running} "
            f"capacity={self.config.capacity} open={self.is_running}>"
        )

    # -- lifecycle -----------------------------------------------------------------------------

    async def _astart(self, task_group: anyio.abc.TaskGroup) -> None:
        await task_group.start(self.store_health.run)
        if self.config.lag_threshold > 0:
            self.lag_monitor = LoopLagMonitor(
                self.config.lag_threshold,
                resolve_task=self._culprit_of_task,
                resolve_trigger=self._culprit_of_trigger,
            )
            await task_group.start(self.lag_monitor.run)
        if self._save_status:
            task_group.start_soon(self._save_statuses_periodically)

    async def _astop(self) -> None:
        self._closing = True
        try:
            slots = list(self._slots.values())
            for slot in slots:
                slot.cancel()
            await self._wait_stopped(slots)
            if self._save_status:
                await self._save_statuses()
        finally:
            for send in self._subscribers:
                send.close()
            self._subscribers.clear()

    # -- triggers ------------------------------------------------------------------------------

    async def start_trigger(self, spec: WatchSpec) -> None:
        """Start supervising ``spec.trigger``; returns once its task is created (it runs from
        the event loop's next turn: starting many triggers costs no turn of the loop each).

        Raises :class:`CapacityError` when the runner already holds ``capacity`` triggers and
        ``ValueError`` when ``spec.trigger_id`` (or the same trigger instance) is already here,
        or when ``spec.fence_token`` is set but ``config.owner`` is not.
        """
        tg = self._task_group
        if tg is None or self._closing:
            raise RuntimeError("TriggerRunner is not running; use 'async with TriggerRunner(...)'")
        if not isinstance(spec, WatchSpec):
            raise TypeError(f"start_trigger() takes a WatchSpec, got {type(spec).__name__}")
        if spec.trigger_id in self._slots:
            raise ValueError(f"trigger {spec.trigger_id!r} is already in this runner")
        twin = self._by_trigger.get(id(spec.trigger))
        if twin is not None:
            raise ValueError(
                f"this trigger instance already runs as {twin.trigger_id!r}; "
                "give each WatchSpec its own instance"
            )
        fence: Fence | None = None
        if spec.fence_token is not None:
            if self.config.owner is None:
                raise ValueError(
                    f"trigger {spec.trigger_id!r} has a fence_token but RunnerConfig.owner is "
                    "not set: a lease token means nothing without the owner that holds it"
                )
            fence = Fence(spec.trigger_id, self.config.owner, spec.fence_token)
        if len(self._slots) >= self.config.capacity:
            raise CapacityError(spec.trigger_id, self.config.capacity)
        await anyio.lowlevel.checkpoint_if_cancelled()
        slot = TriggerSlot(spec.trigger_id, spec.trigger, spec.assets, spec.watchers, fence)
        self._slots[spec.trigger_id] = slot
        self._by_trigger[id(spec.trigger)] = slot
        self.metrics.trigger_started(spec.trigger_id)
        try:
            slot.handle = tg.create_task(self._supervise(slot), name=_TASK_NAME)
        except BaseException:
            self._forget(slot)
            raise

    async def stop_trigger(self, trigger_id: str, *, save_status: bool = True) -> None:
        """Cancel one trigger and wait (up to ``stop_grace``) for it and its cleanup to end.

        Its ``stopped`` status is saved unless ``save_status`` is False (the daemon passes
        False when another daemon runs the trigger now and owns its status row).
        Raises ``KeyError`` when no trigger of that id is in the runner.
        """
        slot = self._slots.get(trigger_id)
        if slot is None:
            raise KeyError(f"no trigger {trigger_id!r} in this runner")
        slot.cancel()
        await self._wait_stopped([slot])
        self._forget(slot)
        self.metrics.trigger_stopped(
            trigger_id, slot.watcher_name, slot.watchers, slot.last_event_at
        )
        log.info("trigger_stopped", trigger_id=trigger_id, classpath=slot.classpath)
        if self._save_status and save_status:
            await self._save_statuses([slot.status(now=datetime.now(UTC), owner=self.config.owner)])

    def trigger_ids(self) -> frozenset[str]:
        """The ids of the triggers in the runner (running, backing off or failed)."""
        return frozenset(self._slots)

    def slots(self) -> list[TriggerSlot]:
        """The supervised triggers' live slots (read-only use: the metrics collector)."""
        return list(self._slots.values())

    def statuses(self) -> list[TriggerStatus]:
        """A status per trigger in the runner, ordered by trigger_id."""
        now = datetime.now(UTC)
        owner = self.config.owner
        return [self._slots[key].status(now=now, owner=owner) for key in sorted(self._slots)]

    def subscribe(self, max_buffer_size: int = 1000) -> MemoryObjectReceiveStream[AssetEvent]:
        """A stream of the asset events committed from now on, in commit order.

        A subscriber that falls ``max_buffer_size`` events behind misses the events that do not
        fit (counted in :attr:`dropped_events`); triggers never wait for subscribers. The stream
        ends when the runner exits. Close it (``with runner.subscribe() as events:``) when done.
        """
        send, receive = anyio.create_memory_object_stream[AssetEvent](max_buffer_size)
        if self._task_group is None or self._closing:
            send.close()
        else:
            self._subscribers.append(send)
        return receive

    # -- internals -----------------------------------------------------------------------------

    def _supervise(self, slot: TriggerSlot) -> Coroutine[Any, Any, None]:
        """The coroutine of a trigger's task: :func:`supervise` itself (no coroutine of the
        runner's around it, ~260 B less per watcher), with the runner's shared hooks."""
        publish, started, ended = self._hooks
        return supervise(
            slot, self.backend, self.config, publish, health=self.store_health,
            metrics=self.metrics, started=started, ended=ended,
        )  # fmt: skip

    def _slot_started(self, slot: TriggerSlot) -> None:
        self._by_task[asyncio.current_task()] = slot

    def _slot_ended(self, slot: TriggerSlot) -> None:
        self._by_task.pop(asyncio.current_task(), None)
        tg = self._task_group
        if slot.portal_missing and not slot.stopping and tg is not None and not self._closing:
            # run() made a sync store call without a portal: its task was cancelled (or it
            # ended); a new task runs it again at once, with a portal.
            slot.handle = tg.create_task(self._supervise(slot), name=_TASK_NAME)
        else:
            if slot.state == "running":
                slot.state = "stopped"  # closing while it waited for its portal
            slot.mark_done()

    def _forget(self, slot: TriggerSlot) -> None:
        if self._slots.get(slot.trigger_id) is slot:
            del self._slots[slot.trigger_id]
        if self._by_trigger.get(id(slot.trigger)) is slot:
            del self._by_trigger[id(slot.trigger)]

    async def _wait_stopped(self, slots: Iterable[TriggerSlot]) -> None:
        """Wait up to ``stop_grace`` for cancelled triggers; name those that did not stop."""
        slots = list(slots)
        with anyio.move_on_after(self.config.stop_grace, shield=True):
            for slot in slots:
                await slot.wait_done()
        for slot in slots:
            if not slot.finished and not slot.in_cleanup:
                log.error(
                    "trigger_ignored_cancellation",
                    trigger_id=slot.trigger_id,
                    classpath=slot.classpath,
                    stop_grace=self.config.stop_grace,
                )

    def _publish(self, events: list[AssetEvent]) -> None:
        self.metrics.count_events(events)
        subscribers = self._subscribers
        if not subscribers:
            return
        gone: list[MemoryObjectSendStream[AssetEvent]] = []
        for send in subscribers:
            for event in events:
                try:
                    send.send_nowait(event)
                except anyio.WouldBlock:
                    self.dropped_events += 1
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    gone.append(send)
                    break
        for send in gone:
            subscribers.remove(send)
            send.close()

    async def _save_statuses_periodically(self) -> None:
        interval = self.config.status_interval
        # A row is saved when it changed, and otherwise refreshed every `rounds` intervals (a
        # slice of the rows each time): its updated_at is the runner's heartbeat, by which
        # other daemons tell a live row from one a dead daemon left.
        rounds = max(1, math.ceil(_STATUS_REFRESH / interval))
        tick = 0
        while True:
            await anyio.sleep(interval)
            if not self.store_health.available:
                continue  # what changed meanwhile is saved once the store answers
            await self._save_changed_statuses(tick % rounds, rounds)
            tick += 1

    async def _save_changed_statuses(self, phase: int, rounds: int) -> None:
        """Save the statuses that changed since their last save, plus the slice ``phase``."""
        now = datetime.now(UTC)
        owner = self.config.owner
        due: list[tuple[TriggerSlot, tuple[object, ...]]] = []
        for slot in self._slots.values():
            if slot.state == "stopped":
                continue  # stopped by a lost lease: the row is another daemon's now
            key = slot.change_key()
            if key != slot.saved or hash(slot.trigger_id) % rounds == phase:
                due.append((slot, key))
        if not due:
            return
        due.sort(key=lambda item: item[0].trigger_id)
        rows = [slot.status(now=now, owner=owner) for slot, _ in due]
        if await self._save_statuses(rows, shield=False):
            for slot, key in due:
                slot.saved = _IDLE_KEY if key == _IDLE_KEY else key

    async def _save_statuses(
        self, statuses: list[TriggerStatus] | None = None, *, shield: bool = True
    ) -> bool:
        """Save statuses; bounded, and shielded (by default) so that it also runs at exit.

        Returns whether the backend took them (never raises: a status is advisory).
        """
        table = self._status_table
        if not self._save_status or table is None:
            return False
        rows = self.statuses() if statuses is None else statuses
        if not rows:
            return True
        saved = False
        with anyio.move_on_after(_STATUS_SAVE_TIMEOUT, shield=shield) as scope:
            try:
                await table.asave_trigger_status(rows)
                saved = True
            except Exception as exc:  # noqa: BLE001 - a status is advisory; never fatal
                if self.store_health.report(exc) is None:  # an outage is logged once, there
                    log.warning("trigger_status_save_failed", error=describe_error(exc))
        if scope.cancelled_caught:
            log.warning(
                "trigger_status_save_failed", error="timed out", timeout=_STATUS_SAVE_TIMEOUT
            )
        return saved

    def _culprit_of_task(self, task: object) -> Culprit | None:
        slot = self._by_task.get(task)
        return None if slot is None else (slot.trigger_id, slot.classpath)

    def _culprit_of_trigger(self, trigger: BaseTrigger) -> Culprit | None:
        slot = self._by_trigger.get(id(trigger))
        return None if slot is None else (slot.trigger_id, slot.classpath)
