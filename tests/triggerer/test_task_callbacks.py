"""A task's ``on_success``, ``on_failure`` and ``on_retry``: called once per recorded outcome
with the run's record and the try's exception; their own failures never change the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import TaskRun
from watchkeeper.triggerer import asset_task
from watchkeeper.triggerer.settings import WorkerSettings
from watchkeeper.triggerer.testing import run_asset_task

ORDERS = Asset("orders")

Call = tuple[str, int, str, str | None]
"""``(callback, try_number, run state, error)`` as a callback saw them."""


def recorder(calls: list[Call], name: str) -> Any:
    def record(run: TaskRun, error: BaseException | None) -> None:
        calls.append((name, run.try_number, run.state, None if error is None else repr(error)))

    return record


class TestCallbacks:
    async def test_success_calls_on_success_with_the_recorded_run(self) -> None:
        calls: list[Call] = []

        @asset_task(
            schedule=[ORDERS],
            on_success=recorder(calls, "success"),
            on_failure=recorder(calls, "failure"),
            on_retry=recorder(calls, "retry"),
        )
        def fine(**_: Any) -> None:
            pass

        result = await run_asset_task(fine, events=[{"n": 1}])
        assert result.run.state == "success"
        assert calls == [("success", 1, "success", None)]

    async def test_a_retried_then_failed_run_calls_on_retry_then_on_failure(self) -> None:
        """Async callbacks; each gets the exception its try raised."""
        calls: list[Call] = []

        async def on_retry(run: TaskRun, error: BaseException | None) -> None:
            await anyio.lowlevel.checkpoint()
            calls.append(("retry", run.try_number, run.state, repr(error)))

        async def on_failure(run: TaskRun, error: BaseException | None) -> None:
            calls.append(("failure", run.try_number, run.state, repr(error)))

        @asset_task(
            schedule=[ORDERS],
            retries=1,
            on_success=recorder(calls, "success"),
            on_failure=on_failure,
            on_retry=on_retry,
        )
        def broken(try_number: int, **_: Any) -> None:
            raise ConnectionError(f"try {try_number}")

        result = await run_asset_task(broken, events=[{"n": 1}])
        assert result.run.state == "failed"
        assert calls == [
            ("retry", 1, "queued", "ConnectionError('try 1')"),
            ("failure", 2, "failed", "ConnectionError('try 2')"),
        ]

    async def test_a_timed_out_try_hands_its_timeout_to_on_failure(self) -> None:
        calls: list[Call] = []

        @asset_task(
            schedule=[ORDERS], execution_timeout=0.05, on_failure=recorder(calls, "failure")
        )
        async def slow(**_: Any) -> None:
            await anyio.sleep(30)

        result = await run_asset_task(slow, events=[{"n": 1}])
        assert result.run.state == "failed"
        ((name, _, state, error),) = calls
        assert (name, state) == ("failure", "failed")
        assert error is not None and error.startswith("TimeoutError(")

    async def test_a_failing_callback_is_logged_and_the_run_stays_as_recorded(
        self, tmp_path: Path
    ) -> None:
        """The callback raises on the first run; that run stays a success, and the next
        event's run is made, run and called back as usual."""
        seen: list[int] = []

        def flaky_pager(run: TaskRun, error: BaseException | None) -> None:
            seen.append(run.id)
            if len(seen) == 1:
                raise RuntimeError("the pager is down")

        @asset_task(schedule=[ORDERS], on_success=flaky_pager)
        def fine(**_: Any) -> None:
            pass

        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            with capture_logs() as logs:
                first = await run_asset_task(fine, events=[{"n": 1}], backend=backend)
                second = await run_asset_task(fine, events=[{"n": 2}], backend=backend)
        assert (first.run.state, second.run.state) == ("success", "success")
        assert seen == [first.run.id, second.run.id]
        (failed,) = [e for e in logs if e["event"] == "task_callback_failed"]
        assert failed["callback"] == "on_success"
        assert failed["run_id"] == first.run.id
        assert "the pager is down" in failed["error"]

    async def test_a_callback_past_callback_timeout_is_cancelled_and_logged(self) -> None:
        @asset_task(schedule=[ORDERS], on_success=_hang)
        def fine(**_: Any) -> None:
            pass

        settings = WorkerSettings(poll_interval=0.01, callback_timeout=0.1)
        with capture_logs() as logs, anyio.fail_after(20):
            result = await run_asset_task(fine, events=[{"n": 1}], settings=settings)
        assert result.run.state == "success"
        (late,) = [e for e in logs if e["event"] == "task_callback_failed"]
        assert "callback_timeout" in late["error"]


async def _hang(run: TaskRun, error: BaseException | None) -> None:
    await anyio.sleep(60)


@pytest.mark.parametrize("which", ["on_success", "on_failure", "on_retry"])
def test_a_callback_that_is_not_callable_is_refused(which: str) -> None:
    with pytest.raises(TypeError, match=f"{which} must be a function, got int"):
        callbacks: dict[str, Any] = {which: 3}
        asset_task(schedule=[ORDERS], **callbacks)


class TestRetryOn:
    async def test_an_error_retry_on_does_not_name_fails_the_run_at_once(self) -> None:
        tries: list[int] = []

        @asset_task(schedule=[ORDERS], retries=5, retry_on=ConnectionError)
        def strict(try_number: int, **_: Any) -> None:
            tries.append(try_number)
            raise ValueError("bad row 7")

        result = await run_asset_task(strict, events=[{"n": 1}])
        assert (result.run.state, tries) == ("failed", [1])
        (error,) = result.run.errors
        assert (error.error, error.final) == ("ValueError: bad row 7", True)

    async def test_an_error_retry_on_names_is_retried_with_its_subclasses(self) -> None:
        tries: list[int] = []

        @asset_task(schedule=[ORDERS], retries=2, retry_on=[OSError])
        def flaky(try_number: int, **_: Any) -> None:
            tries.append(try_number)
            if try_number < 3:
                raise ConnectionResetError("the warehouse hung up")  # an OSError

        result = await run_asset_task(flaky, events=[{"n": 1}])
        assert (result.run.state, tries) == ("success", [1, 2, 3])

    @pytest.mark.parametrize("bad", [[], [int], "ValueError"])
    def test_retry_on_is_checked(self, bad: Any) -> None:
        with pytest.raises((TypeError, ValueError), match="retry_on"):
            asset_task(schedule=[ORDERS], retry_on=bad)
