"""The HTTP API over a real server (uvicorn on a free port) and a real SQLite store.

Every route: status codes, scopes (a token scoped to one asset reaches no other asset's state
through any route), ETag/If-Match compare-and-set, event pagination and the Server-Sent
Events stream with Last-Event-ID.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar

import anyio
import httpx
import pytest
from structlog.testing import capture_logs
from watchkeeper.store import Asset, AssetScope, SqliteStateBackend
from watchkeeper.store.protocols import (
    DaemonStatus,
    EventCommit,
    TaskSpec,
    TriggerStatus,
    encode_json,
)
from watchkeeper.triggerer.api import ApiContext, api_context, make_token, serve_app
from watchkeeper.triggerer.settings import ApiSettings

ASSETS = [Asset("orders"), Asset("orders_eu"), Asset("bills")]


@dataclass
class Api:
    backend: SqliteStateBackend
    ctx: ApiContext
    base: str
    tokens: dict[str, str]

    def client(self, token: str | None = None) -> httpx.AsyncClient:
        headers = {} if token is None else {"Authorization": f"Bearer {self.tokens[token]}"}
        return httpx.AsyncClient(base_url=self.base, headers=headers, timeout=10)

    async def commit(self, asset: str, n: int) -> None:
        await self.backend.events.acommit(
            EventCommit(watcher="feed", assets=(asset,), payload_json=encode_json({"n": n}))
        )


SCOPES = {
    "admin": ["admin"],
    "reader": ["read"],
    "ops": ["operate"],
    "orders": ["write:asset:orders"],
    "eu": ["write:asset:orders_*"],
    "pusher": ["push:asset:orders"],
}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    """A served API on a fresh SQLite store with three assets and a token per scope."""
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets(ASSETS)
        tokens: dict[str, str] = {}
        now = datetime.now(UTC)
        for name, scopes in SCOPES.items():
            text, row = make_token(name, scopes, now=now)
            await backend.controls.acreate_token(row)
            tokens[name] = text
        ctx = api_context(backend, ApiSettings(port=0))
        ctx.sse_poll = 0.02
        async with anyio.create_task_group() as tg:
            port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
            yield Api(backend, ctx, f"http://127.0.0.1:{port}", tokens)
            tg.cancel_scope.cancel()


class TestHealth:
    async def test_healthz_and_readyz_need_no_token(self, api: Api) -> None:
        """Liveness and readiness answer 200 without a token while the store answers."""
        async with api.client() as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}

    async def test_readyz_is_503_with_the_reason_when_the_store_is_closed(
        self, tmp_path: Path
    ) -> None:
        """A store that does not answer makes /readyz 503 naming the store."""
        backend = SqliteStateBackend(tmp_path / "closed.db")  # never opened
        ctx = api_context(backend, ApiSettings(port=0))
        async with anyio.create_task_group() as tg:
            port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                response = await client.get("/readyz")
            tg.cancel_scope.cancel()
        assert response.status_code == 503
        body = response.json()
        assert body["error"] == "not_ready" and body["detail"].startswith("store: ")

    async def test_unknown_route_is_a_json_404(self, api: Api) -> None:
        """A path no route has is a JSON error, not an HTML page."""
        async with api.client("admin") as client:
            response = await client.get("/api/v1/nothing")
        assert response.status_code == 404
        assert response.json()["error"] == "not_found"


class TestAuthentication:
    ROUTES: ClassVar = [
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/api/v1/assets"),
        ("GET", "/api/v1/assets/orders"),
        ("GET", "/api/v1/assets/orders/state"),
        ("GET", "/api/v1/assets/orders/state/wm"),
        ("PUT", "/api/v1/assets/orders/state/wm"),
        ("DELETE", "/api/v1/assets/orders/state/wm"),
        ("GET", "/api/v1/events"),
        ("GET", "/api/v1/events/stream"),
        ("GET", "/api/v1/watchers"),
        ("POST", "/api/v1/watchers/feed/pause"),
        ("POST", "/api/v1/watchers/feed/resume"),
        ("POST", "/api/v1/watchers/feed/retry"),
        ("GET", "/api/v1/daemons"),
        ("GET", "/api/v1/tasks"),
        ("POST", "/api/v1/tasks/load/pause"),
        ("POST", "/api/v1/tasks/load/resume"),
        ("GET", "/api/v1/runs"),
        ("GET", "/api/v1/runs/1"),
        ("POST", "/api/v1/runs/1/retry"),
    ]

    @pytest.mark.parametrize(("method", "path"), ROUTES)
    async def test_every_route_needs_a_token(self, api: Api, method: str, path: str) -> None:
        """Without a token, and with a forged one, every /api/v1 route answers 401 in JSON."""
        forged = "wk_0123456789abcdef_" + "A" * 43
        async with api.client() as client:
            missing = await client.request(method, path, json=1)
            wrong = await client.request(
                method, path, json=1, headers={"Authorization": f"Bearer {forged}"}
            )
        for response in (missing, wrong):
            assert response.status_code == 401
            assert set(response.json()) == {"error", "detail"}
            assert response.headers["www-authenticate"].startswith("Bearer")

    async def test_revoked_and_expired_tokens_are_refused(self, api: Api) -> None:
        """A revoked token and an expired one both get 401."""
        old, row = make_token("old", ["read"], now=datetime.now(UTC) - timedelta(days=2))
        expired_text, expired = make_token(
            "expired", ["read"], now=datetime.now(UTC) - timedelta(days=2), expires_in=timedelta(1)
        )
        await api.backend.controls.acreate_token(row)
        await api.backend.controls.acreate_token(expired)
        async with api.client() as client:
            auth = {"Authorization": f"Bearer {old}"}
            assert (await client.get("/api/v1/assets", headers=auth)).status_code == 200
            await api.backend.controls.arevoke_token("old")
            assert (await client.get("/api/v1/assets", headers=auth)).status_code == 401
            auth = {"Authorization": f"Bearer {expired_text}"}
            assert (await client.get("/api/v1/assets", headers=auth)).status_code == 401

    async def test_tokens_never_reach_the_logs(
        self, api: Api, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Neither a valid nor a wrong token appears in any log record of the requests."""
        caplog.set_level(logging.DEBUG)
        wrong = "wk_0123456789abcdef_" + "B" * 43
        with capture_logs() as logs:
            async with api.client("admin") as client:
                await client.put("/api/v1/assets/orders/state/wm", json=1)
                await client.get("/api/v1/assets", headers={"Authorization": f"Bearer {wrong}"})
        text = caplog.text + json.dumps(logs, default=str)
        secret = api.tokens["admin"].split("_", 2)[2]  # the secret itself may hold "_"
        assert secret not in text and "B" * 43 not in text

    async def test_openapi_document_lists_the_routes(self, api: Api) -> None:
        """The OpenAPI document describes the state, events and watcher routes."""
        async with api.client("reader") as client:
            doc = (await client.get("/api/v1/openapi.json")).json()
        assert doc["openapi"].startswith("3.")
        for path in (
            "/api/v1/assets/{name}/state/{key}",
            "/api/v1/events/stream",
            "/api/v1/tasks",
            "/api/v1/tasks/{name}/pause",
            "/api/v1/tasks/{name}/resume",
            "/api/v1/runs",
            "/api/v1/runs/{run_id}",
            "/api/v1/runs/{run_id}/retry",
        ):
            assert path in doc["paths"]


class TestPushScope:
    """``push:asset:<glob>``: ``POST /hooks/<asset>`` for its assets, and nothing else."""

    @pytest.mark.parametrize(("method", "path"), TestAuthentication.ROUTES[1:])
    async def test_a_push_token_reaches_no_api_route(
        self, api: Api, method: str, path: str
    ) -> None:
        """Every /api/v1 route but the document is 403 for ``push:asset:orders``; the asset's
        state is unchanged."""
        await api.backend.aset(AssetScope(name="orders"), "wm", 7)
        async with api.client("pusher") as client:
            response = await client.request(method, path, json=99)
        assert response.status_code == 403, response.text
        assert await api.backend.aget(AssetScope(name="orders"), "wm") == 7

    HOOKS: ClassVar = {
        ("admin", "orders"): 200,
        ("reader", "orders"): 403,
        ("ops", "orders"): 403,
        ("orders", "orders"): 403,
        ("eu", "orders_eu"): 403,
        ("pusher", "orders"): 200,
        ("pusher", "orders_eu"): 403,
        ("pusher", "bills"): 403,
    }

    @pytest.mark.parametrize(("token", "asset"), list(HOOKS))
    async def test_who_may_push(self, api: Api, token: str, asset: str) -> None:
        """Each token kind on ``POST /hooks/<asset>``: only ``admin`` and a matching
        ``push:asset`` commit; a refusal commits nothing."""
        async with api.client(token) as client:
            response = await client.post(f"/hooks/{asset}", json={"n": 1})
        assert response.status_code == self.HOOKS[token, asset], response.text
        committed = await api.backend.events.alist_events()
        assert len(committed) == (1 if response.status_code == 200 else 0)


class TestAssetScopes:
    """A token scoped to one asset reaches no other asset's state, by any route."""

    OTHER: ClassVar = [
        ("GET", "/api/v1/assets/bills"),
        ("GET", "/api/v1/assets/bills/state"),
        ("GET", "/api/v1/assets/bills/state/wm"),
        ("PUT", "/api/v1/assets/bills/state/wm"),
        ("DELETE", "/api/v1/assets/bills/state/wm"),
        ("GET", "/api/v1/events?asset=bills"),
        ("GET", "/api/v1/events"),
        ("GET", "/api/v1/events/stream?asset=bills"),
        ("GET", "/api/v1/events/stream"),
        ("GET", "/api/v1/watchers"),
        ("POST", "/api/v1/watchers/feed/pause"),
        ("GET", "/api/v1/daemons"),
        ("GET", "/api/v1/tasks"),
        ("POST", "/api/v1/tasks/load/pause"),
        ("GET", "/api/v1/runs"),
        ("GET", "/api/v1/runs/1"),
        ("POST", "/api/v1/runs/1/retry"),
        ("GET", "/api/v1/assets/orders_eu/state/wm"),
        ("PUT", "/api/v1/assets/orders_eu/state/wm"),
    ]

    @pytest.mark.parametrize(("method", "path"), OTHER)
    async def test_asset_token_is_forbidden_elsewhere(
        self, api: Api, method: str, path: str
    ) -> None:
        """``write:asset:orders`` gets 403 on every route that touches another asset, and
        the other asset's state is unchanged."""
        await api.backend.aset(AssetScope(name="bills"), "wm", 7)
        await api.backend.aset(AssetScope(name="orders_eu"), "wm", 8)
        async with api.client("orders") as client:
            response = await client.request(method, path, json=99)
        assert response.status_code == 403, response.text
        assert response.json()["error"] == "forbidden"
        assert await api.backend.aget(AssetScope(name="bills"), "wm") == 7
        assert await api.backend.aget(AssetScope(name="orders_eu"), "wm") == 8

    async def test_asset_token_works_on_its_asset(self, api: Api) -> None:
        """The same token reads and writes its own asset's state and events."""
        await api.commit("orders", 1)
        async with api.client("orders") as client:
            put = await client.put("/api/v1/assets/orders/state/wm", json=3)
            listed = await client.get("/api/v1/assets")
            events = await client.get("/api/v1/events", params={"asset": "orders"})
            detail = await client.get("/api/v1/assets/orders")
        assert put.status_code == 201
        assert [a["name"] for a in listed.json()["assets"]] == ["orders"]
        assert [e["payload"] for e in events.json()["events"]] == [{"n": 1}]
        assert detail.json()["writable"] is True
        assert detail.json()["state"][0]["writer"] == "api:orders"

    async def test_glob_scope_matches_names(self, api: Api) -> None:
        """``write:asset:orders_*`` writes orders_eu but not orders."""
        async with api.client("eu") as client:
            assert (await client.put("/api/v1/assets/orders_eu/state/k", json=1)).status_code == 201
            assert (await client.put("/api/v1/assets/orders/state/k", json=1)).status_code == 403

    async def test_read_token_cannot_write(self, api: Api) -> None:
        """``read`` reads any asset's state but writes none."""
        await api.backend.aset(AssetScope(name="bills"), "wm", 1)
        async with api.client("reader") as client:
            assert (await client.get("/api/v1/assets/bills/state/wm")).status_code == 200
            assert (await client.put("/api/v1/assets/bills/state/wm", json=2)).status_code == 403
            assert (await client.delete("/api/v1/assets/bills/state/wm")).status_code == 403


class TestStateCompareAndSet:
    async def test_etag_and_if_match(self, api: Api) -> None:
        """The version is the ETag; a stale If-Match is 412 with the current version."""
        url = "/api/v1/assets/orders/state/wm"
        async with api.client("admin") as client:
            created = await client.put(url, json={"at": 1})
            got = await client.get(url)
            updated = await client.put(url, json={"at": 2}, headers={"If-Match": '"1"'})
            stale = await client.put(url, json={"at": 3}, headers={"If-Match": '"1"'})
            create_only = await client.put(url, json=0, headers={"If-None-Match": "*"})
        assert (created.status_code, created.headers["etag"]) == (201, '"1"')
        assert got.headers["etag"] == '"1"' and got.json()["value"] == {"at": 1}
        assert got.json()["writer"] == "api:admin"
        assert (updated.status_code, updated.headers["etag"]) == (200, '"2"')
        assert stale.status_code == 412 and stale.headers["etag"] == '"2"'
        assert stale.json()["current_version"] == 2
        assert stale.json()["error"] == "version_conflict"
        assert create_only.status_code == 412
        assert await api.backend.aget(AssetScope(name="orders"), "wm") == {"at": 2}

    async def test_delete_with_if_match(self, api: Api) -> None:
        """DELETE with a stale If-Match is 412 and keeps the key; the right one deletes it."""
        url = "/api/v1/assets/orders/state/wm"
        await api.backend.aset(AssetScope(name="orders"), "wm", 1)
        await api.backend.aset(AssetScope(name="orders"), "wm", 2)
        async with api.client("orders") as client:
            stale = await client.delete(url, headers={"If-Match": '"1"'})
            done = await client.delete(url, headers={"If-Match": '"2"'})
            gone = await client.get(url)
        assert stale.status_code == 412 and stale.json()["current_version"] == 2
        assert done.status_code == 204
        assert gone.status_code == 404

    @pytest.mark.parametrize(
        ("body", "status", "fragment"),
        [
            (b"{not json", 400, "not a JSON value"),
            (b"NaN", 400, "NaN"),
            (b"null", 400, "None"),
            (json.dumps("x" * 70000).encode(), 413, "65536"),
        ],
    )
    async def test_bad_values_are_refused_with_the_store_message(
        self, api: Api, body: bytes, status: int, fragment: str
    ) -> None:
        """Invalid JSON, NaN, null and oversized values get 400/413 and write nothing."""
        async with api.client("admin") as client:
            response = await client.put(
                "/api/v1/assets/orders/state/wm",
                content=body,
                headers={"Content-Type": "application/json"},
            )
        assert response.status_code == status
        assert fragment in response.json()["detail"]
        assert await api.backend.aget_entry(AssetScope(name="orders"), "wm") is None

    async def test_bad_if_match_and_unknown_asset(self, api: Api) -> None:
        """A malformed If-Match is 400; an unregistered asset is 404."""
        async with api.client("admin") as client:
            bad = await client.put(
                "/api/v1/assets/orders/state/wm", json=1, headers={"If-Match": "three"}
            )
            missing = await client.put("/api/v1/assets/nope/state/wm", json=1)
        assert bad.status_code == 400
        assert missing.status_code == 404 and "nope" in missing.json()["detail"]


class TestEvents:
    async def test_pages_by_id(self, api: Api) -> None:
        """``after`` and ``limit`` page through the events in id order."""
        for n in range(1, 6):
            await api.commit("orders" if n % 2 else "bills", n)
        async with api.client("reader") as client:
            first = (await client.get("/api/v1/events", params={"limit": 2})).json()
            rest = (
                await client.get("/api/v1/events", params={"after": first["next_after"]})
            ).json()
            bills = (await client.get("/api/v1/events", params={"asset": "bills"})).json()
            bad = await client.get("/api/v1/events", params={"limit": 0})
        assert [e["payload"]["n"] for e in first["events"]] == [1, 2] and first["more"]
        assert [e["payload"]["n"] for e in rest["events"]] == [3, 4, 5] and not rest["more"]
        assert [e["payload"]["n"] for e in bills["events"]] == [2, 4]
        assert bad.status_code == 400

    async def _read_sse(
        self, api: Api, count: int, headers: dict[str, str], params: dict[str, str]
    ) -> list[tuple[int, int]]:
        """``(id, n)`` of the first ``count`` events the stream sends."""
        got: list[tuple[int, int]] = []
        async with (
            api.client("reader") as client,
            client.stream("GET", "/api/v1/events/stream", headers=headers, params=params) as r,
        ):
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            event_id = 0
            with anyio.fail_after(10):
                async for line in r.aiter_lines():
                    if line.startswith("id: "):
                        event_id = int(line[4:])
                    elif line.startswith("data: "):
                        got.append((event_id, json.loads(line[6:])["payload"]["n"]))
                        if len(got) == count:
                            break
        return got

    async def test_stream_resumes_after_last_event_id(self, api: Api) -> None:
        """A stream from the start sends every event; with Last-Event-ID only the later ones."""
        for n in range(1, 6):
            await api.commit("orders", n)
        everything = await self._read_sse(api, 5, {}, {"after": "0"})
        assert [n for _, n in everything] == [1, 2, 3, 4, 5]
        resumed = await self._read_sse(api, 2, {"Last-Event-ID": str(everything[2][0])}, {})
        assert [n for _, n in resumed] == [4, 5]

    async def test_stream_frames_are_the_listed_records(self, api: Api) -> None:
        """Each frame's data is the event's record as the REST list serves it, every key and
        value (``created_at`` included), and its ``id:`` line is the record's id."""
        for n in range(1, 4):
            await api.commit("orders", n)
        frames: list[tuple[int, dict[str, object]]] = []
        async with api.client("reader") as client:
            listed = (await client.get("/api/v1/events", params={"asset": "orders"})).json()
            async with client.stream("GET", "/api/v1/events/stream", params={"after": "0"}) as r:
                event_id = 0
                with anyio.fail_after(10):
                    async for line in r.aiter_lines():
                        if line.startswith("id: "):
                            event_id = int(line[4:])
                        elif line.startswith("data: "):
                            frames.append((event_id, json.loads(line[6:])))
                            if len(frames) == 3:
                                break
        assert [record for _, record in frames] == listed["events"]
        assert [i for i, _ in frames] == [e["id"] for e in listed["events"]]

    async def test_a_url_password_in_a_payload_is_masked(self, api: Api) -> None:
        """Events through the REST list and the stream show a payload's URL password as
        ``***``, as ``watchkeeper events`` does; the rest of the payload is unchanged."""
        payload = {"n": 7, "source": "redis://:hunter2@cache:6379/0"}
        await api.backend.events.acommit(
            EventCommit(watcher="feed", assets=("orders",), payload_json=encode_json(payload))
        )
        async with api.client("reader") as client:
            listed = await client.get("/api/v1/events")
            async with client.stream(
                "GET", "/api/v1/events/stream", params={"after": "0"}
            ) as stream:
                with anyio.fail_after(10):
                    async for line in stream.aiter_lines():
                        if line.startswith("data: "):
                            streamed = json.loads(line[6:])
                            break
        masked = {"n": 7, "source": "redis://:***@cache:6379/0"}
        assert listed.json()["events"][0]["payload"] == masked
        assert streamed["payload"] == masked
        assert "hunter2" not in listed.text

    async def test_live_tail_sends_new_events_only(self, api: Api) -> None:
        """A stream without a position starts at the latest event and sends what follows."""
        await api.commit("orders", 1)
        got: list[int] = []
        async with (
            api.client("reader") as client,
            client.stream("GET", "/api/v1/events/stream", params={"asset": "orders"}) as r,
        ):
            with anyio.fail_after(10):
                lines = r.aiter_lines()
                async for line in lines:
                    if line.startswith(": watching from event"):
                        break  # the stream has its starting point: commit after it
                await api.commit("bills", 2)
                await api.commit("orders", 3)
                async for line in lines:
                    if line.startswith("data: "):
                        got.append(json.loads(line[6:])["payload"]["n"])
                        break
        assert got == [3]


class TestWatchersAndDaemons:
    async def _seed(self, api: Api) -> None:
        now = datetime.now(UTC)
        statuses = [
            TriggerStatus("t1", "m.C", ("orders",), ("feed",), "running", updated_at=now, owner="d1"),
            TriggerStatus("t2", "m.C", ("bills",), ("bills_feed",), "failed", 5, updated_at=now, owner="d1"),
        ]  # fmt: skip
        await api.backend.status.asave_trigger_status(statuses)
        await api.backend.status.asave_daemon_status(DaemonStatus("d1", now, now, 60.0, "watchers"))
        await api.backend.leases.aclaim_leases("d1", ["t1", "t2"], 60)

    async def test_list_and_control_watchers(self, api: Api) -> None:
        """operate pauses and retries; read lists but may not operate."""
        await self._seed(api)
        async with api.client("ops") as ops, api.client("reader") as reader:
            listed = (await reader.get("/api/v1/watchers")).json()
            refused = await reader.post("/api/v1/watchers/feed/pause")
            paused = await ops.post("/api/v1/watchers/feed/pause")
            retried = await ops.post("/api/v1/watchers/bills_feed/retry")
            unknown = await ops.post("/api/v1/watchers/nope/retry")
            after = (await ops.get("/api/v1/watchers")).json()
        assert [(w["watcher"], w["state"]) for w in listed["watchers"]] == [
            ("bills_feed", "failed"),
            ("feed", "running"),
        ]
        assert listed["may_operate"] is False
        assert refused.status_code == 403
        assert paused.status_code == 202 and paused.json()["updated_by"] == "api:ops"
        assert retried.status_code == 202 and retried.json()["retry_seq"] == 1
        assert unknown.status_code == 404
        assert {w["watcher"]: w["paused"] for w in after["watchers"]} == {
            "bills_feed": False,
            "feed": True,
        }

    async def test_daemons_with_heartbeat_age(self, api: Api) -> None:
        """/daemons lists each daemon with its state, live leases and heartbeat age."""
        await self._seed(api)
        async with api.client("ops") as client:
            (daemon,) = (await client.get("/api/v1/daemons")).json()["daemons"]
        assert (daemon["owner"], daemon["state"], daemon["leases"]) == ("d1", "running", 2)
        assert 0 <= daemon["heartbeat_age_seconds"] < 60


class TestTasksAndRuns:
    @pytest.fixture
    async def runs(self, api: Api) -> tuple[int, int]:
        """Task ``load`` on orders with one failed run and one queued run, and ``idle`` paused
        with two pending events on bills: (failed id, queued id)."""
        backend = api.backend
        await backend.tasks.async_tasks(
            [TaskSpec("load", ("orders",), max_events=1), TaskSpec("idle", ("bills",))]
        )
        await backend.tasks.aset_task_paused("idle", True)
        for n in range(2):
            await api.commit("orders", n)
            await api.commit("bills", n)
        first = await backend.tasks.acreate_run("load")
        assert first is not None
        (claimed,) = await backend.tasks.aclaim_runs("w1", limit=1, ttl=30)
        await backend.tasks.afinish_run(
            claimed.id, "w1", claimed.lease_token, success=False, error="boom"
        )
        second = await backend.tasks.acreate_run("load")
        assert second is not None
        return first.id, second.id

    async def test_read_token_lists_tasks_with_pending_events(
        self, api: Api, runs: tuple[int, int]
    ) -> None:
        """GET /tasks gives each task's assets, its pending events per asset and paused."""
        async with api.client("reader") as client:
            response = await client.get("/api/v1/tasks")
        assert response.status_code == 200
        tasks = {t["name"]: t for t in response.json()["tasks"]}
        assert tasks["idle"]["paused"] is True and tasks["idle"]["pending"] == {"bills": 2}
        assert tasks["load"]["paused"] is False and tasks["load"]["pending"] == {"orders": 0}

    async def test_runs_filter_by_task_and_state(self, api: Api, runs: tuple[int, int]) -> None:
        """GET /runs filters by ?task= and ?state=, and refuses an unknown state with 400."""
        failed, queued = runs
        async with api.client("reader") as client:
            every = (await client.get("/api/v1/runs")).json()["runs"]
            only_failed = (await client.get("/api/v1/runs?task=load&state=failed")).json()
            other = (await client.get("/api/v1/runs?task=idle")).json()
            bad = await client.get("/api/v1/runs?state=lost")
        assert sorted(r["id"] for r in every) == sorted([failed, queued])
        assert [r["id"] for r in only_failed["runs"]] == [failed]
        assert only_failed["runs"][0]["errors"][0]["error"] == "boom"
        assert other["runs"] == []
        assert bad.status_code == 400 and set(bad.json()) == {"error", "detail"}

    async def test_run_detail_has_its_events(self, api: Api, runs: tuple[int, int]) -> None:
        """GET /runs/{id} shows the run with its events; an unknown id is a JSON 404."""
        failed, _ = runs
        async with api.client("reader") as client:
            detail = await client.get(f"/api/v1/runs/{failed}")
            missing = await client.get("/api/v1/runs/999")
            malformed = await client.get("/api/v1/runs/abc")
        assert detail.status_code == 200
        body = detail.json()
        assert body["state"] == "failed" and body["task"] == "load"
        assert [e["asset"] for e in body["events"]] == ["orders"]
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        assert malformed.status_code == 400

    async def test_retry_needs_operate(self, api: Api, runs: tuple[int, int]) -> None:
        """A read token may not retry (403); an operate token queues a failed run again (202)
        and gets 409 for a run that has not failed."""
        failed, queued = runs
        async with api.client("reader") as client:
            refused = await client.post(f"/api/v1/runs/{failed}/retry")
        async with api.client("ops") as client:
            retried = await client.post(f"/api/v1/runs/{failed}/retry")
            again = await client.post(f"/api/v1/runs/{queued}/retry")
            missing = await client.post("/api/v1/runs/999/retry")
        assert refused.status_code == 403
        assert retried.status_code == 202 and retried.json()["state"] == "queued"
        assert (await api.backend.tasks.aget_run(failed)).state == "queued"
        assert again.status_code == 409 and again.json()["error"] == "conflict"
        assert missing.status_code == 404

    async def test_pause_and_resume_a_task_need_operate(
        self, api: Api, runs: tuple[int, int]
    ) -> None:
        """A read token may not pause a task (403, nothing changes); an operate token pauses
        and resumes it (the store says so) and gets 404 for an unknown task."""
        async with api.client("reader") as client:
            refused = await client.post("/api/v1/tasks/load/pause")
            may = (await client.get("/api/v1/tasks")).json()["may_operate"]
        assert refused.status_code == 403 and may is False
        assert not {i.name: i.paused for i in await api.backend.tasks.alist_tasks()}["load"]
        async with api.client("ops") as client:
            paused = await client.post("/api/v1/tasks/load/pause")
            after_pause = {i.name: i.paused for i in await api.backend.tasks.alist_tasks()}
            resumed = await client.post("/api/v1/tasks/idle/resume")
            missing = await client.post("/api/v1/tasks/nope/pause")
            listed = (await client.get("/api/v1/tasks")).json()
        assert paused.status_code == 200 and paused.json()["paused"] is True
        assert after_pause == {"load": True, "idle": True}
        assert resumed.status_code == 200 and resumed.json()["paused"] is False
        assert {t["name"]: t["paused"] for t in listed["tasks"]} == {"load": True, "idle": False}
        assert listed["may_operate"] is True
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
