"""The contract of task specs and their lifecycle, on memory, SQLite and PostgreSQL: the spec
fields runs wait on (``batch_window``, ``max_active_runs``) stored and read back, tasks the
definitions no longer declare marked removed (and present again when declared again), and a
task deleted for good.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from watchkeeper.store import (
    ArgumentTypeError,
    Asset,
    AssetScope,
    BaseStateBackend,
    EventConsumer,
    InvalidArgumentError,
    InvalidNameError,
    LeaseLostError,
    RunStateError,
    TaskNotFoundError,
    TaskScope,
)
from watchkeeper.store.protocols import Fence, StateWrite, TaskSpec, Writer

from tests.support.clock import T0, Clock

from .test_contract_tasks import TTL, emit, snapshot


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    backend.clock = Clock()
    await backend.events.aregister_assets([Asset("a"), Asset("b")])
    yield backend


async def infos(store: Any) -> dict[str, Any]:
    return {info.name: info for info in await store.tasks.alist_tasks()}


class TestSpecFields:
    async def test_batch_window_and_max_active_runs_read_back(self, store: Any) -> None:
        """Both fields are stored with the spec and change with it."""
        await store.tasks.async_tasks(
            [TaskSpec("t", ("a",), batch_window=2.5, max_active_runs=3), TaskSpec("u", ("b",))]
        )
        found = await infos(store)
        assert (found["t"].spec.batch_window, found["t"].spec.max_active_runs) == (2.5, 3)
        assert (found["u"].spec.batch_window, found["u"].spec.max_active_runs) == (0.0, None)
        assert found["t"].spec == TaskSpec("t", ("a",), batch_window=2.5, max_active_runs=3)
        await store.tasks.async_tasks([TaskSpec("t", ("a",), batch_window=0, max_active_runs=None)])
        again = (await infos(store))["t"].spec
        assert (again.batch_window, again.max_active_runs) == (0.0, None)

    @pytest.mark.parametrize(
        ("fields", "error", "message"),
        [
            ({"batch_window": -1}, InvalidArgumentError, "TaskSpec.batch_window"),
            ({"batch_window": math.nan}, InvalidArgumentError, "finite"),
            ({"batch_window": math.inf}, InvalidArgumentError, "finite"),
            ({"batch_window": "1"}, ArgumentTypeError, "TaskSpec.batch_window"),
            ({"batch_window": True}, ArgumentTypeError, "TaskSpec.batch_window"),
            ({"max_active_runs": 0}, InvalidArgumentError, "TaskSpec.max_active_runs"),
            ({"max_active_runs": 1.5}, ArgumentTypeError, "TaskSpec.max_active_runs"),
            ({"max_active_runs": True}, ArgumentTypeError, "TaskSpec.max_active_runs"),
        ],
    )
    def test_bad_fields_name_themselves(
        self, fields: dict[str, Any], error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            TaskSpec("t", ("a",), **fields)


class TestRetire:
    async def test_tasks_not_kept_are_marked_removed_and_keep_their_cursors(
        self, store: Any
    ) -> None:
        """A task the definitions stopped declaring is kept, marked with the time it was
        first found missing; its cursors stay where they were."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",)), TaskSpec("u", ("b",))])
        await emit(store, "b", 2)
        before = (await infos(store))["u"]
        assert not before.removed and before.removed_at is None
        assert await store.tasks.aretire_tasks(["t"]) == ["u"]
        found = await infos(store)
        assert not found["t"].removed
        assert found["u"].removed and found["u"].removed_at == T0
        assert (found["u"].cursors, found["u"].pending) == (before.cursors, {"b": 2})
        store.clock.advance(60)
        assert await store.tasks.aretire_tasks(["t"]) == []  # already marked: the time stays
        assert (await infos(store))["u"].removed_at == T0

    async def test_declared_again_is_present_again(self, store: Any) -> None:
        """Declaring a removed task clears the mark; its cursors are where they were, so the
        events committed meanwhile are pending."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        assert await store.tasks.aretire_tasks([]) == ["t"]
        ids = await emit(store, "a", 2)
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_active_runs=2)])
        info = (await infos(store))["t"]
        assert not info.removed and info.removed_at is None
        assert info.pending == {"a": 2} and info.spec.max_active_runs == 2
        run = await store.tasks.acreate_run("t")
        assert [e.id for e in run.events] == ids

    async def test_bad_keep_is_refused(self, store: Any) -> None:
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        before = await snapshot(store)
        with pytest.raises(ArgumentTypeError, match="keep"):
            await store.tasks.aretire_tasks("t")
        with pytest.raises(InvalidNameError):
            await store.tasks.aretire_tasks(["t", ""])
        assert await snapshot(store) == before


class TestDelete:
    async def test_delete_forgets_the_task_and_keeps_its_runs(self, store: Any) -> None:
        """The spec and cursors go; the runs stay, none claimed while no task has the name;
        declared again, the task's cursors start afresh at the end of the log and its queued
        run is claimed."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",)), TaskSpec("u", ("a",))])
        await emit(store, "a", 2)
        run = await store.tasks.acreate_run("t")
        await store.tasks.adelete_task("t")
        assert list(await infos(store)) == ["u"]
        assert [r.id for r in await store.tasks.alist_runs(task="t")] == [run.id]
        assert await store.tasks.aclaim_runs("w1", limit=5, ttl=TTL) == []  # no task: no claim
        await emit(store, "a")
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        assert (await infos(store))["t"].pending == {"a": 0}
        (claimed,) = await store.tasks.aclaim_runs("w1", limit=5, ttl=TTL)
        assert claimed.id == run.id  # declared again: its queued run runs
        with pytest.raises(TaskNotFoundError, match="'gone'"):
            await store.tasks.adelete_task("gone")

    async def test_unknown_task_is_an_error_naming_it(self, store: Any) -> None:
        with pytest.raises(TaskNotFoundError, match="'nope'"):
            await store.tasks.adelete_task("nope")
        with pytest.raises(InvalidNameError):
            await store.tasks.adelete_task("")

    async def test_a_running_run_refuses_the_delete_and_nothing_changes(self, store: Any) -> None:
        """A worker holds the try: the delete names the run and changes nothing; once the
        run has ended the task can go."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        await emit(store, "a")
        await store.tasks.acreate_run("t")
        (claimed,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        before = await snapshot(store)
        with pytest.raises(RunStateError, match=f"run {claimed.id} is running.*'t'"):
            await store.tasks.adelete_task("t")
        assert await snapshot(store) == before
        await store.tasks.afinish_run(claimed.id, "w1", claimed.lease_token, success=True)
        await store.tasks.adelete_task("t")
        assert await infos(store) == {}


class TestAckWriters:
    async def test_state_written_with_an_ack_records_its_writer_and_versions(
        self, store: Any
    ) -> None:
        """An acknowledgement's state writes are writes as any other: a version per key, the
        writer recorded, an asset named by its URI resolved."""
        await store.events.aregister_assets([Asset("u", uri="s3://b/u")])
        ids = await emit(store, "a", 2)
        consumer = EventConsumer(store, "c1")
        scope, by_uri = TaskScope("d", "r", "t"), AssetScope(uri="s3://b/u")
        await consumer.ack(ids[0], state=[(scope, "n", 1), (by_uri, "n", 1)])
        await consumer.ack(ids[1], state=[(scope, "n", 2), (by_uri, "n", 2)])
        for where in (scope, AssetScope(name="u")):
            (entry,) = await store.alist(where)
            assert (entry.key, entry.value, entry.version) == ("n", 2, 2)
            assert entry.writer == Writer("api", "consumer:c1")

    async def test_a_fenced_writer_without_its_lease_writes_nothing(self, store: Any) -> None:
        """A writer fenced by a trigger lease it does not hold is refused, cursor and state
        alike; with the lease held, the same acknowledgement commits."""
        ids = await emit(store, "a")
        fenced = Writer("watcher", "w", fence=Fence("trig", "d1", 1))
        write = StateWrite(AssetScope(name="a"), "k", "1")
        before = await snapshot(store)
        with pytest.raises(LeaseLostError, match="never claimed"):
            await store.tasks.aconsumer_ack("c1", ids[0], state=[write], writer=fenced)
        assert await snapshot(store) == before and await store.tasks.aconsumer_position("c1") == 0
        assert await store.leases.aclaim_leases("d1", ["trig"], TTL) == {"trig": 1}
        await store.tasks.aconsumer_ack("c1", ids[0], state=[write], writer=fenced)
        assert await store.aget(AssetScope(name="a"), "k") == 1
        assert await store.tasks.aconsumer_position("c1") == ids[0]
