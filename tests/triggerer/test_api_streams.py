"""The live event stream's shared reads: clients of one filter share each read of the log.

A real server (uvicorn on a free port) over a real SQLite store that records which reads of
the event log found events.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import AssetEvent, EventBatchCommit, encode_json
from watchkeeper.triggerer.api import ApiContext, api_context, make_token, serve_app
from watchkeeper.triggerer.settings import ApiSettings

from tests.support.daemons import wait_until

ASSETS = [Asset("orders"), Asset("bills")]


class CountingSqlite(SqliteStateBackend):
    """The real SQLite backend recording each read of the event log that found events
    (``reads``: the asset and the position read from)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads: list[tuple[str | None, int]] = []

    async def _alist_events(
        self,
        asset: str | None,
        since_id: int,
        limit: int | None,
        before_id: int | None,
        newest_first: bool,
    ) -> list[AssetEvent]:
        found = await super()._alist_events(asset, since_id, limit, before_id, newest_first)
        if found:
            self.reads.append((asset, since_id))
        return found


async def next_ids(lines: AsyncIterator[str], count: int) -> list[int]:
    """The ids of the next ``count`` events of an open stream."""
    ids: list[int] = []
    with anyio.fail_after(10):
        async for line in lines:
            if line.startswith("id: "):
                ids.append(int(line[4:]))
                if len(ids) == count:
                    break
    return ids


@dataclass
class Shared:
    backend: CountingSqlite
    ctx: ApiContext
    client: httpx.AsyncClient


class TestSharedStreams:
    """Clients of the same stream share one read and one encoding of each batch."""

    @pytest.fixture
    async def shared(self, tmp_path: Path) -> AsyncIterator[Shared]:
        """A served API over a :class:`CountingSqlite` and a read token."""
        async with CountingSqlite(tmp_path / "state.db") as backend:
            await backend.events.aregister_assets(ASSETS)
            text, row = make_token("reader", ["read"], now=datetime.now(UTC))
            await backend.controls.acreate_token(row)
            ctx = api_context(backend, ApiSettings(port=0))
            ctx.sse_poll = 0.02
            async with anyio.create_task_group() as tg:
                port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
                auth = {"Authorization": f"Bearer {text}"}
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=10
                ) as client:
                    yield Shared(backend, ctx, client)
                tg.cancel_scope.cancel()

    async def commit(self, backend: SqliteStateBackend, *ns: int) -> None:
        """Commit one event per ``n``, all in one transaction (a feed's read sees all or none)."""
        events = tuple((encode_json({"n": n}), None) for n in ns)
        await backend.events.acommit_batch(
            EventBatchCommit(watcher="feed", assets=("orders",), events=events)
        )

    async def test_two_clients_one_read_per_batch(self, shared: Shared) -> None:
        """Two clients of every event get the same events, and each batch is read from the
        log once; the shared feed goes when its last client does."""
        backend, ctx, client = shared.backend, shared.ctx, shared.client
        params = {"after": "0"}
        async with client.stream("GET", "/api/v1/events/stream", params=params) as a:
            a_lines = a.aiter_lines()
            await wait_until(lambda: None in ctx.feeds, "the first client's feed")
            await self.commit(backend, 1, 2, 3)
            first_a = await next_ids(a_lines, 3)
            async with client.stream("GET", "/api/v1/events/stream", params=params) as b:
                b_lines = b.aiter_lines()
                first_b = await next_ids(b_lines, 3)
                assert len(ctx.feeds) == 1 and ctx.feeds[None].clients == 2
                await self.commit(backend, 4, 5)
                then_a, then_b = await next_ids(a_lines, 2), await next_ids(b_lines, 2)
        assert first_a == first_b and then_a == then_b and len(set(first_a + then_a)) == 5
        assert len(backend.reads) == len(set(backend.reads)) == 2, backend.reads
        await wait_until(lambda: not ctx.feeds, "the shared feed to go with its clients")

    async def test_a_client_behind_the_feed_catches_up_in_order(self, shared: Shared) -> None:
        """A client resuming from before what the feed keeps reads the log alone, then joins
        the feed: every later event once, in id order."""
        backend, ctx, client = shared.backend, shared.ctx, shared.client
        ctx.feed_keep = 3
        async with client.stream("GET", "/api/v1/events/stream", params={"after": "0"}) as a:
            a_lines = a.aiter_lines()
            await wait_until(lambda: None in ctx.feeds, "the first client's feed")
            await self.commit(backend, *range(1, 11))
            ids = [e.id for e in await backend.events.alist_events()]
            assert await next_ids(a_lines, 10) == ids
            assert ctx.feeds[None].base == ids[6]  # the feed keeps the last three
            resume = {"Last-Event-ID": str(ids[1])}
            async with client.stream("GET", "/api/v1/events/stream", headers=resume) as b:
                b_lines = b.aiter_lines()
                caught_up = await next_ids(b_lines, 8)
                await self.commit(backend, 11, 12)
                later = [e.id for e in await backend.events.alist_events()][10:]
                assert await next_ids(b_lines, 2) == later
                assert await next_ids(a_lines, 2) == later
        assert caught_up == ids[2:]

    async def test_a_position_past_the_head_freezes_no_one(self, shared: Shared) -> None:
        """A first client resuming from an id past the log's head (a bigger or restored
        database's) is clamped to the head: it and a later live tail of the same filter both
        get every new event."""
        backend, ctx, client = shared.backend, shared.ctx, shared.client
        await self.commit(backend, 1, 2)
        far = {"Last-Event-ID": "9223372036854775000"}
        async with client.stream("GET", "/api/v1/events/stream", headers=far) as a:
            a_lines = a.aiter_lines()
            async for line in a_lines:
                if line.startswith(": watching from event"):
                    head = int(line.rsplit(" ", 1)[1])
                    break
            async with client.stream("GET", "/api/v1/events/stream") as b:
                b_lines = b.aiter_lines()
                async for line in b_lines:
                    if line.startswith(": watching from event"):
                        break
                await wait_until(lambda: ctx.feeds[None].clients == 2, "both clients")
                assert ctx.feeds[None].position == head
                await self.commit(backend, 3, 4)
                later = [e.id for e in await backend.events.alist_events()][2:]
                assert await next_ids(b_lines, 2) == later
                assert await next_ids(a_lines, 2) == later
