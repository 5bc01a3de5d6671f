"""Scopes and checks shared by the contract modules (``test_contract*.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from watchkeeper.store import Asset, AssetScope, StateScope, TaskScope
from watchkeeper.store.protocols import BaseStateBackend

TASK = TaskScope("dag", "run_1", "task")
TASK_MAP_0 = TaskScope("dag", "run_1", "task", 0)
TASK_MAP_1 = TaskScope("dag", "run_1", "task", 1)
OTHER_RUN = TaskScope("dag", "run_2", "task")
OTHER_TASK = TaskScope("dag", "run_1", "other")
ORDERS = Asset("orders", uri="s3://data/orders")
INVOICES = Asset("invoices")
ORDERS_SCOPE = AssetScope(name="orders")
INVOICES_SCOPE = AssetScope(name="invoices")
ALL_SCOPES: tuple[StateScope, ...] = (
    TASK,
    TASK_MAP_0,
    TASK_MAP_1,
    OTHER_RUN,
    OTHER_TASK,
    ORDERS_SCOPE,
    INVOICES_SCOPE,
)
SCOPES: tuple[StateScope, ...] = (TASK, ORDERS_SCOPE)


async def snapshot(store: BaseStateBackend) -> tuple[object, ...]:
    """Every scope's entries and the event log: what a rejected call must leave unchanged."""
    return (*[await store.alist(scope) for scope in ALL_SCOPES], await store.events.alist_events())


async def assert_rejected(
    store: BaseStateBackend,
    error: type[BaseException],
    method: Callable[..., Awaitable[object]],
    *args: object,
    says: tuple[str, ...] = (),
    **kwargs: object,
) -> BaseException:
    """``method(*args, **kwargs)`` raises ``error``, its message holding ``says``, and changes
    nothing."""
    before = await snapshot(store)
    with pytest.raises(error) as info:
        await method(*args, **kwargs)
    for fragment in says:
        assert fragment in str(info.value)
    assert await snapshot(store) == before
    return info.value
