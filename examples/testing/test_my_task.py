"""Tests of ``total_orders`` written with watchkeeper's test kit (the README's example).

``run_asset_task`` commits the given events and runs the task on them as a worker does (the
same context, outlets and retries), then returns its runs and the events it emitted.
"""

from __future__ import annotations

import pytest
from my_task import order_totals, total_orders
from watchkeeper.store import BaseStateBackend
from watchkeeper.triggerer.testing import run_asset_task

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The store's drivers (aiosqlite, asyncpg) need asyncio."""
    return "asyncio"


@pytest.mark.parametrize("wk_backend", ["memory", "sqlite"], indirect=True)
class TestTotalOrders:
    async def test_a_run_emits_the_total(self, wk_backend: BaseStateBackend) -> None:
        """The orders of one run are summed into one event on the outlet."""
        result = await run_asset_task(
            total_orders, events=[{"amount": 5}, {"amount": 7}], backend=wk_backend
        )
        assert result.run.state == "success"
        [total] = result.outlet(order_totals)
        assert total.payload == {"orders": 2, "total": 12}
        assert await wk_backend.aget(order_totals.scope, "last_total") == 12

    async def test_a_bad_order_fails_after_its_retries(self, wk_backend: BaseStateBackend) -> None:
        """A negative amount fails each of the three tries and emits nothing."""
        result = await run_asset_task(total_orders, events=[{"amount": -1}], backend=wk_backend)
        assert (result.run.state, result.run.try_number) == ("failed", 3)
        assert "negative amount" in result.run.errors[-1].error
        assert result.outlet_events == []
