"""``asset_task`` and ``AnyOf``: tasks declared beside the watchers, run on their assets' events.

A definition file declares a task with the decorator; ``watchkeeper worker`` runs it::

    @asset_task(schedule=[orders], outlets=[report], retries=3)
    def build_report(*, triggering_asset_events, task_state_store, **context): ...

``schedule=[a, b]`` runs the task once every listed asset has a new event since its last run
(Airflow's rule); ``schedule=AnyOf(a, b)`` once any has. The context is
:func:`~watchkeeper.store.build_task_context`'s plus ``triggering_asset_events`` (each
scheduled :class:`Asset` to the run's events on it, in commit order), ``run_id`` (the run's
id, as text), ``try_number`` and ``outlet_events`` (set ``outlet_events[asset].extra = {...}``
to give an outlet's event its payload).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from watchkeeper.store import Asset
from watchkeeper.store.protocols import TaskRun, TaskSpec

__all__ = [
    "AnyOf",
    "AssetTask",
    "OutletEventAccessor",
    "OutletEvents",
    "RunCallback",
    "asset_task",
]

RunCallback = Callable[[TaskRun, BaseException | None], Any]
"""``callback(run, error)``: a run's record as it was just recorded and the exception of the
try (None on success); a plain function or a coroutine function."""


class AnyOf:
    """A schedule that runs its task when any of ``assets`` has a new event.

    :param assets: the assets (at least one).
    :raises TypeError: an argument that is not an :class:`Asset`.
    :raises ValueError: no asset.
    """

    __slots__ = ("assets",)

    def __init__(self, *assets: Asset) -> None:
        if not assets:
            raise ValueError("AnyOf needs at least one Asset")
        for asset in assets:
            if not isinstance(asset, Asset):
                raise TypeError(f"AnyOf takes Asset objects, got {type(asset).__name__}")
        self.assets: tuple[Asset, ...] = assets

    def __repr__(self) -> str:
        return f"AnyOf({', '.join(repr(a.name) for a in self.assets)})"


def _assets(what: str, items: Iterable[Any] | Asset) -> tuple[Asset, ...]:
    if isinstance(items, Asset):
        return (items,)
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise TypeError(f"{what} must be a list of Asset objects, got {type(items).__name__}")
    found = tuple(items)
    for item in found:
        if not isinstance(item, Asset):
            raise TypeError(f"{what} must hold Asset objects, got {type(item).__name__}")
    return found


def _exception_types(
    value: Iterable[type[BaseException]] | type[BaseException] | None,
) -> tuple[type[BaseException], ...] | None:
    if value is None:
        return None
    found = (value,) if isinstance(value, type) else tuple(value)
    for item in found:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"retry_on must hold exception types, got {item!r}")
    if not found:
        raise ValueError("retry_on must name at least one exception type (or be None)")
    return found


def _seconds(what: str, value: timedelta | float | None, *, optional: bool) -> timedelta | None:
    if value is None and optional:
        return None
    if isinstance(value, timedelta):
        span = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        span = timedelta(seconds=value)
    else:
        raise TypeError(f"{what} must be a timedelta or seconds, got {type(value).__name__}")
    if span < timedelta(0) or (optional and span == timedelta(0)):
        raise ValueError(f"{what} must be positive, got {value!r}")
    return span


def _window(value: timedelta | float) -> float:
    """``batch_window`` in seconds: a timedelta or a number, finite and >= 0."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"batch_window must be a timedelta or seconds, got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"batch_window must be a finite number of seconds >= 0, got {value!r}")
    return seconds


@dataclass(frozen=True, slots=True, eq=False)
class AssetTask:
    """A task function with its schedule, outlets and retry policy.

    Made by :func:`asset_task`, whose parameters its fields hold (``mode`` is ``"all"`` for a
    list schedule, ``"any"`` for :class:`AnyOf`); calling it calls the function.
    """

    fn: Callable[..., Any]
    name: str
    schedule: tuple[Asset, ...]
    mode: Literal["all", "any"]
    outlets: tuple[Asset, ...] = ()
    inlets: tuple[Asset, ...] = ()
    retries: int = 0
    retry_delay: timedelta = timedelta(seconds=1)
    max_retry_delay: timedelta = timedelta(minutes=5)
    execution_timeout: timedelta | None = None
    clear_on_success: bool = False
    max_events_per_run: int = 100
    is_async: bool = field(default=False)
    on_success: RunCallback | None = None
    on_failure: RunCallback | None = None
    on_retry: RunCallback | None = None
    isolation: Literal["none", "process"] | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    batch_window: float = 0.0
    max_active_runs: int | None = None

    def retries_on(self, exc: BaseException) -> bool:
        """Whether a try that raised ``exc`` may be retried (``retry_on`` names its type, or
        there is no ``retry_on``). An error from a child process matches by its type's and its
        bases' qualified names."""
        if self.retry_on is None:
            return True
        names = getattr(exc, "type_names", None)
        if names is not None:
            return any(f"{t.__module__}.{t.__qualname__}" in names for t in self.retry_on)
        return isinstance(exc, self.retry_on)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def spec(self) -> TaskSpec:
        """What the store keeps of this task."""
        return TaskSpec(
            self.name,
            tuple(a.name for a in self.schedule),
            self.mode,
            self.max_events_per_run,
            self.retries + 1,
            self.batch_window,
            self.max_active_runs,
        )

    @property
    def assets(self) -> tuple[Asset, ...]:
        """Every asset the task declares (schedule, inlets, outlets), each once."""
        found: list[Asset] = []
        for asset in (*self.schedule, *self.inlets, *self.outlets):
            if not any(asset.matches(seen) for seen in found):
                found.append(asset)
        return tuple(found)

    def describe_schedule(self) -> str:
        names = ", ".join(a.name for a in self.schedule)
        return f"AnyOf({names})" if self.mode == "any" else f"[{names}]"


def asset_task(
    *,
    schedule: Iterable[Asset] | AnyOf,
    outlets: Iterable[Asset] = (),
    inlets: Iterable[Asset] = (),
    retries: int = 0,
    retry_delay: timedelta | float = timedelta(seconds=1),
    execution_timeout: timedelta | float | None = None,
    clear_on_success: bool = False,
    max_events_per_run: int = 100,
    name: str | None = None,
    on_success: RunCallback | None = None,
    on_failure: RunCallback | None = None,
    on_retry: RunCallback | None = None,
    isolation: Literal["none", "process"] | None = None,
    retry_on: Iterable[type[BaseException]] | type[BaseException] | None = None,
    batch_window: timedelta | float = 0.0,
    max_active_runs: int | None = None,
) -> Callable[[Callable[..., Any]], AssetTask]:
    """Declare the decorated function as a task run on its schedule's asset events.

    :param schedule: the assets whose events start a run: a list (a run once every one has a
        new event since the last run) or :class:`AnyOf` (once any has).
    :param outlets: assets the task produces: each successful run commits one event on each,
        with the payload set through ``outlet_events[asset].extra``.
    :param inlets: assets the task reads without being scheduled on them (their state is
        readable through ``asset_state_store``).
    :param retries: tries after the first failed one.
    :param retry_delay: the delay before the first retry (a timedelta or seconds), doubled
        after each further failure, varied by ±20 % and capped at 5 minutes.
    :param execution_timeout: the longest a try may run (None: no limit); an async try is
        cancelled, a sync one abandoned (its thread cannot be interrupted), and the try
        counts as a failure.
    :param clear_on_success: delete the run's task state once it succeeds.
    :param max_events_per_run: the most events of each scheduled asset one run receives.
    :param name: the task's name (default: the function's).
    :param on_success: called as ``on_success(run, None)`` once a run succeeded (recorded).
    :param on_failure: called as ``on_failure(run, error)`` once a run failed for good: its
        last try's exception (or ``TimeoutError`` past ``execution_timeout``).
    :param on_retry: called as ``on_retry(run, error)`` after a failed try that will be tried
        again. Each callback may be sync (run in a worker thread) or async, runs after the
        outcome is recorded, within ``[worker] callback_timeout``; its own failure is logged
        (``task_callback_failed``) and never changes the run.
    :param isolation: where each try runs: ``"none"`` in the worker's process, ``"process"``
        in a child process of the worker's pool (a crash, ``os._exit`` or a leak of the task
        ends only that child; ``execution_timeout`` kills it); None: ``[worker] isolation``.
    :param retry_on: the exception types worth retrying (their subclasses too): a try that
        fails with another error fails the run at once, whatever ``retries`` says. A try past
        ``execution_timeout`` raises ``TimeoutError``; a child process that died matches
        nothing. None (the default): every error is retried while tries remain.
    :param batch_window: how long (a timedelta or seconds, finite, >= 0) a run waits for
        more events after the first pending one, unless ``max_events_per_run`` are pending
        already; 0 (the default): a run as soon as there are events.
    :param max_active_runs: the most runs of the task running at once across every worker
        (an int >= 1); None (the default): no limit.
    :returns: the decorator, which turns the function into an :class:`AssetTask`.
    :raises TypeError: a parameter of the wrong type (naming it).
    :raises ValueError: a parameter out of its bounds (naming it).
    """
    if isinstance(schedule, AnyOf):
        scheduled, mode = schedule.assets, "any"
    else:
        scheduled, mode = _assets("schedule", schedule), "all"
    if not scheduled:
        raise ValueError("schedule must name at least one Asset")
    if type(retries) is not int or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if type(max_events_per_run) is not int or max_events_per_run < 1:
        raise ValueError(f"max_events_per_run must be an int >= 1, got {max_events_per_run!r}")
    window = _window(batch_window)
    if max_active_runs is not None and (type(max_active_runs) is not int or max_active_runs < 1):
        raise ValueError(f"max_active_runs must be an int >= 1 or None, got {max_active_runs!r}")
    for what, callback in (
        ("on_success", on_success),
        ("on_failure", on_failure),
        ("on_retry", on_retry),
    ):
        if callback is not None and not callable(callback):
            raise TypeError(f"{what} must be a function, got {type(callback).__name__}")
    retried = _exception_types(retry_on)
    if isolation not in (None, "none", "process"):
        raise ValueError(f"isolation must be 'none' or 'process', got {isolation!r}")
    delay = _seconds("retry_delay", retry_delay, optional=False)
    timeout = _seconds("execution_timeout", execution_timeout, optional=True)
    out, into = _assets("outlets", outlets), _assets("inlets", inlets)

    def decorate(fn: Callable[..., Any]) -> AssetTask:
        if not callable(fn):
            raise TypeError(f"asset_task decorates a function, got {type(fn).__name__}")
        task_name = name if name is not None else getattr(fn, "__name__", "")
        if not isinstance(task_name, str) or not task_name:
            raise ValueError(f"a task needs a non-empty name, got {task_name!r}")
        assert delay is not None
        return AssetTask(
            fn=fn,
            name=task_name,
            schedule=tuple(scheduled),
            mode=mode,  # type: ignore[arg-type]
            outlets=out,
            inlets=into,
            retries=retries,
            retry_delay=delay,
            execution_timeout=timeout,
            clear_on_success=bool(clear_on_success),
            max_events_per_run=max_events_per_run,
            is_async=inspect.iscoroutinefunction(fn),
            on_success=on_success,
            on_failure=on_failure,
            on_retry=on_retry,
            isolation=isolation,
            retry_on=retried,
            batch_window=window,
            max_active_runs=max_active_runs,
        )

    return decorate


class OutletEventAccessor:
    """The event a successful run emits on one outlet: set ``extra`` to give it a payload.

    :param asset: the outlet.
    """

    __slots__ = ("asset", "extra")

    def __init__(self, asset: Asset) -> None:
        self.asset = asset
        self.extra: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"<OutletEventAccessor asset={self.asset.name!r} extra={self.extra!r}>"


class OutletEvents(Mapping[Asset | str, OutletEventAccessor]):
    """``context["outlet_events"]``: one accessor per outlet, looked up by Asset or by name.

    :param outlets: the task's outlets.
    """

    def __init__(self, outlets: Iterable[Asset]) -> None:
        self._by_name = {a.name: OutletEventAccessor(a) for a in outlets}

    def __getitem__(self, key: Asset | str) -> OutletEventAccessor:
        name = key.name if isinstance(key, Asset) else key
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not an outlet of this task; declare it in outlets=[...]"
            ) from None

    def __iter__(self) -> Any:
        return iter(a.asset for a in self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)
