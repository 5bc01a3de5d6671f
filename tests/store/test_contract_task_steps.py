"""The contract of a worker's step (``astep_runs``) on memory, SQLite and PostgreSQL: finish
a try and claim the next run in one transaction, creating runs when too few are ready.

As in :mod:`.test_contract_tasks`, time is the backend's own settable ``clock``; the last
class runs on PostgreSQL's own clock (``now()``), which run leases follow by default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest
from watchkeeper.store import (
    ArgumentTypeError,
    Asset,
    InvalidArgumentError,
    PostgresStateBackend,
    RunLeaseLostError,
    StateStoreError,
)
from watchkeeper.store.protocols import (
    BaseStateBackend,
    EventCommit,
    OutletEvent,
    RunOutcome,
    TaskSpec,
)
from watchkeeper.triggerer import WorkerSettings, configure_connections

from tests.support.clock import Clock

from .test_contract_tasks import TTL, emit, snapshot


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    backend.clock = Clock()
    await backend.events.aregister_assets([Asset("a"), Asset("b"), Asset("out")])
    yield backend


def ok(run: Any, *outlets: OutletEvent) -> RunOutcome:
    return RunOutcome(run.id, run.lease_token, True, tuple(outlets))


class TestStep:
    async def test_finish_and_claim_the_next_in_one_step(self, store: Any) -> None:
        """The finished run succeeds, with its outlet, and the next ready run is claimed."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
        await emit(store, "a", 2)
        await store.tasks.acreate_runs("t", 2)
        (first,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        step = await store.tasks.astep_runs(
            "w1", finish=ok(first, OutletEvent("out")), claim=1, ttl=TTL
        )
        assert step.finished.state == "success" and step.finished.id == first.id
        (second,) = step.claimed
        assert second.id != first.id and second.lease_owner == "w1"
        assert (second.state, second.try_number, len(second.events)) == ("running", 1, 1)
        (event,) = await store.events.alist_events(asset="out")
        assert step.finished.outlet_event_ids == (event.id,)

    async def test_creates_and_claims_when_too_few_are_ready(self, store: Any) -> None:
        """With ``create``, a step makes runs from the pending events and claims from them;
        the runs it does not claim stay queued, and every event is in exactly one run. The
        step says how many it created."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=2)])
        ids = await emit(store, "a", 7)
        step = await store.tasks.astep_runs("w1", claim=2, ttl=TTL, create=3)
        assert [[e.id for e in r.events] for r in step.claimed] == [ids[0:2], ids[2:4]]
        assert step.created == 3
        (queued,) = await store.tasks.alist_runs(state="queued")
        assert queued.event_count == 2
        (info,) = await store.tasks.alist_tasks()
        assert info.pending == {"a": 1}  # the seventh waits for the next creation
        step = await store.tasks.astep_runs("w2", claim=5, ttl=TTL, create=3)
        assert sorted(e.id for r in step.claimed for e in r.events) == ids[4:]
        assert step.created == 1  # the queued one was claimed, the seventh event made one
        step = await store.tasks.astep_runs("w2", claim=1, ttl=TTL, create=3)
        assert (step.claimed, step.created) == ((), 0)

    @pytest.mark.parametrize("named", [None, ["t"], ["t", "u"]])
    async def test_creation_for_one_or_several_tasks_named(
        self, store: Any, named: list[str] | None
    ) -> None:
        """Whether the step names no task, the one task or several, a one-asset task's runs
        take its events in order, ``max_events`` each, and claim the first ones; a task on
        two assets named with it gets its runs too."""
        await store.tasks.async_tasks(
            [TaskSpec("t", ("a",), max_events=2), TaskSpec("u", ("a", "b"), max_events=10)]
        )
        ids = await emit(store, "a", 5)
        b_ids = await emit(store, "b", 1)
        step = await store.tasks.astep_runs("w1", claim=2, ttl=TTL, tasks=named, create=4)
        assert step.created == (3 if named == ["t"] else 4)  # t: 3 runs; u: 1
        mine = [[e.id for e in r.events] for r in step.claimed if r.task == "t"]
        assert mine[0] == ids[0:2]
        runs = await store.tasks.alist_runs(task="t")
        assert sorted(r.event_count for r in runs) == [1, 2, 2]
        (info_t, info_u) = await store.tasks.alist_tasks()
        assert info_t.pending == {"a": 0}
        if named == ["t"]:
            assert await store.tasks.alist_runs(task="u") == []
            assert info_u.pending == {"a": 5, "b": 1}
        else:
            (run_u,) = await store.tasks.alist_runs(task="u")
            assert run_u.event_count == len(ids) + len(b_ids)
            assert info_u.pending == {"a": 0, "b": 0}

    async def test_two_workers_creating_at_once_share_every_event_once(self, store: Any) -> None:
        """Steps of several workers creating runs of one task side by side: every event is
        in exactly one run, and each run in one worker's claim at most."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=3)])
        ids = await emit(store, "a", 40)
        claimed: list[Any] = []

        async def worker(owner: str) -> None:
            for _ in range(6):
                step = await store.tasks.astep_runs(owner, claim=2, ttl=TTL, tasks=["t"], create=2)
                claimed.extend(step.claimed)

        async with anyio.create_task_group() as tg:
            for owner in ("w1", "w2", "w3"):
                tg.start_soon(worker, owner)
        runs = await store.tasks.alist_runs(task="t")
        owned = [e.id for r in runs for e in (await store.tasks.aget_run(r.id)).events]
        assert sorted(owned) == ids  # each event once, none skipped
        assert len({r.id for r in claimed}) == len(claimed)

    async def test_steps_side_by_side_each_finish_fenced_claims_shared(self, store: Any) -> None:
        """Steps sent at once (SQLite runs neighbouring steps as one, PostgreSQL its plain
        successes as one statement): each finish is fenced on its own, so a refused one fails
        alone with nothing written; the others finish, and the ready runs are shared among
        their claims, each run claimed once."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
        await emit(store, "a", 9)
        await store.tasks.acreate_runs("t", 9)
        mine = await store.tasks.aclaim_runs("w1", limit=3, ttl=TTL)
        (theirs,) = await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL)
        stale = RunOutcome(mine[1].id, mine[1].lease_token + 1, True)
        calls: list[dict[str, Any]] = [
            {"owner": "w1", "finish": ok(mine[0]), "claim": 1},
            {"owner": "w1", "finish": stale, "claim": 1},
            {"owner": "w1", "finish": ok(mine[2], OutletEvent("out")), "claim": 2},
            {"owner": "w2", "finish": ok(theirs), "claim": 1},
        ]
        results: list[Any] = [None] * len(calls)
        batches = getattr(store, "commit_stats", None)

        async def one(i: int) -> None:
            try:
                results[i] = await store.tasks.astep_runs(ttl=TTL, **calls[i])
            except RunLeaseLostError as exc:
                results[i] = exc

        async with anyio.create_task_group() as tg:
            for i in range(len(calls)):
                tg.start_soon(one, i)
        assert isinstance(results[1], RunLeaseLostError)
        assert [len(r.claimed) for r in (results[0], results[2], results[3])] == [1, 2, 1]
        claimed = [run for r in (results[0], results[2], results[3]) for run in r.claimed]
        assert len({run.id for run in claimed}) == 4
        assert {run.lease_owner for run in results[3].claimed} == {"w2"}
        assert {results[i].finished.state for i in (0, 2, 3)} == {"success"}
        (event,) = await store.events.alist_events(asset="out")
        assert results[2].finished.outlet_event_ids == (event.id,)
        refused = await store.tasks.aget_run(mine[1].id)
        assert (refused.state, refused.lease_owner) == ("running", "w1")
        assert len(await store.tasks.alist_runs(state="queued")) == 1
        if batches is not None and store.__class__.__name__ == "SqliteStateBackend":
            assert store.commit_stats.batches == batches.batches + 1  # one transaction
        if isinstance(store, PostgresStateBackend):  # the plain successes: the writer's (.steps)
            assert batches is not None
            assert store.commit_stats.writes == batches.writes + 3

    async def test_finish_then_create_when_none_is_ready(self, store: Any) -> None:
        """A plain success whose claim finds nothing ready creates runs from the pending
        events and claims one (on PostgreSQL, after its finish went in a group)."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
        ids = await emit(store, "a", 1)
        (run,) = (
            await store.tasks.astep_runs("w1", claim=1, ttl=TTL, create=1, tasks=["t"])
        ).claimed
        more = await emit(store, "a", 2)
        step = await store.tasks.astep_runs("w1", finish=ok(run), claim=1, ttl=TTL, create=4)
        assert step.finished.state == "success" and step.created == 2
        (claimed,) = step.claimed
        assert [e.id for e in claimed.events] == more[:1] and ids[0] not in more
        (queued,) = await store.tasks.alist_runs(state="queued")
        assert [e.id for e in (await store.tasks.aget_run(queued.id)).events] == more[1:]

    async def test_without_create_only_ready_runs_are_claimed(self, store: Any) -> None:
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        await emit(store, "a", 2)
        assert (await store.tasks.astep_runs("w1", claim=4, ttl=TTL)).claimed == ()
        assert await store.tasks.alist_runs() == []

    async def test_paused_task_gets_nothing_created(self, store: Any) -> None:
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        await emit(store, "a", 2)
        await store.tasks.aset_task_paused("t", True)
        assert (await store.tasks.astep_runs("w1", claim=4, ttl=TTL, create=4)).claimed == ()
        assert await store.tasks.alist_runs() == []

    async def test_refused_finish_claims_nothing_and_changes_nothing(self, store: Any) -> None:
        """A finish whose lease moved fails the whole step: no success, no outlet, no claim."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
        await emit(store, "a", 2)
        await store.tasks.acreate_runs("t", 2)
        (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
        store.clock.advance(31)
        before = await snapshot(store)
        with pytest.raises(RunLeaseLostError, match="expired"):
            await store.tasks.astep_runs(
                "w1", finish=ok(run, OutletEvent("out")), claim=1, ttl=TTL, create=2
            )
        assert await snapshot(store) == before

    @pytest.mark.parametrize(
        ("kwargs", "error", "named"),
        [
            ({"finish": "run 1"}, ArgumentTypeError, "RunOutcome"),
            ({"finish": RunOutcome(0, 1, True)}, InvalidArgumentError, "run_id"),
            ({"finish": RunOutcome(1, 1, True, ("out",))}, ArgumentTypeError, "OutletEvent"),  # type: ignore[arg-type]
            ({"claim": -1}, InvalidArgumentError, "claim"),
            ({"claim": 1, "create": 1.5}, ArgumentTypeError, "create"),
            ({"claim": 1, "ttl": 0}, InvalidArgumentError, "ttl"),
        ],
    )
    async def test_bad_arguments_change_nothing(
        self, store: Any, kwargs: dict[str, Any], error: type[Exception], named: str
    ) -> None:
        await store.tasks.async_tasks([TaskSpec("t", ("a",))])
        await emit(store, "a", 2)
        before = await snapshot(store)
        with pytest.raises(error, match=named) as caught:
            await store.tasks.astep_runs("w1", **{"ttl": TTL, **kwargs})
        assert isinstance(caught.value, StateStoreError)
        assert await snapshot(store) == before


class TestDatabaseClock:
    """On PostgreSQL, with the backend's default clock, run leases follow ``now()``."""

    async def test_leases_on_the_database_clock(self, pg_dsn: str, pg_schema: str) -> None:
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as store:
            await store.events.aregister_assets([Asset("a")])
            await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1, max_tries=2)])
            await store.events.acommit(EventCommit("w", ("a",), "{}"))
            await store.events.acommit(EventCommit("w", ("a",), "{}"))
            (run,) = (await store.tasks.astep_runs("w1", claim=1, ttl=30, create=2)).claimed
            conn = await asyncpg.connect(pg_dsn)
            try:
                db_now: datetime = await conn.fetchval("SELECT now()")
            finally:
                await conn.close()
            assert run.lease_expires_at is not None and run.started_at is not None
            assert run.lease_expires_at - run.started_at == timedelta(seconds=30)
            assert abs(run.started_at - db_now) < timedelta(seconds=5)
            assert await store.tasks.aheartbeat_runs("w1", {run.id: run.lease_token}, 30) == {
                run.id
            }
            assert await store.tasks.abreak_run_leases(["w1"]) == 1
            with pytest.raises(RunLeaseLostError, match="expired"):
                await store.tasks.afinish_run(run.id, "w1", run.lease_token, success=True)
            step = await store.tasks.astep_runs("w2", claim=2, ttl=30)
            assert sorted((r.lease_owner, r.try_number) for r in step.claimed) == [
                ("w2", 1),
                ("w2", 2),
            ]
            assert "lapsed" in (await store.tasks.aget_run(run.id)).errors[0].error
            assert datetime.now(UTC) - run.started_at < timedelta(minutes=1)

    async def test_worker_sessions_are_named_and_bounded(self, pg_dsn: str, pg_schema: str) -> None:
        """A worker's connections carry its name and an idle-in-transaction timeout."""
        backend = PostgresStateBackend(pg_dsn, schema=pg_schema)
        configure_connections(backend, WorkerSettings(lease_ttl=20), "watchkeeper worker")
        async with backend:
            await backend.events.aregister_assets([Asset("a")])
            pool = backend._pool
            assert pool is not None
            async with pool.acquire() as conn:
                assert await conn.fetchval("SHOW application_name") == "watchkeeper worker"
                assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "20s"


class TestNoRetry:
    async def test_a_failure_not_worth_retrying_fails_the_run_at_once(self, store: Any) -> None:
        """``retry=False`` (the task's ``retry_on`` does not name the error): the run fails on
        its first failed try with tries left, its error recorded as final; ``retry=True``
        (the default) queues it again."""
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1, max_tries=5)])
        await emit(store, "a", 2)
        await store.tasks.acreate_runs("t", 2)
        first, second = await store.tasks.aclaim_runs("w1", limit=2, ttl=TTL)
        fatal = RunOutcome(
            first.id, first.lease_token, False, error="ValueError: bad row", retry=False
        )
        step = await store.tasks.astep_runs("w1", finish=fatal, claim=0, ttl=TTL)
        assert step.finished.state == "failed"
        assert [(e.error, e.final) for e in step.finished.errors] == [("ValueError: bad row", True)]
        retried = RunOutcome(second.id, second.lease_token, False, error="ConnectionError")
        step = await store.tasks.astep_runs("w1", finish=retried, claim=0, ttl=TTL)
        assert step.finished.state == "queued"
