"""Events: the paginated list and the live Server-Sent Events stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import anyio.abc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from watchkeeper.store import StoreUnavailableError
from watchkeeper.store.backend import redact_secrets, require_event_log

from ._base import (
    MAX_PAGE,
    ApiContext,
    ApiError,
    authenticate,
    ctx_of,
    event_json,
    forbid,
    int_param,
    require,
)

__all__ = ["list_events", "stream_events"]

SSE_BATCH = 500
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
            "events": [event_json(e) for e in events],
            "next_after": next_after,
            "more": len(events) == limit,
        }
    )


async def stream_events(request: Request) -> Response:
    asset = await _events_principal(request)
    ctx = ctx_of(request)
    last_id = request.headers.get("last-event-id")
    if last_id is not None:
        if not last_id.strip().isdigit():
            raise ApiError(
                400, "bad_request", f"Last-Event-ID must be an event id, got {last_id!r}"
            )
        after = int(last_id)
    elif request.query_params.get("after") not in (None, ""):
        after = int_param(request, "after", 0, 0, None)
    else:
        after = await ctx.controls.alast_event_id(asset)  # a live tail: from now on
    return StreamingResponse(
        _sse(ctx, asset, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _sse(ctx: ApiContext, asset: str | None, after: int) -> AsyncIterator[bytes]:
    yield f"retry: 2000\n: watching from event {after}\n\n".encode()
    quiet = 0.0
    controls = ctx.controls
    while not ctx.closing.is_set():
        try:
            # The database builds each event's JSON: no decoding and re-encoding on the loop.
            events = await controls.alist_event_json(asset=asset, since_id=after, limit=SSE_BATCH)
        except StoreUnavailableError:
            events = []  # the client keeps its place; the next poll tries again
        if events:
            frames = [f"id: {i}\nevent: asset_event\ndata: {data}\n\n" for i, data in events]
            after = events[-1][0]
            quiet = 0.0
            yield redact_secrets("".join(frames)).encode()  # masks URL passwords in payloads
            if len(events) == SSE_BATCH:
                continue
        elif quiet >= SSE_KEEPALIVE:
            quiet = 0.0
            yield b": keep-alive\n\n"
        with anyio.move_on_after(ctx.sse_poll):
            await ctx.closing.wait()
        quiet += ctx.sse_poll
