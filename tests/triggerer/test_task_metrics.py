"""The task series of ``/metrics`` on every backend: counters never go down across scrapes,
whatever happens to the runs (failures, lost tries, retries); current counts are gauges."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from watchkeeper.store import Asset
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, TaskSpec, encode_json
from watchkeeper.triggerer.api._metrics import Metrics

from tests.support.clock import Clock

TTL = timedelta(seconds=30)
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    store: Any = backend
    store.clock = Clock()
    await store.events.aregister_assets([Asset("a")])
    await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1, max_tries=1)])
    yield store


async def emit(store: Any, n: int) -> None:
    for i in range(n):
        await store.events.acommit(EventCommit("w", ("a",), encode_json({"i": i})))


async def scrape(store: Any) -> tuple[Scrape, dict[str, str]]:
    """Every sample (by name and labels) and every family's type."""
    metrics = Metrics(store)
    await metrics.prepare()
    found: Scrape = {}
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
            kinds[sample.name] = family.type
    return found, kinds


def get(found: Scrape, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted({"task": "t", **labels}.items())))]


async def fail(store: Any, run: Any, cause: str = "task_error") -> None:
    await store.tasks.afinish_run(
        run.id, "w", run.lease_token, success=False, error="e", cause=cause
    )


async def test_counters_never_decrease_as_runs_fail_and_are_retried(store: Any) -> None:
    """Scrapes between failures, a lost try, a retry of a failed run and successes: no
    counter or histogram sample ever goes down, and each counts what happened; the runs by
    state are a gauge (its failed count drops when the failed run is retried)."""
    await emit(store, 3)
    await store.tasks.acreate_runs("t", 3)
    scrapes = [await scrape(store)]
    first, second, third = [r.id for r in await store.tasks.aclaim_runs("w", limit=3, ttl=TTL)]
    await fail(store, await store.tasks.aget_run(first))
    store.clock.advance(31)  # the lease of the other two lapses: lost tries, claimed again
    again = {r.id: r for r in await store.tasks.aclaim_runs("w2", limit=2, ttl=TTL)}
    store.clock.advance(2)
    await store.tasks.afinish_run(second, "w2", again[second].lease_token, success=True)
    scrapes.append(await scrape(store))
    await store.tasks.aretry_run(first)  # failed -> queued: the failed gauge drops
    scrapes.append(await scrape(store))
    (retried,) = await store.tasks.aclaim_runs("w", limit=1, ttl=TTL)
    await store.tasks.afinish_run(
        retried.id, "w", retried.lease_token, success=False, error="slow", cause="timeout"
    )
    await store.tasks.afinish_run(third, "w2", again[third].lease_token, success=True)
    await emit(store, 1)  # pending, 7 seconds old at the last scrape
    store.clock.advance(7)
    scrapes.append(await scrape(store))

    for (before, kinds), (after, _) in itertools.pairwise(scrapes):
        for key, value in before.items():
            if kinds[key[0]] in ("counter", "histogram"):
                assert after[key] >= value, (key, value, after[key])
    assert [get(s, "watchkeeper_task_runs", state="failed") for s, _ in scrapes] == [0, 1, 0, 1]
    last, kinds = scrapes[-1]
    assert kinds["watchkeeper_task_runs"] == "gauge"
    assert kinds["watchkeeper_task_runs_finished_total"] == "counter"
    assert get(last, "watchkeeper_task_runs_finished_total", outcome="success") == 2
    assert get(last, "watchkeeper_task_runs_finished_total", outcome="failed") == 2
    assert get(last, "watchkeeper_task_tries_total", cause="task_error") == 1
    assert get(last, "watchkeeper_task_tries_total", cause="timeout") == 1
    assert get(last, "watchkeeper_task_tries_total", cause="worker_lost") == 2
    assert get(last, "watchkeeper_task_run_duration_seconds_count") == 2
    assert get(last, "watchkeeper_task_run_duration_seconds_bucket", le="1.0") == 0
    assert get(last, "watchkeeper_task_run_duration_seconds_bucket", le="5.0") == 2
    assert get(last, "watchkeeper_task_oldest_pending_event_age_seconds") == 7
    assert get(last, "watchkeeper_task_pending_events", asset="a") == 1
    assert get(scrapes[0][0], "watchkeeper_task_oldest_pending_event_age_seconds") == 0
