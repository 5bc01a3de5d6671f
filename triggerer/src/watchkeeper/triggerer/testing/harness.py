"""``WatcherHarness``: run a watcher through the real runtime, stop it, restart it, crash it.

::

    harness = WatcherHarness(backend)  # a watcher of a feed holding the items 1..5
    first = await harness.run(watcher, assets=[orders], max_events=2)  # 1, 2
    await harness.crash(watcher, assets=[orders], at="after_commit", event=2)  # 3, 4, dies
    after = await harness.restart(watcher, assets=[orders], max_events=1)  # 5
    assert after.all_payloads == [1, 2, 3, 4, 5]  # nothing lost, nothing twice
    assert after.watermark == 5

Every run goes through :func:`~watchkeeper.triggerer.testing.run_trigger` (the runtime's own
binding of ``asset_state_store``, validation and commit of each event before the generator
resumes, and awaited ``cleanup()``) on the harness's backend. :meth:`WatcherHarness.restart`
runs a *new* instance rebuilt from ``serialize()``, as a daemon does after a restart, and
:meth:`WatcherHarness.crash` kills a run at a named point (see :data:`CrashPoint`) so a test
shows what the watcher does when the process dies there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
from watchkeeper.store import Asset, AssetEvent, AssetScope, BaseStateBackend

from ..daemon import canonical_trigger_json, rebuild_trigger, watcher_trigger_id
from ..trigger import BaseEventTrigger
from ._observed import CrashPlan, CrashPoint, ObservedBackend, SimulatedCrash
from ._run import run_trigger, watcher_name_for
from .sources import FakeEventSource

__all__ = ["CrashNotReachedError", "HarnessRun", "StopReason", "WatcherHarness"]

StopReason = Literal["max_events", "idle", "returned", "timeout", "crashed"]

DEFAULT_TIMEOUT = 10.0


class CrashNotReachedError(RuntimeError):
    """Raised by :meth:`WatcherHarness.crash` when the run ended before its crash point."""

    def __init__(self, plan: CrashPlan, stopped: str, yielded: int) -> None:
        super().__init__(
            f"the run stopped ({stopped}) after {yielded} event(s), before reaching "
            f"{plan.point} of event {plan.event}"
        )


@dataclass(frozen=True, slots=True)
class HarnessRun:
    """What one run did, and where the backend stands after it."""

    trigger: BaseEventTrigger
    """The instance that ran (after :meth:`~WatcherHarness.restart`, the rebuilt one)."""
    events: list[AssetEvent]
    """Asset events this run committed, in commit order."""
    all_events: list[AssetEvent]
    """Every asset event of the watched assets in the backend, in commit order."""
    state: dict[str, dict[str, Any]]
    """The watched assets' state after the run: ``{asset name: {key: value}}``."""
    watermark: Any
    """The first watched asset's value of the harness's ``watermark_key`` (None when unset)."""
    stopped: StopReason
    crash: SimulatedCrash | None = field(default=None, repr=False)

    @property
    def payloads(self) -> list[Any]:
        """The payloads of :attr:`events`."""
        return [event.payload for event in self.events]

    @property
    def all_payloads(self) -> list[Any]:
        """The payloads of :attr:`all_events`."""
        return [event.payload for event in self.all_events]


def _assets(assets: Asset | Sequence[Asset]) -> tuple[Asset, ...]:
    watched = (assets,) if isinstance(assets, Asset) else tuple(assets)
    if not watched or not all(isinstance(asset, Asset) for asset in watched):
        raise TypeError(
            f"assets must be one Asset or a non-empty sequence of Assets, got {assets!r}"
        )
    return watched


def _positive(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not value > 0):
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")


class WatcherHarness:
    """Runs watchers on one backend, as a daemon would across restarts and crashes.

    Each run takes a ``watcher_name`` (default: the trigger's class name), bound as the
    trigger's ``self.watcher_name`` as the daemon binds the
    :class:`~watchkeeper.triggerer.AssetWatcher`'s name; pass the same one to a restart to
    resume the same watcher.

    :param backend: the open backend every run commits to.
    :param watermark_key: the state key reported as :attr:`HarnessRun.watermark`.
    :raises TypeError: ``backend`` is not a backend.
    """

    def __init__(self, backend: BaseStateBackend, *, watermark_key: str = "watermark") -> None:
        if not isinstance(backend, BaseStateBackend):
            raise TypeError(f"backend must be a BaseStateBackend, got {type(backend).__name__}")
        self.backend = backend
        self.watermark_key = watermark_key
        self.runs: list[HarnessRun] = []
        """Every run so far, oldest first."""

    def __repr__(self) -> str:
        return f"<WatcherHarness backend={self.backend!r} runs={len(self.runs)}>"

    # -- building ------------------------------------------------------------------------------

    @staticmethod
    def rebuild(trigger: BaseEventTrigger) -> BaseEventTrigger:
        """Build a new instance from ``trigger.serialize()``, its kwargs round-tripped
        through JSON, as a daemon rebuilds a watcher it did not define.

        :param trigger: the trigger to rebuild.
        :returns: a new instance of the same class.
        :raises TypeError: the kwargs are not JSON.
        :raises ValueError: the kwargs are not JSON (a value JSON cannot hold).
        :raises TriggerImportError: the classpath does not import (a class defined inside a
            function cannot be rebuilt) or rejects the kwargs.
        """
        classpath, kwargs = trigger.serialize()
        canonical = canonical_trigger_json(classpath, kwargs)
        _, plain = json.loads(canonical)
        return rebuild_trigger(classpath, plain, [classpath])

    # -- running -------------------------------------------------------------------------------

    async def run(
        self,
        trigger: BaseEventTrigger,
        *,
        assets: Asset | Sequence[Asset],
        max_events: int | None = None,
        idle: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the kit's documented API
        watcher_name: str | None = None,
    ) -> HarnessRun:
        """Run ``trigger`` until a limit is reached or ``run()`` returns; then stop it
        (cancel, await cleanup).

        :param trigger: the trigger instance to run.
        :param assets: the asset or assets it watches.
        :param max_events: stop after this many committed asset events (a
            :class:`~watchkeeper.triggerer.TriggerEventBatch` is never split: the run
            stops after the batch that reached it, and its events are all in the result).
        :param idle: stop once this many seconds pass without a commit; the idle clock starts at
            the first commit, so a slow start never looks idle.
        :param timeout: stop after this many seconds; None: no limit.
        :param watcher_name: the watcher's name (default: the trigger's class name).
        :returns: what the run committed, and where the backend stands after it.
        :raises Exception: what the trigger raised.
        """
        return await self._run(
            trigger, _assets(assets), max_events, idle, timeout, None, (), watcher_name
        )

    async def restart(
        self,
        trigger: BaseEventTrigger,
        *,
        assets: Asset | Sequence[Asset],
        max_events: int | None = None,
        idle: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the kit's documented API
        watcher_name: str | None = None,
    ) -> HarnessRun:
        """:meth:`run` a new instance rebuilt from ``trigger.serialize()`` (a daemon restart).

        The parameters and the result are :meth:`run`'s; ``trigger`` is the instance the new
        one is rebuilt from (:attr:`HarnessRun.trigger` is the new one).

        :raises Exception: what the trigger raised.
        :raises TriggerImportError: the trigger cannot be rebuilt (see :meth:`rebuild`).
        """
        return await self.run(
            self.rebuild(trigger),
            assets=assets,
            max_events=max_events,
            idle=idle,
            timeout=timeout,
            watcher_name=watcher_name,
        )

    async def crash(
        self,
        trigger: BaseEventTrigger,
        *,
        assets: Asset | Sequence[Asset],
        at: CrashPoint,
        event: int = 1,
        sources: Sequence[FakeEventSource] = (),
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the kit's documented API
        watcher_name: str | None = None,
    ) -> HarnessRun:
        """Run ``trigger`` and kill it at a crash point, as ``kill -9`` would.

        Nothing the dying run does after that point reaches the backend.

        :param trigger: the trigger instance to run.
        :param assets: the asset or assets it watches.
        :param at: where in the handling of the event the run dies.
        :param event: which yielded event (1 for the first; a
            :class:`~watchkeeper.triggerer.TriggerEventBatch` counts as one: it commits
            whole).
        :param sources: fake sources disconnected at the crash (a broker forgets a dead
            consumer's unacknowledged deliveries and gives them to the next one).
        :param timeout: give up after this many seconds; None: no limit.
        :param watcher_name: the watcher's name (default: the trigger's class name).
        :returns: what the run committed before it died, and where the backend stands.
        :raises CrashNotReachedError: the run ended before the crash point.
        :raises TypeError: a source is not a :class:`FakeEventSource`.
        """
        plan = CrashPlan(at, event)
        for source in sources:
            if not isinstance(source, FakeEventSource):
                raise TypeError(f"sources must be FakeEventSource objects, got {source!r}")
        result = await self._run(
            trigger, _assets(assets), None, None, timeout, plan, sources, watcher_name
        )
        return result

    async def _run(
        self,
        trigger: BaseEventTrigger,
        watched: tuple[Asset, ...],
        max_events: int | None,
        idle: float | None,
        timeout: float | None,  # noqa: ASYNC109 - the kit's documented API
        plan: CrashPlan | None,
        sources: Sequence[FakeEventSource],
        watcher_name: str | None,
    ) -> HarnessRun:
        if not isinstance(trigger, BaseEventTrigger):
            raise TypeError(f"the harness runs BaseEventTrigger instances, got {trigger!r}")
        _positive("idle", idle)
        _positive("timeout", timeout)
        name = watcher_name_for(trigger, watcher_name)
        trigger_id = watcher_trigger_id(canonical_trigger_json(*trigger.serialize()), name)
        stop_reason: list[StopReason] = []
        failure: list[Exception] = []
        scope = anyio.CancelScope()

        async def on_crash() -> None:
            stop_reason.append("crashed")
            scope.cancel()
            for source in sources:
                await source.disconnect()

        observed = ObservedBackend(self.backend, plan, on_crash)
        async with observed:

            async def drive() -> None:
                try:
                    await run_trigger(
                        trigger,
                        assets=watched,
                        backend=observed,
                        max_events=max_events,
                        trigger_id=trigger_id,
                        watcher_name=name,
                    )
                except Exception as exc:  # noqa: BLE001 - re-raised below, unless it died
                    if observed.crashed is None:
                        failure.append(exc)
                scope.cancel()

            with scope:
                with anyio.move_on_after(timeout) as deadline:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(drive)
                        if idle is not None:
                            tg.start_soon(self._stop_when_idle, observed, idle, stop_reason, scope)
            if deadline.cancelled_caught and not stop_reason:
                stop_reason.append("timeout")
        if failure:
            raise failure[0]
        events = observed.committed
        if stop_reason:
            stopped = stop_reason[0]
        elif max_events is not None and len(events) >= max_events:
            stopped = "max_events"
        else:
            stopped = "returned"
        if plan is not None and observed.crashed is None:
            raise CrashNotReachedError(plan, stopped, observed.yielded)
        result = await self._result(trigger, watched, events, stopped, observed.crashed)
        self.runs.append(result)
        return result

    @staticmethod
    async def _stop_when_idle(
        observed: ObservedBackend,
        idle: float,
        stop_reason: list[StopReason],
        scope: anyio.CancelScope,
    ) -> None:
        await observed.first_commit.wait()
        while True:
            remaining = observed.last_commit_at + idle - anyio.current_time()
            if remaining <= 0:
                stop_reason.append("idle")
                scope.cancel()
                return
            await anyio.sleep(remaining)

    async def _result(
        self,
        trigger: BaseEventTrigger,
        watched: tuple[Asset, ...],
        events: list[AssetEvent],
        stopped: StopReason,
        crash: SimulatedCrash | None,
    ) -> HarnessRun:
        names = {asset.name for asset in watched}
        all_events = [e for e in await self.backend.events.alist_events() if e.asset in names]
        state: dict[str, dict[str, Any]] = {}
        for asset in watched:
            entries = await self.backend.alist(AssetScope(name=asset.name))
            state[asset.name] = {entry.key: entry.value for entry in entries}
        watermark = state[watched[0].name].get(self.watermark_key)
        return HarnessRun(trigger, list(events), all_events, state, watermark, stopped, crash)
