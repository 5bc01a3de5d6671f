"""``DELETE /api/v1/tasks/{name}``: a task forgotten for good (its cursors and pending events;
its runs kept), as ``watchkeeper tasks delete`` does; refused requests change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskSpec, encode_json

from tests.support.api import ServedApi, serve_api

Site = ServedApi[SqliteStateBackend]


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    """Task ``load`` with a finished run and an event pending, task ``busy`` with a run a
    worker holds; a read token and an operate token."""
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets([Asset("orders")])
        await backend.tasks.async_tasks(
            [TaskSpec("load", ("orders",), max_events=1), TaskSpec("busy", ("orders",))]
        )
        for n in range(2):
            await backend.events.acommit(EventCommit("feed", ("orders",), encode_json({"n": n})))
        await backend.tasks.acreate_runs("load", 1)
        await backend.tasks.acreate_runs("busy", 1)
        for run in await backend.tasks.aclaim_runs("w", limit=2, ttl=30):
            if run.task == "load":
                await backend.tasks.afinish_run(run.id, "w", run.lease_token, success=True)
        async with serve_api(backend, {"reader": ["read"], "ops": ["operate"]}) as served:
            yield served


async def snapshot(site: Site) -> tuple[object, ...]:
    tasks = await site.backend.tasks.alist_tasks()
    runs = await site.backend.tasks.alist_runs()
    return tuple((t.name, dict(t.cursors), dict(t.pending)) for t in tasks), tuple(
        (r.id, r.task, r.state) for r in runs
    )


async def test_delete_forgets_the_task_and_keeps_its_runs(site: Site) -> None:
    """An operate token deletes ``load`` (204): the task is no longer listed, its run is."""
    _, runs_before = await snapshot(site)
    async with site.client("ops") as client:
        done = await client.delete("/api/v1/tasks/load")
        listed = await client.get("/api/v1/tasks")
        again = await client.delete("/api/v1/tasks/load")
    assert done.status_code == 204, done.text
    assert [t["name"] for t in listed.json()["tasks"]] == ["busy"]
    assert again.status_code == 404
    _, runs_after = await snapshot(site)
    assert runs_after == runs_before


async def test_refused_deletes_change_nothing(site: Site) -> None:
    """No token 401, a read token 403, an unknown task 404 naming it, a task with a running
    run 409 naming the run: nothing changes."""
    before = await snapshot(site)
    async with site.client() as client:
        anonymous = await client.delete("/api/v1/tasks/load")
    async with site.client("reader") as client:
        reader = await client.delete("/api/v1/tasks/load")
    async with site.client("ops") as client:
        unknown = await client.delete("/api/v1/tasks/nope")
        busy = await client.delete("/api/v1/tasks/busy")
    assert (anonymous.status_code, reader.status_code) == (401, 403)
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["detail"]
    assert busy.status_code == 409 and "run" in busy.json()["detail"]
    assert await snapshot(site) == before
