"""Events: the paginated list and the live Server-Sent Events stream."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from watchkeeper.store import StoreUnavailableError
from watchkeeper.store.backend import require_event_log

from .._records import event_record
from ._base import (
    MAX_PAGE,
    ApiContext,
    authenticate,
    ctx_of,
    forbid,
    int_param,
    require,
)
from ._feed import SSE_BATCH, encode_frames, join_frames
from ._parse import stream_start

__all__ = ["list_events", "stream_events"]

SSE_KEEPALIVE = 15.0


async def _events_principal(request: Request) -> str | None:
    principal = await authenticate(request)
    asset = request.query_params.get("asset") or None
    if principal.can_read():
        return asset
    if asset is None:
        raise forbid(principal, "read the events of every asset; pass ?asset=NAME")
    require(principal.can_read_asset(asset), principal, f"read the events of asset {asset!r}")
    return asset


async def list_events(request: Request) -> Response:
    asset = await _events_principal(request)
    after = int_param(request, "after", 0, 0, None)
    limit = int_param(request, "limit", 100, 1, MAX_PAGE)
    events = await require_event_log(ctx_of(request).backend).alist_events(
        asset=asset, since_id=after, limit=limit
    )
    next_after = events[-1].id if events else after
    return JSONResponse(
        {
            "events": [event_record(e) for e in events],
            "next_after": next_after,
            "more": len(events) == limit,
        }
    )


async def stream_events(request: Request) -> Response:
    asset = await _events_principal(request)
    ctx = ctx_of(request)
    after = stream_start(request)
    if after is None:
        after = await ctx.controls.alast_event_id(asset)  # a live tail: from now on
    return StreamingResponse(
        _sse(ctx, asset, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _sse(ctx: ApiContext, asset: str | None, after: int) -> AsyncIterator[bytes]:
    yield f"retry: 2000\n: watching from event {after}\n\n".encode()
    controls = ctx.controls
    feed = ctx.feed(asset)
    feed.clients += 1
    try:
        feed.start_at(after)
        quiet_since = time.monotonic()
        while not ctx.closing.is_set():
            if after < feed.base:  # older than what the feed holds: read the log alone
                try:
                    events = await controls.alist_event_json(
                        asset=asset, since_id=after, limit=SSE_BATCH
                    )
                except StoreUnavailableError:
                    events = None  # the client keeps its place; the next poll tries again
                if events:
                    after = events[-1][0]
                    quiet_since = time.monotonic()
                    yield join_frames(encode_frames(events))
                    continue
                if events is not None:
                    after = feed.base  # the events up to the feed's are gone (collected)
                    continue
            else:
                held = feed.frames_after(after)
                if held is not None:
                    data, after = held
                    quiet_since = time.monotonic()
                    yield data
                    continue
            if time.monotonic() - quiet_since >= SSE_KEEPALIVE:
                quiet_since = time.monotonic()
                yield b": keep-alive\n\n"
            await feed.advance(ctx.sse_poll)
    finally:
        feed.clients -= 1
        if feed.clients == 0 and ctx.feeds.get(asset) is feed:
            del ctx.feeds[asset]
