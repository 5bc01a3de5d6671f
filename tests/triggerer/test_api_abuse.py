"""Hostile or careless API clients: streams that outlive their token, streams of unknown assets,
too many streams per token, the security headers and the scoping rule.

A real server (uvicorn on a free port) over a real SQLite store.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import httpx
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.backend import EventCommit, encode_json
from watchkeeper.triggerer.api import ApiContext, api_context, make_token, serve_app
from watchkeeper.triggerer.settings import ApiSettings

from tests.support.daemons import wait_until

ASSETS = [Asset("orders"), Asset("bills")]
SCOPES = {"reader": ["read"], "ops": ["operate"], "orders": ["write:asset:orders"]}


@dataclass
class Served:
    backend: SqliteStateBackend
    ctx: ApiContext
    base: str
    tokens: dict[str, str]

    def client(self, token: str | None = None) -> httpx.AsyncClient:
        headers = {} if token is None else {"Authorization": f"Bearer {self.tokens[token]}"}
        return httpx.AsyncClient(base_url=self.base, headers=headers, timeout=10)

    async def add_token(self, name: str, scopes: list[str], expires_in: timedelta) -> None:
        text, row = make_token(name, scopes, now=datetime.now(UTC), expires_in=expires_in)
        await self.backend.acreate_token(row)
        self.tokens[name] = text

    async def commit(self, asset: str, n: int) -> None:
        await self.backend.acommit_event(
            EventCommit(watcher="feed", assets=(asset,), payload_json=encode_json({"n": n}))
        )


@asynccontextmanager
async def serve(tmp_path: Path, settings: ApiSettings) -> AsyncIterator[Served]:
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.aregister_assets(ASSETS)
        tokens: dict[str, str] = {}
        for name, scopes in SCOPES.items():
            text, row = make_token(name, scopes, now=datetime.now(UTC))
            await backend.acreate_token(row)
            tokens[name] = text
        ctx = api_context(backend, settings)
        ctx.sse_poll = 0.02
        async with anyio.create_task_group() as tg:
            port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
            yield Served(backend, ctx, f"http://127.0.0.1:{port}", tokens)
            tg.cancel_scope.cancel()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """A served API with three assets and a token per scope."""
    async with serve(tmp_path, ApiSettings(port=0)) as one:
        yield one


async def opened(lines: AsyncIterator[str]) -> None:
    """Wait for a stream's first comment: the server is serving it. (Keep ``lines``: a line
    iterator that is dropped closes its response.)"""
    with anyio.fail_after(10):
        async for line in lines:
            if line.startswith(": watching from event"):
                return
    pytest.fail("the stream ended before it started")


async def ends(lines: AsyncIterator[str]) -> list[str]:
    """The rest of a stream until the server ends it (bounded)."""
    with anyio.fail_after(15):
        return [line async for line in lines]


class TestStreamTokens:
    """An open stream checks its token again: revoked or expired, the stream ends."""

    async def test_a_revoked_token_loses_its_open_stream(self, served: Served) -> None:
        served.ctx.token_recheck = 0.1
        async with (
            served.client("reader") as client,
            client.stream("GET", "/api/v1/events/stream") as stream,
        ):
            lines = stream.aiter_lines()
            await opened(lines)
            await served.commit("orders", 1)
            assert await served.backend.arevoke_token("reader")
            rest = await ends(lines)
            refused = await client.get("/api/v1/events")
        assert any("revoked or expired" in line for line in rest), rest
        assert refused.status_code == 401
        await wait_until(lambda: not served.ctx.open_streams, "the stream to be released")

    async def test_an_expired_token_loses_its_open_stream(self, served: Served) -> None:
        served.ctx.token_recheck = 0.1
        await served.add_token("brief", ["read"], timedelta(seconds=3))
        async with (
            served.client("brief") as client,
            client.stream("GET", "/api/v1/events/stream", params={"asset": "orders"}) as stream,
        ):
            lines = stream.aiter_lines()
            await opened(lines)
            rest = await ends(lines)
        assert any("revoked or expired" in line for line in rest), rest


class TestStreamLimits:
    async def test_a_stream_of_an_unknown_asset_is_404(self, served: Served) -> None:
        """A stream of an asset the store does not know is refused before it starts."""
        async with served.client("reader") as client:
            missing = await client.get("/api/v1/events/stream", params={"asset": "nope"})
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        assert "nope" in missing.json()["detail"]
        assert not served.ctx.feeds and not served.ctx.open_streams

    async def test_a_token_holds_at_most_max_streams(self, tmp_path: Path) -> None:
        """Past ``max_streams_per_token`` a stream is 429; closing one frees its place; the
        cap is per token."""
        async with serve(tmp_path, ApiSettings(port=0, max_streams_per_token=2)) as served:
            path = "/api/v1/events/stream"
            async with served.client("reader") as client, served.client("orders") as other:
                async with client.stream("GET", path) as first:
                    first_lines = first.aiter_lines()  # kept: a dropped iterator closes it
                    await opened(first_lines)
                    async with client.stream("GET", path) as second:
                        second_lines = second.aiter_lines()
                        await opened(second_lines)
                        third = await client.get(path)
                        assert third.status_code == 429, third.text
                        assert third.json()["error"] == "too_many_streams"
                        assert "max_streams_per_token" in third.json()["detail"]
                        assert third.headers["retry-after"] == "5"
                        params = {"asset": "orders"}
                        async with other.stream("GET", path, params=params) as theirs:
                            theirs_lines = theirs.aiter_lines()
                            await opened(theirs_lines)
                            assert sorted(served.ctx.open_streams.values()) == [1, 2]
                await wait_until(
                    lambda: sum(served.ctx.open_streams.values()) == 0, "the streams to close"
                )
                async with client.stream("GET", path) as again:
                    assert again.status_code == 200
