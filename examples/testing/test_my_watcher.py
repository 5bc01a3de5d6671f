"""Tests of ``OrdersWatcher`` written with watchkeeper's test kit (the README's example).

The ``wk_backend``, ``wk_source`` and ``wk_harness`` fixtures come from the kit's pytest plugin,
which installing watchkeeper-triggerer registers. Run with ``pytest examples/testing``.
"""

from __future__ import annotations

import pytest
from my_watcher import OrdersWatcher
from watchkeeper.store import Asset, BaseStateBackend
from watchkeeper.triggerer.testing import (
    CrashPoint,
    FakeEventSource,
    SourceUnavailableError,
    WatcherHarness,
    run_trigger,
)

pytestmark = pytest.mark.anyio

ORDERS = Asset("orders")


@pytest.fixture
def anyio_backend() -> str:
    """The store's drivers (aiosqlite, asyncpg) need asyncio."""
    return "asyncio"


@pytest.mark.parametrize("wk_backend", ["memory", "sqlite"], indirect=True)
class TestOrdersWatcher:
    async def test_each_order_becomes_one_event(
        self, wk_backend: BaseStateBackend, wk_source: FakeEventSource
    ) -> None:
        """Each published order is one asset event, and the watermark is the last order's."""
        await wk_source.publish("o-1", "o-2", "o-3")
        watcher = OrdersWatcher(wk_source.address)
        events = await run_trigger(watcher, assets=ORDERS, backend=wk_backend, max_events=3)
        assert [event.payload["order"] for event in events] == ["o-1", "o-2", "o-3"]
        assert await wk_backend.aget(ORDERS.scope, "watermark") == 3

    async def test_a_restart_resumes_from_the_watermark(
        self, wk_harness: WatcherHarness, wk_source: FakeEventSource
    ) -> None:
        """A new instance rebuilt from serialize() goes on after the last committed order."""
        watcher = OrdersWatcher(wk_source.address)
        await wk_source.publish("o-1", "o-2")
        first = await wk_harness.run(watcher, assets=ORDERS, max_events=2)
        await wk_source.publish("o-3")
        second = await wk_harness.restart(watcher, assets=ORDERS, max_events=1)
        assert [p["seq"] for p in first.payloads] == [1, 2]
        assert [p["seq"] for p in second.payloads] == [3]
        assert second.watermark == 3

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_loses_and_duplicates_nothing(
        self, wk_harness: WatcherHarness, wk_source: FakeEventSource, point: CrashPoint
    ) -> None:
        """Killed at any point of its third order, the restarted watcher emits each order once."""
        watcher = OrdersWatcher(wk_source.address)
        await wk_source.publish(*[f"o-{n}" for n in range(1, 6)])
        crashed = await wk_harness.crash(watcher, assets=ORDERS, at=point, event=3)
        rest = 5 - len(crashed.all_events)  # a repeated order would take the place of the 5th
        after = await wk_harness.restart(watcher, assets=ORDERS, max_events=rest)
        assert [p["seq"] for p in after.all_payloads] == [1, 2, 3, 4, 5]
        assert after.watermark == 5

    async def test_repeated_and_reordered_items_are_emitted_once_in_order(
        self, wk_harness: WatcherHarness, wk_source: FakeEventSource
    ) -> None:
        """A feed that repeats items and answers out of order still yields 1..5 once each."""
        await wk_source.publish(*[f"o-{n}" for n in range(1, 6)])
        await wk_source.duplicate(2)
        await wk_source.reorder(3)
        result = await wk_harness.run(OrdersWatcher(wk_source.address), assets=ORDERS, max_events=5)
        assert [p["seq"] for p in result.payloads] == [1, 2, 3, 4, 5]

    async def test_a_feed_failure_is_raised_and_the_next_run_resumes(
        self, wk_harness: WatcherHarness, wk_source: FakeEventSource
    ) -> None:
        """A feed error ends run() (the daemon restarts it with backoff); nothing is lost."""
        watcher = OrdersWatcher(wk_source.address)
        await wk_source.publish("o-1")
        await wk_harness.run(watcher, assets=ORDERS, max_events=1)
        await wk_source.publish("o-2")
        await wk_source.fail("feed is down")
        with pytest.raises(SourceUnavailableError, match="feed is down"):
            await wk_harness.restart(watcher, assets=ORDERS)
        after = await wk_harness.restart(watcher, assets=ORDERS, max_events=1)
        assert [p["seq"] for p in after.all_payloads] == [1, 2]
