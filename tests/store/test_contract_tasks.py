"""The contract of event consumers, task cursors and runs, on memory, SQLite and PostgreSQL.

Time is the backend's own ``clock`` (set by each test), so lease expiry never depends on the
wall clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from watchkeeper.store import (
    ArgumentTypeError,
    Asset,
    AssetNotFoundError,
    AssetScope,
    BaseStateBackend,
    ConsumerCursorError,
    EventConsumer,
    InvalidArgumentError,
    InvalidNameError,
    MissingCapabilityError,
    RunLeaseLostError,
    RunNotFoundError,
    RunStateError,
    StateStoreError,
    TaskNotFoundError,
    TaskScope,
)
from watchkeeper.store.protocols import (
    MAX_LOST_TRIES,
    EventCommit,
    OutletEvent,
    TaskSpec,
    encode_json,
)

from tests.support.clock import Clock

TTL = timedelta(seconds=30)


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    """The backend on a settable clock, with the assets ``a``, ``b`` and ``out`` registered."""
    backend.clock = Clock()
    await backend.events.aregister_assets([Asset("a"), Asset("b"), Asset("out")])
    yield backend


async def emit(store: Any, asset: str, n: int = 1) -> list[int]:
    ids: list[int] = []
    for i in range(n):
        commit = EventCommit("w", (asset,), encode_json({"i": i}, what="payload"))
        ids.extend(e.id for e in await store.events.acommit(commit))
    return ids


async def snapshot(store: Any) -> tuple[object, ...]:
    return (
        await store.tasks.alist_runs(),
        await store.tasks.alist_tasks(),
        await store.events.alist_events(),
        await store.alist(TaskScope("c", "c", "c")),
    )


class TestCapabilities:
    async def test_builtin_backends_satisfy_the_protocols(self, backend: BaseStateBackend) -> None:
        """Every built-in backend has the tasks service (consumers and the task queue)."""
        assert backend.services.tasks is not None


class TestConsumer:
    async def test_fetch_after_cursor_and_ack(self, store: Any) -> None:
        """A consumer gets the events after its cursor; acknowledging moves the cursor."""
        ids = await emit(store, "a", 3)
        consumer = EventConsumer(store, "c1")
        assert [e.id for e in await consumer.fetch()] == ids
        await consumer.ack(ids[1])
        assert [e.id for e in await consumer.fetch()] == ids[2:]
        assert await consumer.position() == ids[1]
        assert [e.id for e in await EventConsumer(store, "c2").fetch(limit=1)] == ids[:1]

    async def test_ack_writes_state_in_the_same_transaction(self, store: Any) -> None:
        """State written with an acknowledgement is stored with the cursor move."""
        ids = await emit(store, "a", 2)
        consumer = EventConsumer(store, "c1", assets=["a"])
        scope = TaskScope("c", "c", "c")
        await consumer.ack(ids[0], state=[(scope, "seen", 1), (AssetScope(name="a"), "k", "v")])
        assert await store.aget(scope, "seen") == 1
        assert await store.aget(AssetScope(name="a"), "k") == "v"

    async def test_rejected_ack_changes_nothing(self, store: Any) -> None:
        """An ack backwards, with a stale expected cursor or an unknown asset writes nothing."""
        ids = await emit(store, "a", 3)
        consumer = EventConsumer(store, "c1")
        await consumer.ack(ids[1])
        before = await snapshot(store)
        scope = TaskScope("c", "c", "c")
        with pytest.raises(ConsumerCursorError, match="only moves forward"):
            await consumer.ack(ids[0], state=[(scope, "x", 1)])
        with pytest.raises(ConsumerCursorError, match="expected"):
            await consumer.ack(ids[2], expected=0, state=[(scope, "x", 1)])
        with pytest.raises(AssetNotFoundError):
            await consumer.ack(ids[2], state=[(scope, "x", 1), (AssetScope(name="nope"), "k", 1)])
        assert await snapshot(store) == before
        assert await consumer.position() == ids[1]


class TestRunCreation:
    async def test_new_task_starts_at_the_end_of_the_log(self, store: Any) -> None:
        """Events committed before a task was declared are not delivered to it."""
        await emit(store, "a", 2)
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        assert await store.tasks.acreate_run("t") is None
        (info,) = await store.tasks.alist_tasks()
        assert info.pending == {"a": 0}

    async def test_run_takes_every_pending_event_once(self, store: Any) -> None:
        """A run owns the pending events; the next run starts after them."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=3)])
        ids = await emit(store, "a", 5)
        first = await store.tasks.acreate_run("t")
        second = await store.tasks.acreate_run("t")
        assert await store.tasks.acreate_run("t") is None
        assert [e.id for e in first.events] == ids[:3]
        assert [e.id for e in second.events] == ids[3:]
        assert first.state == "queued" and first.try_number == 0

    async def test_create_runs_makes_several_at_once(self, store: Any) -> None:
        """acreate_runs splits the pending events into up to max_runs runs, in order."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=2)])
        ids = await emit(store, "a", 5)
        runs = await store.tasks.acreate_runs("t", 2)
        assert [[e.id for e in r.events] for r in runs] == [ids[0:2], ids[2:4]]
        (last,) = await store.tasks.acreate_runs("t", 10)
        assert [e.id for e in last.events] == ids[4:]
        assert await store.tasks.acreate_runs("t", 10) == []

    async def test_all_schedule_waits_for_every_asset(self, store: Any) -> None:
        """A list schedule runs only once every asset has a new event."""
        await store.tasks.async_tasks([TaskSpec("t", ("a", "b"), mode="all")])
        await emit(store, "a", 2)
        assert await store.tasks.acreate_run("t") is None
        await emit(store, "b")
        run = await store.tasks.acreate_run("t")
        assert [e.asset for e in run.events] == ["a", "a", "b"]

    async def test_any_schedule_runs_on_one_asset(self, store: Any) -> None:
        """An AnyOf schedule runs as soon as one asset has an event."""
        await store.tasks.async_tasks([TaskSpec("t", ("a", "b"), mode="any")])
        await emit(store, "b")
        run = await store.tasks.acreate_run("t")
        assert [e.asset for e in run.events] == ["b"]

    async def test_paused_task_gets_no_run(self, store: Any) -> None:
        """A paused task gets no new run until resumed."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        await store.tasks.aset_task_paused("t", True)
        await emit(store, "a")
        assert await store.tasks.acreate_run("t") is None
        await store.tasks.aset_task_paused("t", False)
        assert await store.tasks.acreate_run("t") is not None

    async def test_rewind_redelivers(self, store: Any) -> None:
        """Rewinding a cursor redelivers past events and records who moved it."""
        from watchkeeper.store.protocols import Writer

        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        ids = await emit(store, "a", 3)
        await store.tasks.acreate_run("t")
        await store.tasks.arewind_task("t", "a", ids[1], writer=Writer("cli", "cli"))
        (info,) = await store.tasks.alist_tasks()
        assert info.cursors == {"a": ids[0]} and info.cursor_writers["a"] == Writer("cli", "cli")
        run = await store.tasks.acreate_run("t")
        assert [e.id for e in run.events] == ids[1:]

    async def test_rewind_only_moves_back(self, store: Any) -> None:
        """A rewind past the asset's last event, after the task's cursor, or on an asset
        outside the schedule is refused with an error naming it, and changes nothing."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
        ids = await emit(store, "a", 3)
        await emit(store, "b")
        await store.tasks.acreate_run("t")  # the cursor moves to ids[0]; ids[1:] are pending
        before = await snapshot(store)
        refused = [
            (999999999999, "a", "past the end of the log"),
            (ids[-1] + 1, "a", "past the end of the log"),
            (ids[1], "a", f"after the cursor of task 't' on 'a' \\({ids[0]}\\)"),
            (ids[2], "a", "a rewind only moves back"),
            (ids[0], "b", "not in the schedule of task 't'"),
            (ids[0], "out", "not in the schedule of task 't'"),
        ]
        for to_event, asset, message in refused:
            with pytest.raises(InvalidArgumentError, match=message):
                await store.tasks.arewind_task("t", asset, to_event)
            assert await snapshot(store) == before
        await store.tasks.arewind_task("t", "a", ids[0])  # back to the run's event: allowed
        (info,) = await store.tasks.alist_tasks()
        assert info.cursors == {"a": ids[0] - 1} and info.pending == {"a": 3}

    async def test_unknown_task_is_an_error(self, store: Any) -> None:
        """Naming an unregistered task raises TaskNotFoundError."""
        with pytest.raises(TaskNotFoundError):
            await store.tasks.acreate_run("nope")
        with pytest.raises(TaskNotFoundError):
            await store.tasks.aset_task_paused("nope", True)


class TestClaimAndFinish:
    async def ready(self, store: Any, max_tries: int = 2) -> Any:
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_tries=max_tries)])
        await emit(store, "a", 2)
        return await store.tasks.acreate_run("t")

    async def test_claim_once(self, store: Any) -> None:
        """A queued run is claimed by one worker, with try 1 and token 1."""
        run = await self.ready(store)
        (claimed,) = await store.tasks.aclaim_runs("w1", limit=10, ttl=TTL)
        assert (claimed.id, claimed.try_number, claimed.lease_token) == (run.id, 1, 1)
        assert len(claimed.events) == 2
        assert await store.tasks.aclaim_runs("w2", limit=10, ttl=TTL) == []

    async def test_success_emits_outlets_atomically(self, store: Any) -> None:
        """Success commits one event per outlet with the run's success."""
        await self.ready(store)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        done = await store.tasks.afinish_run(
            run.id, "w1", run.lease_token, success=True,
            outlets=[OutletEvent("out", encode_json({"n": 2}, what="payload"))],
        )  # fmt: skip
        assert done.state == "success"
        (event,) = await store.events.alist_events(asset="out")
        assert event.payload == {"n": 2} and done.outlet_event_ids == (event.id,)
        assert event.watcher == "task:t"

    async def test_count_runs_by_task_and_state(self, store: Any) -> None:
        """acount_runs counts each task's runs per state, as listing them all would."""
        assert await store.tasks.acount_runs() == {}
        await store.tasks.async_tasks(
            [TaskSpec("t", ("a",), max_events=1), TaskSpec("u", ("a",), max_events=1)]
        )
        await emit(store, "a", 3)
        await store.tasks.acreate_runs("t", 3)
        await store.tasks.acreate_runs("u", 1)
        (run, _) = await store.tasks.aclaim_runs("w1", limit=2, ttl=TTL, tasks=["t"])
        await store.tasks.afinish_run(run.id, "w1", run.lease_token, success=False, error="boom")
        counts = await store.tasks.acount_runs()
        assert counts == {("t", "failed"): 1, ("t", "running"): 1, ("t", "queued"): 1,
                          ("u", "queued"): 1}  # fmt: skip
        listed: dict[tuple[str, str], int] = {}
        for r in await store.tasks.alist_runs():
            listed[(r.task, r.state)] = listed.get((r.task, r.state), 0) + 1
        assert counts == listed

    async def test_lapsed_lease_retried_with_next_try(self, store: Any) -> None:
        """A run whose worker stopped renewing is claimed again with the next try number."""
        await self.ready(store)
        (_run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        store.clock.advance(31)
        (again,) = await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL)
        assert (again.try_number, again.lease_token, again.lease_owner) == (2, 2, "w2")
        assert "lapsed" in again.errors[0].error

    async def test_fenced_finish_refused_and_writes_nothing(self, store: Any) -> None:
        """A worker whose lease moved can neither succeed nor emit its outlets."""
        await self.ready(store)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        store.clock.advance(31)
        await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL)
        before = await snapshot(store)
        with pytest.raises(RunLeaseLostError, match="w2"):
            await store.tasks.afinish_run(
                run.id, "w1", run.lease_token, success=True, outlets=[OutletEvent("out")]
            )
        assert await snapshot(store) == before

    async def test_expired_lease_cannot_finish(self, store: Any) -> None:
        """A lease past its expiry refuses the finish even before anyone claims the run."""
        await self.ready(store)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        store.clock.advance(31)
        with pytest.raises(RunLeaseLostError, match="expired"):
            await store.tasks.afinish_run(run.id, "w1", run.lease_token, success=True)

    async def test_heartbeat_keeps_the_lease(self, store: Any) -> None:
        """Renewing the lease keeps another worker from claiming the run."""
        await self.ready(store)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        store.clock.advance(20)
        assert await store.tasks.aheartbeat_runs("w1", {run.id: run.lease_token}, TTL) == {run.id}
        store.clock.advance(20)
        assert await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL) == []
        assert await store.tasks.aheartbeat_runs("w2", {run.id: run.lease_token}, TTL) == set()

    async def test_break_leases_frees_at_once(self, store: Any) -> None:
        """Breaking a dead owner's leases makes its runs claimable without waiting."""
        await self.ready(store)
        await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        assert await store.tasks.abreak_run_leases(["w1"]) == 1
        (again,) = await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL)
        assert again.try_number == 2

    async def test_failure_retries_then_fails(self, store: Any) -> None:
        """A failed try is queued after the delay while tries remain, then the run fails."""
        await self.ready(store, max_tries=2)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        failed = await store.tasks.afinish_run(
            run.id, "w1", 1, success=False, error="boom", traceback="tb",
            retry_delay=timedelta(seconds=10),
        )  # fmt: skip
        assert failed.state == "queued"
        assert await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL) == []
        store.clock.advance(11)
        (run2,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        done = await store.tasks.afinish_run(
            run2.id, "w1", run2.lease_token, success=False, error="x"
        )
        assert done.state == "failed"
        assert [(e.try_number, e.error) for e in done.errors] == [(1, "boom"), (2, "x")]
        assert done.errors[0].traceback == "tb"

    async def test_list_runs_pages_with_before_and_gives_event_ids(self, store: Any) -> None:
        """Listing with ``before`` (the last id of a page) pages through the runs newest
        first, none twice or skipped, filters still applied; ``event_ids`` gives each run's."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=2)])
        ids = await emit(store, "a", 13)
        created = await store.tasks.acreate_runs("t", 10)
        assert len(created) == 7
        seen: list[Any] = []
        before = None
        while True:
            page = await store.tasks.alist_runs(limit=3, before=before, event_ids=True)
            seen.extend(page)
            if len(page) < 3:
                break
            before = page[-1].id
        assert [r.id for r in seen] == sorted((r.id for r in created), reverse=True)
        assert sorted(e for r in seen for e in r.event_ids) == ids
        for run in seen:
            assert list(run.event_ids) == [
                e.id for e in (await store.tasks.aget_run(run.id)).events
            ]
        queued = await store.tasks.alist_runs(task="t", state="queued", before=seen[1].id)
        assert [r.id for r in queued] == [r.id for r in seen[2:]]
        assert all(r.event_ids == () for r in queued)  # only when asked for

    async def test_lapsed_try_does_not_count_against_retries(self, store: Any) -> None:
        """A try lost to the infrastructure (its lease lapsed) is recorded as worker_lost and
        tried again even with no retries left; the task's own failure then fails the run."""
        await self.ready(store, max_tries=1)
        await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        store.clock.advance(31)
        (again,) = await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL)
        assert (again.try_number, again.failures, again.lost_tries) == (2, 0, 1)
        assert [(e.try_number, e.cause) for e in again.errors] == [(1, "worker_lost")]
        done = await store.tasks.afinish_run(
            again.id, "w2", again.lease_token, success=False, error="x"
        )
        assert (done.state, done.failures, done.lost_tries) == ("failed", 1, 1)
        assert [e.cause for e in done.errors] == ["worker_lost", "task_error"]
        (listed,) = await store.tasks.alist_runs()
        assert (listed.failures, listed.lost_tries) == (1, 1)

    async def test_lost_tries_are_capped(self, store: Any) -> None:
        """A run lost to the infrastructure MAX_LOST_TRIES times fails for good (a task that
        kills its own worker is not retried forever)."""
        await self.ready(store, max_tries=1)
        await store.tasks.aclaim_runs("w0", limit=1, ttl=TTL)
        for n in range(1, MAX_LOST_TRIES):
            store.clock.advance(31)
            (run,) = await store.tasks.aclaim_runs(f"w{n}", limit=1, ttl=TTL)
            assert run.lost_tries == n and run.try_number == n + 1
        store.clock.advance(31)
        assert await store.tasks.aclaim_runs("w", limit=1, ttl=TTL) == []
        (failed,) = await store.tasks.alist_runs(state="failed")
        assert (failed.lost_tries, failed.failures, failed.try_number) == (
            MAX_LOST_TRIES,
            0,
            MAX_LOST_TRIES,
        )
        assert {e.cause for e in failed.errors} == {"worker_lost"}
        retried = await store.tasks.aretry_run(failed.id)  # one more try, of either kind
        assert retried.state == "queued" and retried.lost_tries == MAX_LOST_TRIES - 1
        (claimed,) = await store.tasks.aclaim_runs("w", limit=1, ttl=TTL)
        store.clock.advance(31)
        assert await store.tasks.aclaim_runs("w", limit=1, ttl=TTL) == []
        assert (await store.tasks.aget_run(claimed.id)).state == "failed"

    async def test_timeout_is_recorded_and_counts(self, store: Any) -> None:
        """A try the worker reports as a timeout is recorded with that cause and counts
        against the task's tries, as its errors do."""
        await self.ready(store, max_tries=2)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        queued = await store.tasks.afinish_run(
            run.id, "w1", run.lease_token, success=False, error="TimeoutError", cause="timeout"
        )
        assert (queued.state, queued.failures) == ("queued", 1)
        (run2,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        done = await store.tasks.afinish_run(
            run2.id, "w1", run2.lease_token, success=False, error="e"
        )
        assert done.state == "failed"
        assert [e.cause for e in done.errors] == ["timeout", "task_error"]

    async def test_retry_failed_run(self, store: Any) -> None:
        """Retrying a failed run queues it for one more try; other states are refused."""
        await self.ready(store, max_tries=1)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        with pytest.raises(RunStateError, match="running"):
            await store.tasks.aretry_run(run.id)
        await store.tasks.afinish_run(run.id, "w1", 1, success=False, error="boom")
        queued = await store.tasks.aretry_run(run.id)
        assert queued.state == "queued"
        (again,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        assert again.try_number == 2
        with pytest.raises(RunNotFoundError):
            await store.tasks.aretry_run(999)

    async def test_get_and_list_runs(self, store: Any) -> None:
        """A run shows its events; listings filter by task and state."""
        run = await self.ready(store)
        shown = await store.tasks.aget_run(run.id)
        assert [e.id for e in shown.events] == [e.id for e in run.events]
        assert [r.id for r in await store.tasks.alist_runs(task="t", state="queued")] == [run.id]
        assert await store.tasks.alist_runs(state="success") == []
        with pytest.raises(InvalidArgumentError, match="one of queued, running"):
            await store.tasks.alist_runs(state="bogus")


# Each call is refused by the shared checks (BaseStateBackend), the same on every backend.
BAD_CALLS: list[tuple[str, Callable[[Any], Awaitable[object]], type[Exception], str]] = [
    ("ack_negative", lambda s: s.tasks.aconsumer_ack("c", -1), InvalidArgumentError, "event_id"),
    ("ack_str_id", lambda s: s.tasks.aconsumer_ack("c", "1"), ArgumentTypeError, "event_id"),
    ("fetch_empty_name", lambda s: s.tasks.aconsumer_fetch(""), InvalidNameError, "consumer"),
    ("fetch_limit_0", lambda s: s.tasks.aconsumer_fetch("c", limit=0), InvalidArgumentError, "limit"),
    ("sync_not_spec", lambda s: s.tasks.async_tasks(["t"]), ArgumentTypeError, "TaskSpec"),
    ("rewind_to_0", lambda s: s.tasks.arewind_task("t", "a", 0), InvalidArgumentError, "to_event_id"),
    ("create_0_runs", lambda s: s.tasks.acreate_runs("t", 0), InvalidArgumentError, "max_runs"),
    ("claim_no_owner", lambda s: s.tasks.aclaim_runs("", limit=1, ttl=TTL), InvalidArgumentError,
     "owner"),
    ("heartbeat_str_id", lambda s: s.tasks.aheartbeat_runs("w", {"1": 1}, TTL), ArgumentTypeError,
     "run_id"),
    ("finish_bad_outlet", lambda s: s.tasks.afinish_run(1, "w", 1, success=True, outlets=["x"]),
     ArgumentTypeError, "OutletEvent"),
    ("finish_negative_delay", lambda s: s.tasks.afinish_run(
        1, "w", 1, success=False, retry_delay=timedelta(seconds=-1)), InvalidArgumentError,
     "retry_delay"),
    ("finish_lost_cause", lambda s: s.tasks.afinish_run(1, "w", 1, success=False,
        cause="worker_lost"), InvalidArgumentError, "cause"),
    ("get_run_0", lambda s: s.tasks.aget_run(0), InvalidArgumentError, "run_id"),
    ("list_limit_0", lambda s: s.tasks.alist_runs(limit=0), InvalidArgumentError, "limit"),
    ("list_before_0", lambda s: s.tasks.alist_runs(before=0), InvalidArgumentError, "before"),
    ("list_before_str", lambda s: s.tasks.alist_runs(before="9"), ArgumentTypeError, "before"),
    ("wait_negative", lambda s: s.events.await_events(0, -1), InvalidArgumentError, "wait"),
]  # fmt: skip


class TestArguments:
    @pytest.mark.parametrize(
        ("call", "error", "named"),
        [pytest.param(call, error, named, id=name) for name, call, error, named in BAD_CALLS],
    )
    async def test_bad_arguments_are_store_errors_and_change_nothing(
        self,
        store: Any,
        call: Callable[[Any], Awaitable[object]],
        error: type[Exception],
        named: str,
    ) -> None:
        """A bad argument raises a store error naming it, before anything is written."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        await emit(store, "a", 2)
        before = await snapshot(store)
        with pytest.raises(error, match=named) as caught:
            await call(store)
        assert isinstance(caught.value, StateStoreError)
        assert await snapshot(store) == before

    async def test_event_consumer_needs_the_capability(self) -> None:
        """An EventConsumer on a backend without the tasks service names what is missing."""
        async with BaseStateBackend() as plain:
            with pytest.raises(MissingCapabilityError, match="has no tasks"):
                EventConsumer(plain, "c")
