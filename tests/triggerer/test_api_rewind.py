"""``POST /api/v1/tasks/{name}/rewind``: a rewind only moves a task's cursor back; anything
else is refused (409; a missing parameter 400) naming what was wrong, and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskSpec, encode_json

from tests.support.api import ServedApi, serve_api


@dataclass
class Site(ServedApi[SqliteStateBackend]):
    events: list[int] = field(default_factory=list)


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    """Task ``load`` on ``orders`` (one event per run) whose two runs took both events, so
    its cursor is at the last one; a read token and an operate token."""
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets([Asset("orders"), Asset("bills")])
        await backend.tasks.async_tasks([TaskSpec("load", ("orders",), max_events=1)])
        ids: list[int] = []
        for n in range(2):
            commit = EventCommit("feed", ("orders",), encode_json({"n": n}))
            ids.extend(e.id for e in await backend.events.acommit(commit))
        assert len(await backend.tasks.acreate_runs("load", 2)) == 2
        async with serve_api(backend, {"reader": ["read"], "ops": ["operate"]}) as served:
            yield Site(served.backend, served.ctx, served.base, served.tokens, ids)


async def cursors(site: Site) -> Any:
    (info,) = await site.backend.tasks.alist_tasks()
    return dict(info.cursors), dict(info.pending)


async def test_rewind_past_the_cursor_is_refused(site: Site) -> None:
    """An id past the end of the log or after the cursor, or an asset outside the schedule,
    is a 409 (the request is well formed; the task's state refuses it) with the store's
    one-line reason; a missing parameter is a 400; the cursor stays where it was."""
    before = await cursors(site)
    path = "/api/v1/tasks/load/rewind"
    cases: list[tuple[dict[str, str | int], int, str]] = [
        ({"asset": "orders", "to_event": 999999999999}, 409, "past the end of the log"),
        ({"asset": "orders", "to_event": site.events[-1] + 1}, 409, "past the end of the log"),
        ({"asset": "bills", "to_event": site.events[0]}, 409, "not in the schedule of task"),
        ({"asset": "orders"}, 400, "to_event is required"),
        ({"to_event": 1}, 400, "asset is required"),
    ]
    async with site.client("ops") as client:
        for params, status, says in cases:
            response = await client.post(path, params=params)
            assert response.status_code == status, response.text
            detail = response.json()["detail"]
            assert says in detail and "\n" not in detail
        missing = await client.post("/api/v1/tasks/nope/rewind", params=cases[0][0])
    assert missing.status_code == 404
    assert await cursors(site) == before


async def test_rewind_needs_operate_and_moves_back(site: Site) -> None:
    """Without a token 401, with a read token 403; an operate token rewinds to the first
    event, and both events are pending again."""
    params: dict[str, str | int] = {"asset": "orders", "to_event": site.events[0]}
    async with site.client() as client:
        anonymous = await client.post("/api/v1/tasks/load/rewind", params=params)
    async with site.client("reader") as client:
        refused = await client.post("/api/v1/tasks/load/rewind", params=params)
    assert (anonymous.status_code, refused.status_code) == (401, 403)
    async with site.client("ops") as client:
        done = await client.post("/api/v1/tasks/load/rewind", params=params)
    assert done.status_code == 200, done.text
    assert done.json()["pending"] == {"orders": 2}
    assert await cursors(site) == ({"orders": site.events[0] - 1}, {"orders": 2})
