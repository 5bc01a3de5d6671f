"""``GET /api/v1/runs/{run_id}/logs``: what a run's tries printed and logged.

Without ``follow`` the answer is one JSON page of chunks after a position (``after``, a chunk's
``seq``), the next position and whether more are kept, with the run's state: a client that
polls passes ``next_after`` back until the run has finished and ``more`` is false. With
``follow=true`` it is a Server-Sent Events stream: one ``log`` frame per chunk, its ``seq`` as
the event id (``Last-Event-ID`` resumes after it), and a last ``end`` frame once the run (or
the try asked for) is over and every chunk of it has been sent.

Each stream reads the store on its own, at most once per live-stream poll interval while
nothing new is kept (and the run's state at most once per :data:`STATE_EVERY`), at once while
it is catching up: a run's logs have few readers, and none waits for another. The stream
counts against its token's open streams as the event stream does, and ends as that one does
when the token is revoked or the server stops. The text is served as the store keeps it:
secrets were masked on the way in.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import LogChunk, RunNotFoundError, StoreUnavailableError
from watchkeeper.store.protocols import RunLogs, TaskRun

from .._core import log_record
from ._base import MAX_PAGE, ApiContext, ApiError, authenticate, ctx_of, int_param, require
from ._events import SSE_KEEPALIVE, LiveStream, token_holds
from ._parse import parse_int
from ._scoping import may_read_logs
from ._tokens import Principal

__all__ = ["LOG_BATCH", "STATE_EVERY", "run_logs"]

LOG_BATCH = 1000
"""Chunks per read of the store, and the default page of the JSON answer."""

STATE_EVERY = 1.0
"""Seconds between two reads of a followed run's state while it writes nothing new (a run
read with its events costs more than a read of its newest chunks)."""

_FINAL = ("success", "failed")


def _follow(request: Request) -> bool:
    raw = request.query_params.get("follow", "false")
    if raw not in ("true", "false"):
        raise ApiError(400, "bad_request", f"follow must be true or false, got {raw!r}")
    return raw == "true"


def _start(request: Request) -> int:
    """Where the answer starts: after ``Last-Event-ID`` if sent (what a reconnecting stream
    sends), else after ``?after=`` (absent: from the first chunk)."""
    after = int_param(request, "after", 0, 0, None)  # checked even when the header wins
    last_id = request.headers.get("last-event-id")
    return after if last_id is None else parse_int(last_id.strip(), "Last-Event-ID")


def _logs(ctx: ApiContext) -> RunLogs:
    """The store's run logs; a 501 :class:`ApiError` when it keeps none."""
    logs = ctx.backend.services.logs
    if logs is None:
        raise ApiError(501, "not_supported", f"{type(ctx.backend).__name__} keeps no run logs")
    return logs


async def _run(ctx: ApiContext, run_id: int) -> TaskRun:
    try:
        return await ctx.tasks.aget_run(run_id)
    except RunNotFoundError:
        raise ApiError(404, "not_found", f"no run with id {run_id}") from None


async def run_logs(request: Request) -> Response:
    """A page of a run's log chunks, or (``follow=true``) a stream of them until it ends."""
    principal = await authenticate(request)
    require(may_read_logs(principal), principal, "read the logs of runs (needs read)")
    run_id = parse_int(request.path_params["run_id"], "a run id", low=1)
    try_number = int_param(request, "try", 0, 1, None) or None
    follow = _follow(request)
    after = _start(request)
    limit = int_param(request, "limit", LOG_BATCH, 1, MAX_PAGE)
    ctx = ctx_of(request)
    logs = _logs(ctx)
    run = await _run(ctx, run_id)  # a 404 before anything is read or streamed
    if follow:
        stream = _stream(ctx, principal, logs, run_id, try_number, after)
        return LiveStream(ctx, principal, stream)
    # One chunk more than the page: whether there is a next page, without a second call.
    chunks = await logs.alist(run_id, try_number=try_number, after_seq=after, limit=limit + 1)
    page = chunks[:limit]
    return JSONResponse(
        {
            "run_id": run_id,
            "state": run.state,
            "try_number": run.try_number,
            "chunks": [log_record(c) for c in page],
            "next_after": page[-1].seq if page else after,
            "more": len(chunks) > limit,
        }
    )


def _frames(chunks: Sequence[LogChunk]) -> bytes:
    """One ``log`` frame per chunk (its JSON is one line: a frame never holds a blank line)."""
    parts = [
        f"id: {c.seq}\nevent: log\ndata: {json.dumps(log_record(c), separators=(',', ':'))}\n\n"
        for c in chunks
    ]
    return "".join(parts).encode()


def _over(run: TaskRun, try_number: int | None) -> bool:
    """Whether no chunk can come any more: the run is over, or it is past the try asked for."""
    if run.state in _FINAL:
        return True
    return try_number is not None and run.try_number > try_number


async def _stream(
    ctx: ApiContext,
    principal: Principal,
    logs: RunLogs,
    run_id: int,
    try_number: int | None,
    after: int,
) -> AsyncIterator[bytes]:
    yield f"retry: 2000\n: logs of run {run_id} after chunk {after}\n\n".encode()
    tasks = ctx.tasks
    quiet_since = checked_at = time.monotonic()
    over: TaskRun | None = None  # the run once seen over: one more read, then the end
    state_at = float("-inf")
    while not ctx.closing.is_set():
        if time.monotonic() - checked_at >= ctx.token_recheck:
            checked_at = time.monotonic()
            if not await token_holds(ctx, principal):
                yield b": the token is revoked or expired; the stream ends\n\n"
                return
        try:
            chunks = await logs.alist(
                run_id, try_number=try_number, after_seq=after, limit=LOG_BATCH
            )
            if chunks:
                after = chunks[-1].seq
                quiet_since = time.monotonic()
                yield _frames(chunks)
                continue
            if over is not None:  # seen over before this read, and it found nothing more
                end = {"run_id": run_id, "state": over.state, "try_number": over.try_number}
                yield f"event: end\ndata: {json.dumps(end)}\n\n".encode()
                return
            if time.monotonic() - state_at >= STATE_EVERY:
                state_at = time.monotonic()
                run = await tasks.aget_run(run_id)
                if _over(run, try_number):
                    over = run
                    continue  # what the last try wrote before it finished is read once more
        except RunNotFoundError:
            yield b": the run is gone; the stream ends\n\n"
            return
        except StoreUnavailableError:
            pass  # the client keeps its place; the next poll tries again
        if time.monotonic() - quiet_since >= SSE_KEEPALIVE:
            quiet_since = time.monotonic()
            yield b": keep-alive\n\n"
        with anyio.move_on_after(ctx.sse_poll):
            await ctx.closing.wait()
