"""Watchers (list, pause, resume, retry) and daemons."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.backend import LeaseTable, get_logger

from ..daemon import controls_of, daemon_report, unknown_watcher, watcher_rows
from ._base import ApiContext, ApiError, authenticate, ctx_of, require, utc_now
from ._parse import path_param
from ._scoping import watcher_json

__all__ = ["control", "list_daemons", "list_watchers"]

log = get_logger(__name__)

RATE_WINDOW = 300
"""Seconds of the event log a watcher's events per minute are averaged over."""
RATE_CACHE = 2.0
"""Seconds one count of the recent events serves every list of the watchers."""


async def list_watchers(request: Request) -> Response:
    principal = await authenticate(request)
    require(principal.can_see_watchers(), principal, "list watchers (needs read or operate)")
    backend = ctx_of(request).backend
    rows = await watcher_rows(backend)
    now = utc_now()
    counts = await _recent_counts(request, backend)
    watchers = []
    for row in rows:
        listed = watcher_json(row, principal, now)
        count = None if counts is None else counts.get(row.watcher, 0)
        listed["events_in_window"] = count
        listed["events_per_minute"] = None if count is None else round(count * 60 / RATE_WINDOW, 1)
        watchers.append(listed)
    return JSONResponse(
        {
            "watchers": watchers,
            "may_operate": principal.can_operate(),
            "rate_window_seconds": RATE_WINDOW,
        }
    )


async def _recent_counts(request: Request, backend: BaseStateBackend) -> dict[str, int] | None:
    """Each watcher's events in the last :data:`RATE_WINDOW` seconds, from the event log (so
    right on the first read, whichever daemon ran it); None for a store without the count.

    The count is kept for :data:`RATE_CACHE` seconds, so many open pages cost one read.
    """
    store = controls_of(backend)
    if store is None:
        return None
    state = request.app.state
    cached: tuple[float, dict[str, int]] | None = getattr(state, "watcher_rate_counts", None)
    if cached is not None and time.monotonic() - cached[0] < RATE_CACHE:
        return cached[1]
    since = backend.clock() - timedelta(seconds=RATE_WINDOW)
    counts = await store.acount_events_since(since)
    state.watcher_rate_counts = (time.monotonic(), counts)
    return counts


def _running_here(ctx: ApiContext) -> set[str]:
    """The watchers of the daemon serving this API (known before it first saves statuses)."""
    runner = ctx.runner
    if runner is None:
        return set()
    return {name for status in runner.statuses() for name in status.watchers}


def control(action: str) -> Callable[[Request], Awaitable[Response]]:
    async def control(request: Request) -> Response:
        principal = await authenticate(request)
        name = path_param(request, "name")
        require(principal.can_operate(), principal, f"{action} watchers (needs operate)")
        ctx = ctx_of(request)
        controls = ctx.controls
        rows = {row.watcher: row for row in await watcher_rows(ctx.backend)}
        known = set(rows) | _running_here(ctx)
        if name not in known:  # a typo records nothing (no phantom paused watcher)
            raise ApiError(404, "not_found", unknown_watcher(name, known))
        by = principal.writer_name
        if action == "retry":
            row = await controls.arequest_watcher_retry(name, by=by)
        else:
            row = await controls.aset_watcher_paused(name, action == "pause", by=by)
        log.info("watcher_control", watcher=name, action=action, by=by)
        ctx.kick()
        return JSONResponse(
            {
                "watcher": row.watcher,
                "paused": row.paused,
                "retry_seq": row.retry_seq,
                "updated_by": row.updated_by,
                "known": name in rows,
            },
            status_code=202,
        )

    return control


async def list_daemons(request: Request) -> Response:
    principal = await authenticate(request)
    require(principal.can_see_watchers(), principal, "list daemons (needs read or operate)")
    backend = ctx_of(request).backend
    report = await daemon_report(backend)
    now = backend.clock()
    leases: dict[str, int] = {}
    for lease in await backend.alist_leases() if isinstance(backend, LeaseTable) else []:
        if lease.owner is not None and lease.expires_at is not None and lease.expires_at > now:
            leases[lease.owner] = leases.get(lease.owner, 0) + 1
    return JSONResponse(
        {"daemons": [row | {"leases": leases.get(row["owner"], 0)} for row in report.rows]}
    )
