"""``POST /api/v1/tasks/{name}/retry``: every failed run of a task queued for one more try,
as ``watchkeeper runs retry --task`` does; refused requests change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskSpec, encode_json

from tests.support.api import ServedApi, serve_api


@dataclass
class Site(ServedApi[SqliteStateBackend]):
    failed: list[int] = field(default_factory=list)
    succeeded: int = 0


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    """Task ``load`` (one try per run) with two failed runs and a successful one; task
    ``other`` with one failed run; a read token and an operate token."""
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets([Asset("orders")])
        await backend.tasks.async_tasks(
            [
                TaskSpec("load", ("orders",), max_events=1, max_tries=1),
                TaskSpec("other", ("orders",), max_events=3, max_tries=1),
            ]
        )
        for n in range(3):
            await backend.events.acommit(EventCommit("feed", ("orders",), encode_json({"n": n})))
        await backend.tasks.acreate_runs("load", 3)
        await backend.tasks.acreate_runs("other", 1)
        claimed = await backend.tasks.aclaim_runs("w", limit=4, ttl=30)
        loads = [run for run in claimed if run.task == "load"]
        for run in claimed:
            ok = run is loads[-1]
            await backend.tasks.afinish_run(
                run.id, "w", run.lease_token, success=ok, error=None if ok else "boom"
            )
        async with serve_api(backend, {"reader": ["read"], "ops": ["operate"]}) as served:
            yield Site(
                served.backend, served.ctx, served.base, served.tokens,
                [run.id for run in loads[:-1]], loads[-1].id,
            )  # fmt: skip


async def states(site: Site) -> dict[int, tuple[str, str]]:
    return {r.id: (r.task, r.state) for r in await site.backend.tasks.alist_runs()}


async def test_retry_queues_every_failed_run_of_the_task(site: Site) -> None:
    """An operate token gets 202 with the ids of the task's failed runs, oldest first; they
    are queued again, its successful run and the other task's failed run are left alone; a
    second call finds nothing to retry."""
    async with site.client("ops") as client:
        done = await client.post("/api/v1/tasks/load/retry", params={"state": "failed"})
        again = await client.post("/api/v1/tasks/load/retry")
    assert done.status_code == 202, done.text
    assert done.json() == {"task": "load", "retried": sorted(site.failed)}
    assert again.status_code == 202 and again.json()["retried"] == []
    found = await states(site)
    assert [found[i] for i in site.failed] == [("load", "queued")] * 2
    assert found[site.succeeded] == ("load", "success")
    assert [s for t, s in found.values() if t == "other"] == ["failed"]


async def test_refused_requests_change_nothing(site: Site) -> None:
    """No token 401, a read token 403, an unknown task 404 naming it, a state other than
    failed 400 naming it; no run moves."""
    before = await states(site)
    async with site.client() as client:
        anonymous = await client.post("/api/v1/tasks/load/retry")
    async with site.client("reader") as client:
        reader = await client.post("/api/v1/tasks/load/retry")
    async with site.client("ops") as client:
        unknown = await client.post("/api/v1/tasks/nope/retry")
        state = await client.post("/api/v1/tasks/load/retry", params={"state": "success"})
    assert (anonymous.status_code, reader.status_code) == (401, 403)
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["detail"]
    assert state.status_code == 400 and "'success'" in state.json()["detail"]
    assert await states(site) == before
