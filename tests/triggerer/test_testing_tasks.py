"""``run_asset_task``: a task run on given events exactly as the worker runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from watchkeeper.store import Asset, AssetScope, SqliteStateBackend
from watchkeeper.triggerer import AnyOf, asset_task
from watchkeeper.triggerer.testing import run_asset_task

ORDERS = Asset("orders")
REFUNDS = Asset("refunds")
TOTALS = Asset("totals")


@asset_task(schedule=[ORDERS], outlets=[TOTALS])
def total(*, triggering_asset_events: Any, outlet_events: Any, **context: Any) -> None:
    amounts = [e.payload["amount"] for e in triggering_asset_events[ORDERS]]
    outlet_events[TOTALS].extra = {"sum": sum(amounts), "try": context["try_number"]}
    context["asset_state_store"][TOTALS].set("last_sum", sum(amounts))


class TestRunAssetTask:
    async def test_one_run_with_its_outlet_event(self) -> None:
        """The events make one run; its outlet event carries what the task set."""
        result = await run_asset_task(total, events=[{"amount": 3}, {"amount": 4}])
        assert (result.run.state, result.run.event_count) == ("success", 2)
        (emitted,) = result.outlet(TOTALS)
        assert emitted.payload == {"sum": 7, "try": 1}
        assert emitted.watcher == "task:total"

    async def test_on_a_backend_of_the_test_which_keeps_what_the_task_wrote(
        self, tmp_path: Path
    ) -> None:
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            result = await run_asset_task(total, events=[{"amount": 5}], backend=backend)
            assert await backend.aget(AssetScope(name="totals"), "last_sum") == 5
            again = await run_asset_task(total, events=[{"amount": 1}], backend=backend)
        assert [r.id for r in again.runs] != [r.id for r in result.runs]
        assert [e.payload["sum"] for e in again.outlet_events] == [1]

    async def test_a_failing_try_is_retried_as_the_worker_retries_it(self) -> None:
        """The first try fails with the task's error and counts; the second succeeds, at once
        (retry_delay is zero here unless the test asks for the task's own)."""
        tries: list[int] = []

        @asset_task(schedule=[ORDERS], retries=1, retry_delay=60)
        def flaky(**context: Any) -> None:
            tries.append(context["try_number"])
            if len(tries) == 1:
                raise ConnectionError("the warehouse hung up")

        with anyio.fail_after(20):
            result = await run_asset_task(flaky, events=[{"amount": 1}])
        run = result.run
        assert (run.state, run.try_number, tries) == ("success", 2, [1, 2])
        (error,) = run.errors
        assert error.cause == "task_error" and "the warehouse hung up" in error.error

    async def test_a_task_that_keeps_failing_fails_for_good(self) -> None:
        @asset_task(schedule=[ORDERS], retries=2)
        def broken(**_: Any) -> None:
            raise ValueError("a bad order")

        run = (await run_asset_task(broken, events=[{"amount": 1}])).run
        assert (run.state, run.try_number, len(run.errors)) == ("failed", 3, 3)

    async def test_an_any_of_schedule_takes_events_per_asset(self) -> None:
        seen: list[str] = []

        @asset_task(schedule=AnyOf(ORDERS, REFUNDS), max_events_per_run=1)
        def either(*, triggering_asset_events: Any, **_: Any) -> None:
            seen.extend(a.name for a, events in triggering_asset_events.items() if events)

        result = await run_asset_task(
            either, events={ORDERS: [{"amount": 1}], "refunds": [{"amount": -1}]}
        )
        assert len(result.runs) == 2 and sorted(seen) == ["orders", "refunds"]

    async def test_a_run_that_never_finishes_is_a_timeout(self) -> None:
        @asset_task(schedule=[ORDERS])
        async def stuck(**_: Any) -> None:
            await anyio.sleep_forever()

        with pytest.raises(
            TimeoutError, match=r"'stuck' did not finish within 0.5 s \(its runs: #\d+ running\)"
        ):
            await run_asset_task(stuck, events=[{"amount": 1}], timeout=0.5)

    @pytest.mark.parametrize(
        ("task", "events", "error", "match"),
        [
            (total, [], ValueError, "events is empty"),
            (total, {"refunds": [1]}, ValueError, "does not schedule asset 'refunds'"),
            (total, "abc", TypeError, "sequence of payloads"),
            (total.fn, [1], TypeError, "needs an @asset_task function"),
        ],
        ids=["empty", "unscheduled asset", "a string", "a plain function"],
    )
    async def test_bad_arguments_are_clear_errors(
        self, task: Any, events: Any, error: type[Exception], match: str
    ) -> None:
        with pytest.raises(error, match=match):
            await run_asset_task(task, events=events)

    async def test_several_assets_need_events_per_asset(self) -> None:
        @asset_task(schedule=[ORDERS, REFUNDS])
        def both(**_: Any) -> None:
            pass

        with pytest.raises(ValueError, match="schedules 2 assets"):
            await run_asset_task(both, events=[{"amount": 1}])
