"""``run_trigger``: run one trigger instance through the real runtime, once, and see what it did.

It is the supervisor's own :func:`~watchkeeper.triggerer.runtime._supervisor.drive_trigger` (the same
binding of ``asset_state_store``, the same validation and commit of each event before the
generator resumes, the same awaited ``cleanup()``), minus the restart loop: a test wants to see
its trigger's exception, not a backoff.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import greenback
import structlog
from watchkeeper.store import Asset, AssetEvent, BaseStateBackend

from ..runtime import TriggerSlot, drive_trigger
from ..trigger import BaseEventTrigger

__all__ = ["run_trigger", "watcher_name_for"]

_CLEANUP_TIMEOUT = 5.0


def watcher_name_for(trigger: BaseEventTrigger, watcher_name: object) -> str:
    """``watcher_name`` checked, or the default when it is None: the trigger's class name."""
    if watcher_name is None:
        return type(trigger).__name__
    if not isinstance(watcher_name, str):
        raise TypeError(f"watcher_name must be a str or None, got {type(watcher_name).__name__}")
    if not watcher_name:
        raise ValueError("watcher_name must not be empty")
    return watcher_name


async def run_trigger(
    trigger: BaseEventTrigger,
    *,
    assets: Asset | Sequence[Asset],
    backend: BaseStateBackend,
    max_events: int | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 - the documented API of the test kit
    trigger_id: str | None = None,
    watcher_name: str | None = None,
) -> list[AssetEvent]:
    """Run ``trigger`` once through the runtime and return the asset events it committed.

    The assets are registered first. The run stops after ``max_events`` committed asset
    events, when ``run()`` returns, or after ``timeout`` seconds, returning what was committed
    by then. Upon ``max_events`` the generator is closed at its ``yield``, as when breaking
    out of ``async for``. ``cleanup()`` is always awaited.

    :param trigger: the trigger instance to run.
    :param assets: the asset or assets it watches.
    :param backend: an open backend the events and state are committed to.
    :param max_events: stop after this many committed asset events (one trigger event commits
        one per watched asset; a suppressed duplicate commits none; a
        :class:`~watchkeeper.triggerer.TriggerEventBatch` commits whole, so the run stops
        after the batch that reached ``max_events`` and returns all of it); None: no limit.
    :param timeout: stop after this many seconds; None: no limit.
    :param trigger_id: names the watcher in the events (default: the trigger's classpath).
    :param watcher_name: bound as ``self.watcher_name`` in ``run()``, as the daemon binds the
        :class:`~watchkeeper.triggerer.AssetWatcher`'s name (default: the class name).
    :returns: the asset events this call committed, in commit order.
    :raises TypeError: ``trigger`` is not a trigger instance, or ``assets`` no asset.
    :raises ValueError: ``max_events``, ``timeout`` or ``watcher_name`` out of range.
    :raises Exception: what ``run()`` raised (or validating an event it yielded, or
        ``cleanup()``), so a test sees its bug.
    """
    watched = _checked_arguments(trigger, assets, max_events, timeout)
    name = watcher_name_for(trigger, watcher_name)
    slot = TriggerSlot(trigger_id or type(trigger).classpath(), trigger, watched, (name,))
    await backend.events.aregister_assets(watched)

    committed: list[AssetEvent] = []
    failure: list[Exception] = []

    async def drive() -> None:
        # A task of its own: the greenback portal and the bound log context stay in it, not
        # in the caller's task.
        with structlog.contextvars.bound_contextvars(
            trigger_id=slot.trigger_id, assets=list(slot.asset_names)
        ):
            try:
                await greenback.ensure_portal()
                with anyio.move_on_after(timeout):
                    await drive_trigger(
                        slot,
                        backend,
                        cleanup_timeout=_CLEANUP_TIMEOUT,
                        publish=committed.extend,
                        max_events=max_events,
                    )
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group
                failure.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive, name=f"run_trigger {slot.trigger_id}")
    if failure:
        raise failure[0]
    if slot.cleanup_error is not None:
        raise slot.cleanup_error
    return committed


def _checked_arguments(
    trigger: BaseEventTrigger,
    assets: Asset | Sequence[Asset],
    max_events: int | None,
    timeout: float | None,
) -> tuple[Asset, ...]:
    """The watched assets as a tuple, once every argument of :func:`run_trigger` is valid."""
    if not isinstance(trigger, BaseEventTrigger):
        raise TypeError(
            f"run_trigger() runs a BaseEventTrigger instance, got {type(trigger).__name__}"
        )
    watched = (assets,) if isinstance(assets, Asset) else tuple(assets)
    if not watched or not all(isinstance(asset, Asset) for asset in watched):
        raise TypeError(
            f"assets must be one Asset or a non-empty sequence of Assets, got {assets!r}"
        )
    if max_events is not None and (
        not isinstance(max_events, int) or isinstance(max_events, bool) or max_events < 1
    ):
        raise ValueError(f"max_events must be a positive int or None, got {max_events!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive or None, got {timeout!r}")
    return watched
