"""``GET /api/v1/runs`` pages through every run with a cursor, each run with its event ids."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventBatchCommit, TaskSpec, encode_json
from watchkeeper.triggerer.api import api_context, make_token, serve_app
from watchkeeper.triggerer.settings import ApiSettings

RUNS = 2253


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, list[int]]]:
    """A served API on a SQLite store holding RUNS runs of one event each; the client with
    a read token, and the ids of the events."""
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets([Asset("orders")])
        await backend.tasks.async_tasks([TaskSpec("load", ("orders",), max_events=1)])
        ids: list[int] = []
        for start in range(0, RUNS, 500):
            events = tuple(
                (encode_json({"n": n}), None) for n in range(start, min(start + 500, RUNS))
            )
            written = await backend.events.acommit_batch(
                EventBatchCommit("feed", ("orders",), events)
            )
            ids.extend(e.id for e in written)
        assert len(await backend.tasks.acreate_runs("load", RUNS)) == RUNS
        text, row = make_token("reader", ["read"], now=datetime.now(UTC))
        await backend.controls.acreate_token(row)
        ctx = api_context(backend, ApiSettings(port=0))
        async with anyio.create_task_group() as tg:
            port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
            headers = {"Authorization": f"Bearer {text}"}
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30
            ) as http:
                yield http, ids
            tg.cancel_scope.cancel()


async def test_every_run_listed_once_through_the_cursor(
    client: tuple[httpx.AsyncClient, list[int]],
) -> None:
    """2,253 runs read 1,000 at a time through ``before``/``next_before``: each run once,
    newest first, and their event ids cover every event exactly once."""
    http, event_ids = client
    seen: list[dict[str, Any]] = []
    pages = 0
    params: dict[str, Any] = {"limit": 1000}
    while True:
        response = await http.get("/api/v1/runs", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        pages += 1
        seen.extend(body["runs"])
        if body["next_before"] is None:
            assert body["more"] is False
            break
        assert body["more"] is True and body["next_before"] == body["runs"][-1]["id"]
        params["before"] = body["next_before"]
    run_ids = [r["id"] for r in seen]
    assert pages == 3 and len(run_ids) == RUNS
    assert run_ids == sorted(set(run_ids), reverse=True)  # no duplicate, newest first
    assert sorted(run_ids) == list(range(1, RUNS + 1))  # no gap
    listed = [e for r in seen for e in r["event_ids"]]
    assert sorted(listed) == sorted(event_ids) and len(listed) == len(set(listed))
    assert all(len(r["event_ids"]) == r["event_count"] == 1 for r in seen)


async def test_a_bad_cursor_is_a_400(client: tuple[httpx.AsyncClient, list[int]]) -> None:
    """``before`` must be a run id (an integer >= 1)."""
    http, _ = client
    for bad in ("0", "-3", "abc"):
        response = await http.get("/api/v1/runs", params={"before": bad})
        assert response.status_code == 400 and "before" in response.json()["detail"]
    last = (await http.get("/api/v1/runs", params={"before": 3})).json()
    assert [r["id"] for r in last["runs"]] == [2, 1] and last["next_before"] is None
