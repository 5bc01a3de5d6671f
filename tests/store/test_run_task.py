"""``run_task``: the smallest task runner, on top of ``build_task_context``.

It registers the declared assets, runs a sync task in a worker thread or an async one on the
loop (with a greenback portal, so sync store calls inside it work), retries with the next
try_number, and applies ``clear_on_success`` to task state only.
"""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
from structlog.testing import capture_logs
from watchkeeper.store import (
    Asset,
    AssetNotFoundError,
    MemoryStateBackend,
    SqliteStateBackend,
    TaskScope,
    run_task,
)
from watchkeeper.store.protocols import BaseStateBackend

ORDERS = Asset("orders", uri="s3://data/orders")
IDS: dict[str, Any] = {"dag_id": "dag", "run_id": "run_1", "task_id": "load"}
SCOPE = TaskScope("dag", "run_1", "load")


@pytest.fixture
def store(local_backend: BaseStateBackend) -> BaseStateBackend:
    """An open, empty backend (memory, SQLite)."""
    return local_backend


class TestCalling:
    async def test_sync_task_runs_in_a_worker_thread(self, store: BaseStateBackend) -> None:
        """A sync task runs off the loop thread, gets the context and its result is returned."""
        seen: dict[str, Any] = {}

        def task(**context: Any) -> str:
            seen["thread"] = threading.get_ident()
            seen["keys"] = set(context)
            context["task_state_store"].set("job_id", "spark-1")
            return "done"

        assert await run_task(task, backend=store, **IDS) == "done"
        assert seen["thread"] != threading.get_ident()
        assert {"task_state_store", "task_store", "dag_id", "try_number"} <= seen["keys"]
        assert await store.aget(SCOPE, "job_id") == "spark-1"

    async def test_async_task_can_make_sync_store_calls(self, store: BaseStateBackend) -> None:
        """An async task runs on the loop and may call the sync store methods (greenback portal)."""
        loop_thread = threading.get_ident()

        async def task(**context: Any) -> int:
            assert threading.get_ident() == loop_thread
            context["task_store"].set("page", 1)
            context["asset_store"].set("watermark", "2024-06-01")
            await context["task_store"].aset("page", context["task_store"].get("page") + 1)
            return int(context["task_store"].get("page"))

        assert await run_task(task, backend=store, outlets=[ORDERS], **IDS) == 2
        assert await store.aget(ORDERS.scope, "watermark") == "2024-06-01"

    async def test_declared_assets_are_registered(self, store: BaseStateBackend) -> None:
        """run_task registers the declared assets (reactivating one) before the first try."""
        await store.events.aregister_assets([ORDERS])
        await store.events.adeactivate_asset("orders")

        def task(**context: Any) -> None:
            context["asset_state_store"]["customers"].set("w", 1)

        await run_task(task, backend=store, inlets=[ORDERS], outlets=[Asset("customers")], **IDS)
        assert [(a.name, a.active) for a in await store.events.alist_assets()] == [
            ("customers", True),
            ("orders", True),
        ]

    async def test_without_registration_an_unknown_asset_fails(
        self, store: BaseStateBackend
    ) -> None:
        """With register_assets=False an unregistered asset raises AssetNotFoundError in the task."""

        def task(**context: Any) -> None:
            context["asset_store"].set("w", 1)

        with pytest.raises(AssetNotFoundError, match="customers"):
            await run_task(
                task, backend=store, outlets=[Asset("customers")], register_assets=False, **IDS
            )
        assert await store.events.alist_assets() == []

    @pytest.mark.parametrize("retries", [-1, 1.5, "2"], ids=repr)
    async def test_bad_retries_are_refused(self, retries: Any) -> None:
        """retries must be an int >= 0; nothing runs otherwise."""
        calls: list[int] = []
        with pytest.raises(ValueError, match="retries"):
            await run_task(
                lambda **_: calls.append(1), backend=MemoryStateBackend(), retries=retries, **IDS
            )
        assert calls == []


class TestRetries:
    async def test_retry_sees_what_the_failed_try_wrote(self, store: BaseStateBackend) -> None:
        """Each retry runs with the next try_number and reads the previous tries' writes."""
        seen: list[tuple[int, int]] = []

        def task(**context: Any) -> str:
            store_ = context["task_store"]
            attempts = store_.get("attempts", 0)
            seen.append((context["try_number"], attempts))
            store_.set("attempts", attempts + 1)
            if context["try_number"] < 3:
                raise RuntimeError(f"try {context['try_number']} failed")
            return "ok"

        with capture_logs() as logs:
            assert await run_task(task, backend=store, retries=5, **IDS) == "ok"
        assert seen == [(1, 0), (2, 1), (3, 2)]
        entry = await store.aget_entry(SCOPE, "attempts")
        assert entry is not None and entry.writer is not None and entry.writer.try_number == 3
        retried = [e for e in logs if e["event"] == "task_try_failed"]
        assert [e["try_number"] for e in retried] == [1, 2]

    async def test_last_error_is_raised_when_retries_run_out(self, store: BaseStateBackend) -> None:
        """After retries+1 failed tries the last try's error is re-raised."""
        tries: list[int] = []

        async def task(**context: Any) -> None:
            tries.append(context["try_number"])
            raise RuntimeError(f"boom on try {context['try_number']}")

        with pytest.raises(RuntimeError, match="boom on try 3"):
            await run_task(task, backend=store, retries=2, **IDS)
        assert tries == [1, 2, 3]

    async def test_no_retries_by_default(self, store: BaseStateBackend) -> None:
        """With retries=0 a failing task runs once."""
        tries: list[int] = []

        def task(**context: Any) -> None:
            tries.append(context["try_number"])
            raise KeyError("missing")

        with pytest.raises(KeyError):
            await run_task(task, backend=store, **IDS)
        assert tries == [1]

    async def test_cancellation_is_not_retried(self, store: BaseStateBackend) -> None:
        """A cancelled task is not retried: cancellation passes straight through."""
        started = anyio.Event()
        tries: list[int] = []

        async def task(**context: Any) -> None:
            tries.append(context["try_number"])
            started.set()
            await anyio.sleep_forever()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(run_task, task, backend=store, retries=3, **IDS))
                await started.wait()
                tg.cancel_scope.cancel()
        assert tries == [1]


class TestStateLifecycle:
    async def test_clear_on_success_clears_only_this_task_instance(
        self, store: BaseStateBackend
    ) -> None:
        """clear_on_success empties this map index's task state; asset state and others stay."""
        other_map = TaskScope("dag", "run_1", "load", 1)
        await store.aset(other_map, "k", "other")

        def task(**context: Any) -> None:
            context["task_store"].set("job_id", "spark-1")
            context["asset_store"].set("watermark", 5)

        await run_task(
            task, backend=store, map_index=0, outlets=[ORDERS], clear_on_success=True, **IDS
        )
        assert await store.alist(TaskScope("dag", "run_1", "load", 0)) == []
        assert await store.aget(other_map, "k") == "other"
        assert await store.aget(ORDERS.scope, "watermark") == 5

    async def test_failure_keeps_state_despite_clear_on_success(
        self, store: BaseStateBackend
    ) -> None:
        """A task that finally fails keeps its task state for the next attempt to resume from."""

        def task(**context: Any) -> None:
            context["task_store"].set("checkpoint", 41)
            raise RuntimeError("failed")

        with pytest.raises(RuntimeError):
            await run_task(task, backend=store, retries=1, clear_on_success=True, **IDS)
        assert await store.aget(SCOPE, "checkpoint") == 41

    async def test_without_clear_on_success_state_is_kept(self, store: BaseStateBackend) -> None:
        """By default a successful task's state stays readable after the run."""
        await run_task(lambda **c: c["task_store"].set("rows", 10), backend=store, **IDS)
        assert await store.aget(SCOPE, "rows") == 10

    async def test_new_run_starts_empty(self, store: BaseStateBackend) -> None:
        """A new run_id starts with no task state, while the asset state carries over."""
        reads: list[tuple[Any, Any]] = []

        def task(**context: Any) -> None:
            reads.append((context["task_store"].get("page"), context["asset_store"].get("w")))
            context["task_store"].set("page", 7)
            context["asset_store"].set("w", context["run_id"])

        await run_task(task, backend=store, outlets=[ORDERS], **IDS)
        await run_task(task, backend=store, outlets=[ORDERS], **{**IDS, "run_id": "run_2"})
        assert reads == [(None, None), (None, "run_1")]


class TestSharedSqliteFile:
    async def test_sync_task_and_coroutines_write_at_once(self, tmp_path: Path) -> None:
        """A sync task in a worker thread and several coroutines write one SQLite file concurrently."""
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            await self._race(backend, backend)

    async def test_two_backends_on_one_file(self, tmp_path: Path) -> None:
        """A task on one SqliteStateBackend and coroutines on another share the file safely."""
        path = tmp_path / "state.db"
        async with SqliteStateBackend(path) as task_side, SqliteStateBackend(path) as other:
            await self._race(task_side, other)

    @staticmethod
    async def _race(task_side: BaseStateBackend, other: BaseStateBackend) -> None:
        await task_side.events.aregister_assets([ORDERS])
        task_wrote = anyio.Event()
        coroutines_wrote = threading.Event()
        count = 40

        def task(**context: Any) -> str:
            store = context["task_store"]
            store.set("t0", 0)
            anyio.from_thread.run_sync(task_wrote.set)
            assert coroutines_wrote.wait(timeout=10)  # a worker thread, not the loop
            for number in range(1, count):
                store.set(f"t{number}", number)
                context["asset_store"].set(f"task-{number}", number)
            return "done"

        async def writer(name: int) -> None:
            await task_wrote.wait()
            for number in range(count):
                await other.aset(ORDERS.scope, f"c{name}-{number}", number)
                coroutines_wrote.set()

        results: list[object] = []

        async def run() -> None:
            results.append(await run_task(task, backend=task_side, outlets=[ORDERS], **IDS))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                for name in range(4):
                    tg.start_soon(writer, name)
        assert results == ["done"]
        assert len(await other.alist(SCOPE)) == count
        assert len(await task_side.alist(ORDERS.scope)) == 4 * count + count - 1
