"""Edges of the task rules that a rewrite of a backend can lose without any other test
noticing, on memory, SQLite and PostgreSQL: an any-of schedule split into several runs at once,
and a lease renewed after it lapsed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from watchkeeper.store import Asset
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, TaskSpec, encode_json

from tests.support.clock import Clock

TTL = timedelta(seconds=30)


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    """The backend on a settable clock, with the assets ``a`` and ``b`` registered."""
    backend.clock = Clock()
    await backend.events.aregister_assets([Asset("a"), Asset("b")])
    yield backend


async def emit(store: Any, asset: str) -> int:
    commit = EventCommit("w", (asset,), encode_json({"on": asset}, what="payload"))
    (event,) = await store.events.acommit(commit)
    return int(event.id)


async def test_an_any_schedule_over_two_assets_hands_each_event_to_one_run(store: Any) -> None:
    """Two runs created in one call, one per asset's event; each asset's cursor moves past the
    event its run took, so a second call creates nothing and no event is handed out twice."""
    await store.tasks.async_tasks([TaskSpec("t", ("a", "b"), mode="any", max_events=1)])
    on_a, on_b = await emit(store, "a"), await emit(store, "b")
    runs = await store.tasks.acreate_runs("t", 2)
    assert sorted(e.id for r in runs for e in r.events) == [on_a, on_b]
    assert [len(r.events) for r in runs] == [1, 1]
    assert await store.tasks.acreate_runs("t", 2) == []
    (info,) = await store.tasks.alist_tasks()
    assert info.pending == {"a": 0, "b": 0}
    assert info.cursors == {"a": on_a, "b": on_b}


async def test_a_heartbeat_after_the_lease_lapsed_does_not_revive_it(store: Any) -> None:
    """Renewing 31 s into a 30 s lease is refused; another worker then claims the run as its
    second try, and the first worker's token no longer renews it."""
    await store.tasks.async_tasks([TaskSpec("t", ("a",), max_tries=3)])
    await emit(store, "a")
    await store.tasks.acreate_run("t")
    (run,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
    store.clock.advance(31)
    assert await store.tasks.aheartbeat_runs("w1", {run.id: run.lease_token}, TTL) == set()
    (again,) = await store.tasks.aclaim_runs("w2", limit=1, ttl=TTL)
    assert (again.id, again.try_number, again.lease_owner) == (run.id, 2, "w2")
    assert await store.tasks.aheartbeat_runs("w1", {run.id: run.lease_token}, TTL) == set()
    assert await store.tasks.aheartbeat_runs("w2", {run.id: again.lease_token}, TTL) == {run.id}
