"""The worker runtime in-process: schedules, context, outlets, retries, timeouts, fencing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest
from watchkeeper.store import (
    AssetEvent,
)
from watchkeeper.store.protocols import (
    BaseStateBackend,
    EventCommit,
    TaskRun,
    encode_json,
)
from watchkeeper.triggerer import AnyOf, Asset, Worker, WorkerSettings, asset_task
from watchkeeper.triggerer.worker._context import retry_delay_for

A = Asset("a")
B = Asset("b")
OUT = Asset("out")
FAST = WorkerSettings(concurrency=4, poll_interval=0.01, heartbeat_interval=0.5)


async def emit(store: Any, asset: Asset, n: int = 1, start: int = 0) -> list[int]:
    ids: list[int] = []
    for i in range(start, start + n):
        commit = EventCommit("w", (asset.name,), encode_json({"i": i}, what="payload"))
        ids.extend(e.id for e in await store.events.acommit(commit))
    return ids


async def wait_runs(store: Any, task: str, state: str, count: int) -> list[TaskRun]:
    with anyio.fail_after(20):
        while True:
            runs = await store.tasks.alist_runs(task=task, state=state)
            if len(runs) >= count:
                return list(runs)
            await anyio.sleep(0.02)


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    """A built-in backend with the test assets registered."""
    await backend.events.aregister_assets([A, B, OUT])
    yield backend


async def start(store: Any, tg: anyio.abc.TaskGroup, *tasks: Any) -> Worker:
    worker = Worker(store, tasks, FAST)
    await tg.start(worker.run)
    return worker


class TestExecution:
    async def test_task_gets_its_events_and_context(self, store: Any) -> None:
        """A run's context holds its events per asset, the run id and the try number."""
        seen: list[dict[str, Any]] = []

        @asset_task(schedule=[A])
        def consume(
            *, triggering_asset_events: dict[Asset, list[AssetEvent]], **context: Any
        ) -> None:
            seen.append(
                {
                    "payloads": [e.payload for e in triggering_asset_events[A]],
                    "run_id": context["run_id"],
                    "try": context["try_number"],
                    "has_store": "asset_state_store" in context,
                }
            )

        async with anyio.create_task_group() as tg:
            await start(store, tg, consume)
            await store.tasks.aset_task_paused("consume", True)  # the three events make one run
            await emit(store, A, 3)
            await store.tasks.aset_task_paused("consume", False)
            (run,) = await wait_runs(store, "consume", "success", 1)
            tg.cancel_scope.cancel()
        assert seen == [
            {"payloads": [{"i": 0}, {"i": 1}, {"i": 2}], "run_id": str(run.id), "try": 1,
             "has_store": True}
        ]  # fmt: skip

    async def test_async_task_and_outlet_chain(self, store: Any) -> None:
        """An async task's outlet event, with the payload it set, triggers the chained task."""
        got: list[object] = []

        @asset_task(schedule=[A], outlets=[OUT])
        async def first(*, triggering_asset_events: Any, outlet_events: Any, **_: Any) -> None:
            outlet_events[OUT].extra = {"n": len(triggering_asset_events[A])}

        @asset_task(schedule=[OUT])
        def second(*, triggering_asset_events: Any, **_: Any) -> None:
            got.extend(e.payload for e in triggering_asset_events[OUT])

        async with anyio.create_task_group() as tg:
            await start(store, tg, first, second)
            await store.tasks.aset_task_paused("first", True)
            await emit(store, A, 2)
            await store.tasks.aset_task_paused("first", False)
            await wait_runs(store, "second", "success", 1)
            tg.cancel_scope.cancel()
        assert got == [{"n": 2}]

    async def test_any_of_runs_on_either_asset(self, store: Any) -> None:
        """An AnyOf task runs on an event of either asset; a list task waits for both."""

        @asset_task(schedule=AnyOf(A, B))
        def either(**_: Any) -> None:
            pass

        @asset_task(schedule=[A, B])
        def both(**_: Any) -> None:
            pass

        async with anyio.create_task_group() as tg:
            await start(store, tg, either, both)
            await emit(store, B)
            await wait_runs(store, "either", "success", 1)
            assert await store.tasks.alist_runs(task="both") == []
            await emit(store, A)
            await wait_runs(store, "both", "success", 1)
            tg.cancel_scope.cancel()

    @pytest.mark.parametrize("kind", ["sync", "async"])
    async def test_concurrency_bounds_the_runs_claimed(self, store: Any, kind: str) -> None:
        """With ``concurrency`` 2, at most two runs are ever claimed and not yet finished (the
        runs ``running`` in the store), and at most two tasks run at once: a slot recording
        its run's outcome claims its next run in that step, and counts meanwhile."""
        seen: list[tuple[int, int]] = []  # (tasks running at once, runs running in the store)
        running = 0

        async def observe() -> None:
            nonlocal running
            running += 1
            try:
                await anyio.sleep(0.02)
                seen.append((running, len(await store.tasks.alist_runs(state="running"))))
            finally:
                running -= 1

        if kind == "async":

            @asset_task(schedule=[A], max_events_per_run=1)
            async def bounded(**_: Any) -> None:
                await observe()

        else:

            @asset_task(schedule=[A], max_events_per_run=1)
            def bounded(**_: Any) -> None:
                anyio.from_thread.run(observe, token=token)

        token = anyio.lowlevel.current_token()
        settings = WorkerSettings(concurrency=2, poll_interval=0.01, heartbeat_interval=5)
        async with anyio.create_task_group() as tg:
            await tg.start(Worker(store, [bounded], settings).run)
            await store.tasks.aset_task_paused("bounded", True)
            await emit(store, A, 12)
            await store.tasks.aset_task_paused("bounded", False)
            await wait_runs(store, "bounded", "success", 12)
            tg.cancel_scope.cancel()
        assert len(seen) == 12
        assert max(at_once for at_once, _ in seen) == 2  # both slots were used ...
        assert max(claimed for _, claimed in seen) <= 2  # ... and no run waited claimed

    async def test_creation_doubles_while_a_backlog_lasts(self, store: Any) -> None:
        """Each creation that makes as many runs as it was allowed lets the next make twice
        as many (so the slots run dry less often in a backlog); one that makes fewer sets
        it back to the base, ``4 x concurrency``. A step that claims a ready run creates
        nothing and changes nothing."""

        @asset_task(schedule=[A], max_events_per_run=1)
        def backlog(**_: Any) -> None:
            """No-op."""

        worker = Worker(store, [backlog], FAST)  # concurrency 4: 16 runs, then 32, 64, ...
        await worker.declare()
        await emit(store, A, 100)
        made = []
        for _ in range(100):
            step = await worker._step(claim=1)
            assert len(step.claimed) == 1
            if step.created:
                made.append(step.created)
        assert made == [16, 32, 52]  # the third was allowed 64: 52 events were left
        assert worker._batch == 16
        assert (await store.tasks.alist_tasks())[0].pending == {"a": 0}

    async def test_a_creation_that_makes_nothing_keeps_the_size(self, store: Any) -> None:
        """A step that found nothing to create (or lost the race for the cursor to another
        worker) says nothing about the backlog: the next creation may still make as many."""

        @asset_task(schedule=[A], max_events_per_run=1)
        def backlog(**_: Any) -> None:
            """No-op."""

        worker = Worker(store, [backlog], FAST)
        await worker.declare()
        await emit(store, A, 16)
        for _ in range(16):
            await worker._step(claim=1)
        assert worker._batch == 32  # the first creation filled its 16
        step = await worker._step(claim=1)
        assert (step.claimed, step.created, worker._batch) == ((), 0, 32)
        await emit(store, A, 5)
        assert (await worker._step(claim=1)).created == 5
        assert worker._batch == 16


class TestFailures:
    async def test_retry_sees_previous_try_state(self, store: Any) -> None:
        """A retry runs with the next try number and reads what the failed try wrote."""
        reads: list[object] = []

        @asset_task(schedule=[A], retries=2, retry_delay=0.01)
        def flaky(*, task_state_store: Any, try_number: int, **_: Any) -> None:
            reads.append(task_state_store.get("progress"))
            task_state_store.set("progress", try_number)
            if try_number < 2:
                raise RuntimeError("first try fails")

        async with anyio.create_task_group() as tg:
            await start(store, tg, flaky)
            await emit(store, A)
            (run,) = await wait_runs(store, "flaky", "success", 1)
            tg.cancel_scope.cancel()
        assert reads == [None, 1]
        shown = await store.tasks.aget_run(run.id)
        assert shown.try_number == 2
        assert "RuntimeError: first try fails" in shown.errors[0].error
        assert "Traceback" in (shown.errors[0].traceback or "")

    async def test_execution_timeout_fails_the_try(self, store: Any) -> None:
        """A try past execution_timeout fails; without retries the run is failed."""

        @asset_task(schedule=[A], execution_timeout=0.05)
        async def slow(**_: Any) -> None:
            await anyio.sleep(30)

        async with anyio.create_task_group() as tg:
            await start(store, tg, slow)
            await emit(store, A)
            (run,) = await wait_runs(store, "slow", "failed", 1)
            tg.cancel_scope.cancel()
        assert "TimeoutError" in run.errors[0].error
        assert run.errors[0].cause == "timeout" and run.failures == 1

    async def test_error_raised_on_timeout_counts_as_timeout(self, store: Any) -> None:
        """A try whose cleanup raises when its timeout cancels it is recorded as a timeout."""

        @asset_task(schedule=[A], execution_timeout=0.05)
        async def stubborn(**_: Any) -> None:
            try:
                await anyio.sleep(30)
            except anyio.get_cancelled_exc_class():
                raise RuntimeError("cleanup failed") from None

        async with anyio.create_task_group() as tg:
            await start(store, tg, stubborn)
            await emit(store, A)
            (run,) = await wait_runs(store, "stubborn", "failed", 1)
            tg.cancel_scope.cancel()
        assert [(e.cause, e.error) for e in run.errors] == [
            ("timeout", "RuntimeError: cleanup failed")
        ]

    async def test_task_error_without_retries_fails_for_good(self, store: Any) -> None:
        """A task that raises with retries=0 fails its run at once, the try a task_error."""

        @asset_task(schedule=[A])
        def broken(**_: Any) -> None:
            raise ValueError("no")

        async with anyio.create_task_group() as tg:
            await start(store, tg, broken)
            await emit(store, A)
            (run,) = await wait_runs(store, "broken", "failed", 1)
            tg.cancel_scope.cancel()
        assert (run.try_number, run.failures, run.lost_tries) == (1, 1, 0)
        assert [(e.cause, e.error) for e in run.errors] == [("task_error", "ValueError: no")]

    async def test_stopping_the_worker_is_not_a_failed_try(self, store: Any) -> None:
        """Cancelling the worker while an async try runs cancels it: the try is not recorded
        as a failure (a cancellation the task raises on its own would be)."""
        started = anyio.Event()

        @asset_task(schedule=[A])
        async def forever(**_: Any) -> None:
            started.set()
            await anyio.sleep(60)

        async with anyio.create_task_group() as tg:
            await start(store, tg, forever)
            await emit(store, A)
            with anyio.fail_after(20):
                await started.wait()
            tg.cancel_scope.cancel()
        (run,) = await store.tasks.alist_runs(task="forever")
        assert run.state == "running" and run.errors == ()

    def test_retry_delay_doubles_with_jitter(self) -> None:
        """The retry delay doubles per try within ±20 %, capped at max_retry_delay."""

        @asset_task(schedule=[A], retry_delay=timedelta(seconds=10))
        def task(**_: Any) -> None:
            pass

        import random

        rng = random.Random(1)
        delays = [retry_delay_for(task, n, rng).total_seconds() for n in (1, 2, 3, 10)]
        assert 8 <= delays[0] <= 12 and 16 <= delays[1] <= 24 and 32 <= delays[2] <= 48
        assert 240 <= delays[3] <= 360


class TestAuthoring:
    def test_bad_declarations_are_refused(self) -> None:
        """asset_task refuses an empty schedule, non-assets, and negative retries."""
        with pytest.raises(ValueError, match="at least one"):
            asset_task(schedule=[])
        with pytest.raises(TypeError, match="Asset objects"):
            asset_task(schedule=["a"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="retries"):
            asset_task(schedule=[A], retries=-1)
        with pytest.raises(TypeError, match="Asset objects"):
            AnyOf("a")  # type: ignore[arg-type]
