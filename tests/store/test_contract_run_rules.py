"""The rules of run creation on memory, SQLite and PostgreSQL: a task's batch window holds its
runs back until its oldest pending event is that old (or ``max_events`` are pending), and a
task the definitions no longer declare gets no new run. Both through ``acreate_runs`` and
through a worker's step (on PostgreSQL a task on one asset is created and claimed in one
statement, a task on several in a transaction: both paths are here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from watchkeeper.store import Asset, BaseStateBackend
from watchkeeper.store.protocols import TaskSpec

from tests.support.clock import Clock

from .test_contract_tasks import TTL, emit

# A task on one asset and one on two ("any": a run per pending event group).
SHAPES = [("a",), ("a", "b")]


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    backend.clock = Clock()
    await backend.events.aregister_assets([Asset("a"), Asset("b")])
    yield backend


async def step(store: Any) -> Any:
    return await store.tasks.astep_runs("w", claim=4, ttl=TTL, tasks=["t"], create=4)


class TestBatchWindow:
    @pytest.mark.parametrize("assets", SHAPES)
    async def test_creation_waits_for_the_oldest_event_to_be_window_old(
        self, store: Any, assets: tuple[str, ...]
    ) -> None:
        """Inside the window nothing is created and the cursor stays; once the oldest pending
        event is ``batch_window`` seconds old one run takes every event that came meanwhile."""
        spec = TaskSpec("t", assets, mode="any", max_events=10, batch_window=5)
        await store.tasks.async_tasks([spec])
        await emit(store, "a")
        store.clock.advance(3)
        await emit(store, "a")
        assert await store.tasks.acreate_runs("t", 5) == []
        assert (await store.tasks.alist_tasks())[0].pending["a"] == 2
        store.clock.advance(2)
        runs = await store.tasks.acreate_runs("t", 5)
        assert [run.event_count for run in runs] == [2]

    @pytest.mark.parametrize("assets", SHAPES)
    async def test_a_step_creates_nothing_inside_the_window(
        self, store: Any, assets: tuple[str, ...]
    ) -> None:
        """A worker's step keeps the same window: nothing created or claimed inside it, the
        run created and claimed once it has passed."""
        spec = TaskSpec("t", assets, mode="any", max_events=10, batch_window=5)
        await store.tasks.async_tasks([spec])
        await emit(store, "a", 2)
        store.clock.advance(4.5)
        early = await step(store)
        assert (early.claimed, early.created) == ((), 0)
        store.clock.advance(0.5)
        late = await step(store)
        assert late.created == 1
        assert [run.event_count for run in late.claimed] == [2]

    @pytest.mark.parametrize("assets", SHAPES)
    async def test_max_events_pending_do_not_wait(
        self, store: Any, assets: tuple[str, ...]
    ) -> None:
        """With ``max_events`` events pending a run is created at once, window or not."""
        spec = TaskSpec("t", assets, mode="any", max_events=3, batch_window=60)
        await store.tasks.async_tasks([spec])
        await emit(store, "a", 2)
        assert await store.tasks.acreate_runs("t", 5) == []
        await emit(store, "a")
        assert [run.event_count for run in (await step(store)).claimed] == [3]

    async def test_no_window_creates_at_once(self, store: Any) -> None:
        """A task without a window (the default) gets its run from its first event."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=10)])
        await emit(store, "a")
        assert [run.event_count for run in await store.tasks.acreate_runs("t", 5)] == [1]


class TestRemovedTask:
    @pytest.mark.parametrize("assets", SHAPES)
    async def test_a_removed_task_gets_no_new_run(
        self, store: Any, assets: tuple[str, ...]
    ) -> None:
        """Once the definitions stop declaring a task its pending events make no run, by
        ``acreate_runs`` or by a step; declared again, they do."""
        await store.tasks.async_tasks([TaskSpec("t", assets, mode="any")])
        await emit(store, "a", 2)
        assert await store.tasks.aretire_tasks([]) == ["t"]
        assert await store.tasks.acreate_runs("t", 5) == []
        removed = await step(store)
        assert (removed.claimed, removed.created) == ((), 0)
        assert (await store.tasks.alist_tasks())[0].pending["a"] == 2
        await store.tasks.async_tasks([TaskSpec("t", assets, mode="any")])
        again = await step(store)
        assert again.created == 1 and [run.event_count for run in again.claimed] == [2]
