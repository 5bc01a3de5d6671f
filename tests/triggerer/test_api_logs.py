"""``GET /api/v1/runs/{run_id}/logs``: a run's log chunks as a JSON page, or followed live.

A real server (uvicorn on a free port) over a real SQLite store: runs made, claimed and
finished through the store's own calls, their chunks appended as a worker appends them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskRun, TaskSpec, encode_json

from tests.support.api import ServedApi, serve_api

SCOPES = {
    "read": ["read"],
    "admin": ["admin"],
    "operate": ["operate"],
    "writer": ["write:asset:orders"],
}
DSN = "postgresql://app:hunter2@db.example/orders"

Served = ServedApi[SqliteStateBackend]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """The task ``load`` on ``orders`` (three tries), a token per scope, streams polled
    every 20 ms."""
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets([Asset("orders")])
        await backend.tasks.async_tasks([TaskSpec("load", ("orders",), max_events=1, max_tries=3)])
        async with serve_api(backend, SCOPES) as one:
            one.ctx.sse_poll = 0.02
            yield one


async def running_run(served: Served) -> TaskRun:
    """A new run of ``load`` (on a new event), claimed by worker ``w1``: its first try runs."""
    backend = served.backend
    await backend.events.acommit(EventCommit("feed", ("orders",), encode_json({"n": 1})))
    assert await backend.tasks.acreate_run("load") is not None
    (claimed,) = await backend.tasks.aclaim_runs("w1", limit=1, ttl=30, tasks=["load"])
    return claimed


async def finish(served: Served, run: TaskRun, *, ok: bool = True) -> None:
    await served.backend.tasks.afinish_run(
        run.id, "w1", run.lease_token, success=ok, error=None if ok else "ValueError: bad"
    )


async def frames(lines: AsyncIterator[str]) -> list[dict[str, Any]]:
    """Every frame of a stream until it closes: its ``id``, ``event`` and decoded ``data``."""
    found: list[dict[str, Any]] = []
    frame: dict[str, Any] = {}
    with anyio.fail_after(10):
        async for line in lines:
            if not line:
                if "data" in frame:
                    found.append(frame)
                frame = {}
            elif line.startswith("id: "):
                frame["id"] = int(line[4:])
            elif line.startswith("event: "):
                frame["event"] = line[7:]
            elif line.startswith("data: "):
                frame["data"] = json.loads(line[6:])
    return found


class TestPages:
    async def test_chunks_in_order_with_their_try_and_stream(self, served: Served) -> None:
        """The page holds each chunk once, in seq order, with its try, stream, text and
        time, and the run's state; a page cut by ``limit`` says there is more and where."""
        run = await running_run(served)
        logs = served.backend.logs
        await logs.aappend(run.id, 1, [("stdout", "loading 1\n"), ("stderr", "warning\n")])
        await logs.aappend(run.id, 1, [("log", "INFO loaded\n")])
        async with served.client("read") as client:
            whole = (await client.get(f"/api/v1/runs/{run.id}/logs")).json()
            first = (await client.get(f"/api/v1/runs/{run.id}/logs", params={"limit": 2})).json()
            rest = (
                await client.get(
                    f"/api/v1/runs/{run.id}/logs", params={"after": first["next_after"]}
                )
            ).json()
        chunks = whole["chunks"]
        assert [(c["try_number"], c["stream"], c["text"]) for c in chunks] == [
            (1, "stdout", "loading 1\n"),
            (1, "stderr", "warning\n"),
            (1, "log", "INFO loaded\n"),
        ]
        seqs = [c["seq"] for c in chunks]
        assert seqs == sorted(set(seqs)) and all(c["created_at"] for c in chunks)
        assert whole["state"] == "running" and whole["try_number"] == 1
        assert whole["more"] is False and whole["next_after"] == seqs[-1]
        assert first["more"] is True and [c["seq"] for c in first["chunks"]] == seqs[:2]
        assert [c["seq"] for c in rest["chunks"]] == seqs[2:] and rest["more"] is False

    async def test_one_try_of_several(self, served: Served) -> None:
        """``try=N`` gives only that try's chunks; without it, every try's in seq order."""
        run = await running_run(served)
        logs = served.backend.logs
        await logs.aappend(run.id, 1, [("stdout", "first try\n")])
        await finish(served, run, ok=False)  # retried: max_tries is 3
        (again,) = await served.backend.tasks.aclaim_runs("w1", limit=1, ttl=30)
        assert again.id == run.id and again.try_number == 2
        await logs.aappend(run.id, 2, [("stdout", "second try\n")])
        async with served.client("read") as client:
            two = (await client.get(f"/api/v1/runs/{run.id}/logs", params={"try": 2})).json()
            both = (await client.get(f"/api/v1/runs/{run.id}/logs")).json()
        assert [c["text"] for c in two["chunks"]] == ["second try\n"]
        assert [(c["try_number"], c["text"]) for c in both["chunks"]] == [
            (1, "first try\n"),
            (2, "second try\n"),
        ]

    async def test_passwords_in_urls_are_masked(self, served: Served) -> None:
        """A URL password a task printed is masked in the page, as in event payloads."""
        run = await running_run(served)
        await served.backend.logs.aappend(run.id, 1, [("stdout", f"connecting to {DSN}\n")])
        async with served.client("read") as client:
            body = (await client.get(f"/api/v1/runs/{run.id}/logs")).json()
        (chunk,) = body["chunks"]
        assert "hunter2" not in chunk["text"] and "db.example/orders" in chunk["text"]


class TestRefusals:
    async def test_unknown_run_is_404(self, served: Served) -> None:
        """An unknown run is 404 in the API's error shape, paged or followed."""
        async with served.client("read") as client:
            paged = await client.get("/api/v1/runs/999/logs")
            followed = await client.get("/api/v1/runs/999/logs", params={"follow": "true"})
        for response in (paged, followed):
            assert response.status_code == 404
            assert response.json() == {"error": "not_found", "detail": "no run with id 999"}

    @pytest.mark.parametrize("scope", ["operate", "writer"])
    async def test_a_token_without_read_is_refused(self, served: Served, scope: str) -> None:
        """Logs are data: ``operate`` or an asset's writer gets 403 and no text, paged or
        followed; ``read`` and ``admin`` get the text."""
        run = await running_run(served)
        await served.backend.logs.aappend(run.id, 1, [("stdout", "secret payload\n")])
        async with served.client(scope) as client:
            paged = await client.get(f"/api/v1/runs/{run.id}/logs")
            followed = await client.get(f"/api/v1/runs/{run.id}/logs", params={"follow": "true"})
        for response in (paged, followed):
            assert response.status_code == 403
            body = response.json()
            assert body["error"] == "forbidden" and "needs read" in body["detail"]
            assert "secret payload" not in response.text
        for allowed in ("read", "admin"):
            async with served.client(allowed) as client:
                response = await client.get(f"/api/v1/runs/{run.id}/logs")
            assert response.status_code == 200 and "secret payload" in response.text

    @pytest.mark.parametrize(
        ("params", "named"),
        [
            ({"follow": "yes"}, "follow"),
            ({"try": "0"}, "try"),
            ({"after": "-1"}, "after"),
            ({"limit": "1001"}, "limit"),
        ],
    )
    async def test_bad_parameters_are_400(
        self, served: Served, params: dict[str, str], named: str
    ) -> None:
        """A malformed parameter is 400 naming it, before any read."""
        run = await running_run(served)
        async with served.client("read") as client:
            response = await client.get(f"/api/v1/runs/{run.id}/logs", params=params)
        assert response.status_code == 400 and named in response.json()["detail"]


class TestFollow:
    async def test_the_stream_ends_once_the_run_finishes(self, served: Served) -> None:
        """Following a running run gives the chunks kept, then each new one as it is
        appended, each with its seq as the event id, and ends with an ``end`` frame once the
        run has finished and its last chunks are sent."""
        run = await running_run(served)
        logs = served.backend.logs
        await logs.aappend(run.id, 1, [("stdout", "one\n")])
        url = f"/api/v1/runs/{run.id}/logs"
        async with served.client("read") as client:
            async with client.stream("GET", url, params={"follow": "true"}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                lines = response.aiter_lines()
                with anyio.fail_after(10):
                    async for line in lines:
                        if line.startswith("data: "):
                            break  # the first chunk arrived: the stream is following
                await logs.aappend(run.id, 1, [("stdout", "two\n"), ("stderr", "three\n")])
                await logs.aappend(run.id, 1, [("log", "four\n")])
                await finish(served, run)
                rest = await frames(lines)
            seqs = [c["seq"] for c in (await client.get(url)).json()["chunks"]]
        streamed = [f for f in rest if f.get("event") == "log"]
        assert [f["data"]["text"] for f in streamed] == ["two\n", "three\n", "four\n"]
        assert [f["data"]["stream"] for f in streamed] == ["stdout", "stderr", "log"]
        assert [f["id"] for f in streamed] == [f["data"]["seq"] for f in streamed] == seqs[1:]
        assert rest[-1]["event"] == "end" and rest[-1]["data"]["state"] == "success"

    async def test_a_try_that_is_over_ends_its_stream(self, served: Served) -> None:
        """Following one try of a run that has moved on to its next try sends that try's
        chunks and ends, though the run still runs; following a finished run does too."""
        run = await running_run(served)
        logs = served.backend.logs
        await logs.aappend(run.id, 1, [("stdout", "a\n"), ("stdout", "b\n")])
        await finish(served, run, ok=False)  # retried: max_tries is 3
        (again,) = await served.backend.tasks.aclaim_runs("w1", limit=1, ttl=30)
        await logs.aappend(run.id, 2, [("stdout", "c\n")])
        url = f"/api/v1/runs/{run.id}/logs"
        async with served.client("read") as client:
            params = {"follow": "true", "try": "1"}
            async with client.stream("GET", url, params=params) as response:
                first = await frames(response.aiter_lines())
            await finish(served, again)
            async with client.stream("GET", url, params={"follow": "true"}) as response:
                whole = await frames(response.aiter_lines())
        assert [f["data"]["text"] for f in first if f.get("event") == "log"] == ["a\n", "b\n"]
        assert first[-1]["event"] == "end" and first[-1]["data"]["state"] == "running"
        texts = [f["data"]["text"] for f in whole if f.get("event") == "log"]
        assert texts == ["a\n", "b\n", "c\n"] and whole[-1]["data"]["state"] == "success"

    async def test_last_event_id_resumes_after_that_chunk(self, served: Served) -> None:
        """A reconnecting client sends ``Last-Event-ID``: the stream starts after that chunk
        (it wins over ``after``)."""
        run = await running_run(served)
        await served.backend.logs.aappend(
            run.id, 1, [("stdout", "a\n"), ("stdout", "b\n"), ("stdout", "c\n")]
        )
        await finish(served, run)
        url = f"/api/v1/runs/{run.id}/logs"
        async with served.client("read") as client:
            seqs = [c["seq"] for c in (await client.get(url)).json()["chunks"]]
            headers = {"Last-Event-ID": str(seqs[0])}
            params = {"follow": "true", "after": "0"}
            async with client.stream("GET", url, params=params, headers=headers) as response:
                found = await frames(response.aiter_lines())
        assert [f["id"] for f in found if f.get("event") == "log"] == seqs[1:]
        assert [f["data"]["text"] for f in found if f.get("event") == "log"] == ["b\n", "c\n"]

    async def test_streams_count_against_the_tokens_limit(self, served: Served) -> None:
        """A followed run holds one of its token's live streams: past the limit, 429."""
        run = await running_run(served)
        served.ctx.max_streams_per_token = 1
        url = f"/api/v1/runs/{run.id}/logs"
        async with (
            served.client("read") as client,
            client.stream("GET", url, params={"follow": "true"}) as first,
        ):
            assert first.status_code == 200
            second = await client.get(url, params={"follow": "true"})
            assert second.status_code == 429 and second.json()["error"] == "too_many_streams"
            assert (await client.get(url)).status_code == 200  # a page is not a stream
