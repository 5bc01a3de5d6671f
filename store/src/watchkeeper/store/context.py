"""The task side: the ``context`` one task instance try receives, and ``run_task`` on top of it.

A task runner calls :func:`build_task_context` for each try and passes the result to the task
as keyword arguments (``def my_task(**context)``). The rules (DESIGN.md, "Context rules"):

- ``context["task_state_store"]`` (alias ``"task_store"``) is always there, bound to the task
  instance ``dag_id/run_id/task_id[map_index]``; retries of a run share it, a new run starts
  empty.
- ``context["asset_state_store"]`` (alias ``"asset_store"``) is there only when the task
  declares at least one concrete :class:`Asset` in ``inlets`` or ``outlets`` (outlets alone are
  enough); otherwise reading it raises ``KeyError`` saying how to get it.

:func:`run_task` is the smallest runner: it registers the declared assets, builds the context
per try, runs the task (a sync one in a worker thread, an async one on the loop with a
greenback portal, so its sync store calls work), retries, and applies ``clear_on_success``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

import anyio.to_thread
import greenback

from ._backend import BaseStateBackend
from ._log import get_logger
from ._types import Asset, TaskScope, Writer
from .accessors import AssetStateStoreAccessors, TaskStateStoreAccessor
from .errors import ArgumentTypeError, ContextKeyError, InvalidArgumentError

__all__ = ["build_task_context", "declared_assets", "run_task"]

log = get_logger(__name__)

_ASSET_KEYS = frozenset({"asset_state_store", "asset_store"})


class _TaskContext(dict[str, Any]):
    """The context of one try; a missing asset store gets an explanation, not a bare key."""

    __slots__ = ("_task",)

    def __init__(self, task: str, items: dict[str, Any]) -> None:
        super().__init__(items)
        self._task = task

    def __missing__(self, key: str) -> Any:
        if key in _ASSET_KEYS:
            raise ContextKeyError(
                key,
                f"is not available in task {self._task}: it declares no concrete Asset; "
                "declare the asset in the task's inlets or outlets",
            )
        raise ContextKeyError(key)


def _as_tuple(what: str, items: Iterable[Any] | Asset) -> tuple[Any, ...]:
    if isinstance(items, Asset):
        return (items,)
    if isinstance(items, str | bytes):
        raise ArgumentTypeError(what, items, "a list of assets")
    return tuple(items)


def declared_assets(inlets: Iterable[Any] = (), outlets: Iterable[Any] = ()) -> tuple[Asset, ...]:
    """The concrete assets among ``inlets`` and ``outlets``, each once, in declaration order.

    Anything that is not an :class:`Asset` (an alias, a lineage object) is not concrete and is
    skipped. An asset declared twice (the same name, or the same URI) counts once.
    """
    found: list[Asset] = []
    for item in (*_as_tuple("inlets", inlets), *_as_tuple("outlets", outlets)):
        if isinstance(item, Asset) and not any(item.matches(seen) for seen in found):
            found.append(item)
    return tuple(found)


def _check_try_number(try_number: object) -> int:
    if type(try_number) is not int:
        raise ArgumentTypeError("try_number", try_number, "an int")
    if try_number < 1:
        raise InvalidArgumentError("try_number", try_number, "must be >= 1")
    return try_number


def build_task_context(
    backend: BaseStateBackend,
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int = -1,
    try_number: int = 1,
    inlets: Iterable[Any] = (),
    outlets: Iterable[Any] = (),
    worker_backend: BaseStateBackend | None = None,
) -> dict[str, Any]:
    """Return the ``context`` of one try of one task instance; does no I/O.

    Every accessor writes as ``Writer("task", "<dag>/<run>/<task>[<map>]", try_number)``. With
    ``worker_backend`` (``[workers] state_backend``) the accessors offload values through its
    ``serialize_*_to_ref``/``deserialize_*_from_ref`` hooks.
    """
    if not isinstance(backend, BaseStateBackend):
        raise ArgumentTypeError("backend", backend, "a BaseStateBackend")
    if worker_backend is not None and not isinstance(worker_backend, BaseStateBackend):
        raise ArgumentTypeError("worker_backend", worker_backend, "a BaseStateBackend")
    scope = TaskScope(dag_id, run_id, task_id, map_index)
    writer = Writer("task", str(scope), _check_try_number(try_number))
    inlets, outlets = _as_tuple("inlets", inlets), _as_tuple("outlets", outlets)
    task_store = TaskStateStoreAccessor(
        backend, scope, writer=writer, worker_backend=worker_backend
    )
    items: dict[str, Any] = {
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "map_index": map_index,
        "try_number": try_number,
        "inlets": inlets,
        "outlets": outlets,
        "task_state_store": task_store,
        "task_store": task_store,
    }
    assets = declared_assets(inlets, outlets)
    if assets:
        asset_store = AssetStateStoreAccessors(
            backend, assets, writer=writer, worker_backend=worker_backend
        )
        items["asset_state_store"] = items["asset_store"] = asset_store
    return _TaskContext(str(scope), items)


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _call(fn: Callable[..., Any], context: dict[str, Any]) -> Any:
    """Await an async ``fn`` on the loop (with a portal), or run a sync one in a thread."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        return await greenback.with_portal_run(fn, **context)
    result = await anyio.to_thread.run_sync(partial(fn, **context))
    if inspect.isawaitable(result):
        return await greenback.with_portal_run(_await, result)
    return result


async def run_task(
    fn: Callable[..., Any],
    *,
    backend: BaseStateBackend,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int = -1,
    inlets: Iterable[Any] = (),
    outlets: Iterable[Any] = (),
    retries: int = 0,
    clear_on_success: bool = False,
    worker_backend: BaseStateBackend | None = None,
    register_assets: bool = True,
) -> Any:
    """Run ``fn(**context)`` as one task instance and return what it returns.

    The declared assets are registered first (as a DAG parser would) unless
    ``register_assets`` is false. A try that raises is retried with the next ``try_number``, up
    to ``retries`` times; each retry sees what the failed tries wrote, and the last error is
    re-raised. Cancellation is never retried. On success ``clear_on_success`` clears this task
    instance's state (this map index only); asset state is never touched.
    """
    if type(retries) is not int or retries < 0:
        raise InvalidArgumentError("retries", retries, "must be an int >= 0")
    scope = TaskScope(dag_id, run_id, task_id, map_index)
    inlets, outlets = _as_tuple("inlets", inlets), _as_tuple("outlets", outlets)
    assets = declared_assets(inlets, outlets)
    if register_assets and assets:
        await backend.events.aregister_assets(assets)
    try_number = 1
    while True:
        context = build_task_context(
            backend,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            try_number=try_number,
            inlets=inlets,
            outlets=outlets,
            worker_backend=worker_backend,
        )
        try:
            result = await _call(fn, context)
        except Exception as exc:
            if try_number > retries:
                log.warning("task_failed", task=str(scope), try_number=try_number, error=repr(exc))
                raise
            log.info("task_try_failed", task=str(scope), try_number=try_number, error=repr(exc))
            try_number += 1
            continue
        if clear_on_success:
            await backend.aclear(scope)
        log.debug("task_succeeded", task=str(scope), try_number=try_number)
        return result
