"""Events: the paginated list and the live Server-Sent Events stream."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from watchkeeper.store import StoreUnavailableError
from watchkeeper.store.protocols import get_logger

from .._core import event_record
from ._base import (
    MAX_PAGE,
    ApiContext,
    ApiError,
    authenticate,
    ctx_of,
    forbid,
    int_param,
    require,
    utc_now,
)
from ._feed import SSE_BATCH, encode_frames, join_frames
from ._parse import stream_start
from ._tokens import Principal, still_valid

__all__ = ["SSE_KEEPALIVE", "LiveStream", "list_events", "stream_events", "token_holds"]

log = get_logger(__name__)

SSE_KEEPALIVE = 15.0


async def _events_principal(request: Request) -> tuple[Principal, str | None]:
    principal = await authenticate(request)
    asset = request.query_params.get("asset") or None
    if principal.can_read():
        return principal, asset
    if asset is None:
        raise forbid(principal, "read the events of every asset; pass ?asset=NAME")
    require(principal.can_read_asset(asset), principal, f"read the events of asset {asset!r}")
    return principal, asset


def _order(request: Request) -> bool:
    """True for ``order=desc`` (newest first), False for ``asc`` (the default)."""
    order = request.query_params.get("order") or "asc"
    if order not in ("asc", "desc"):
        raise ApiError(400, "bad_request", f"order must be asc or desc, got {order!r}")
    return order == "desc"


async def list_events(request: Request) -> Response:
    _, asset = await _events_principal(request)
    after = int_param(request, "after", 0, 0, None)
    before = int_param(request, "before", 0, 1, None) or None
    limit = int_param(request, "limit", 100, 1, MAX_PAGE)
    newest_first = _order(request)
    events = await ctx_of(request).backend.events.alist_events(
        asset=asset, since_id=after, limit=limit, before_id=before, newest_first=newest_first
    )
    # The cursor moves in the direction of the page: up in id order, down newest first.
    next_after, next_before = after, before
    if events and newest_first:
        next_before = events[-1].id
    elif events:
        next_after = events[-1].id
    return JSONResponse(
        {
            "events": [event_record(e) for e in events],
            "next_after": next_after,
            "next_before": next_before,
            "more": len(events) == limit,
        }
    )


async def stream_events(request: Request) -> Response:
    principal, asset = await _events_principal(request)
    ctx = ctx_of(request)
    after = stream_start(request)  # a 400 before the stream starts
    if asset is not None:
        known = await ctx.backend.events.alist_assets()
        if not any(a.name == asset for a in known):
            raise ApiError(404, "not_found", f"no asset named {asset!r}")
    head = await ctx.events.alast_event_id(asset)
    # Without a position: a live tail, from now on. A position past the log's head (an id of
    # a bigger or restored database) is the head: every event committed from now on is after it.
    after = head if after is None else min(after, head)
    return LiveStream(ctx, principal, _sse(ctx, principal, asset, after, head))


class LiveStream(StreamingResponse):
    """A live stream counted against its token's ``max_streams_per_token`` while it is open."""

    def __init__(
        self, ctx: ApiContext, principal: Principal, content: AsyncIterator[bytes]
    ) -> None:
        key = principal.token_id
        held = ctx.open_streams.get(key, 0)
        if held >= ctx.max_streams_per_token:
            raise ApiError(
                429,
                "too_many_streams",
                f"token {principal.name!r} holds {held} live streams, the most "
                f"[api] max_streams_per_token allows; close one first",
                headers={"Retry-After": "5"},
            )
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self._ctx, self._key = ctx, key
        ctx.open_streams[key] = held + 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            left = self._ctx.open_streams.get(self._key, 1) - 1
            if left > 0:
                self._ctx.open_streams[self._key] = left
            else:
                self._ctx.open_streams.pop(self._key, None)


async def _sse(
    ctx: ApiContext, principal: Principal, asset: str | None, after: int, head: int
) -> AsyncIterator[bytes]:
    yield f"retry: 2000\n: watching from event {after}\n\n".encode()
    events_log = ctx.events
    feed = ctx.feed(asset)
    feed.clients += 1
    try:
        feed.start_at(head)  # never a client's position: that would move every other's
        quiet_since = checked_at = time.monotonic()
        while not ctx.closing.is_set():
            if time.monotonic() - checked_at >= ctx.token_recheck:
                checked_at = time.monotonic()
                if not await token_holds(ctx, principal):
                    yield b": the token is revoked or expired; the stream ends\n\n"
                    return
            if after < feed.base:  # older than what the feed holds: read the log alone
                try:
                    events = await events_log.alist_events(
                        asset=asset, since_id=after, limit=SSE_BATCH, raw=True
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


async def token_holds(ctx: ApiContext, principal: Principal) -> bool:
    """Whether a live stream's token is still valid; True while the store cannot tell (the
    stream waits for the store like its reads do, and the next check asks again)."""
    try:
        valid = await still_valid(ctx.controls, principal, utc_now())
    except StoreUnavailableError:
        return True
    if not valid:
        log.info("api_stream_ended", token=principal.name, reason="token revoked or expired")
    return valid
