"""Watchers (list, pause, resume, retry) and daemons."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store.protocols import get_logger

from ..daemon import daemon_report, unknown_watcher, watcher_rows
from ._base import ApiContext, ApiError, authenticate, ctx_of, require, utc_now
from ._parse import path_param
from ._rates import RATE_WINDOW, counted_in_event_log
from ._scoping import watcher_json

__all__ = ["control", "list_daemons", "list_watchers"]

log = get_logger(__name__)


async def list_watchers(request: Request) -> Response:
    principal = await authenticate(request)
    require(principal.can_see_watchers(), principal, "list watchers (needs read or operate)")
    ctx = ctx_of(request)
    rows = await watcher_rows(ctx.backend)
    now = utc_now()
    count_of, source = await _counts_in_window(request, ctx)
    watchers = []
    for row in rows:
        listed = watcher_json(row, principal, now)
        count = count_of(row.watcher)
        listed["events_in_window"] = count
        listed["events_per_minute"] = None if count is None else round(count * 60 / RATE_WINDOW, 1)
        watchers.append(listed)
    return JSONResponse(
        {
            "watchers": watchers,
            "may_operate": principal.can_operate(),
            "rate_window_seconds": RATE_WINDOW,
            "rate_source": source,
        }
    )


async def _counts_in_window(
    request: Request, ctx: ApiContext
) -> tuple[Callable[[str], int | None], str]:
    """How many events a watcher committed in the window, and where that figure comes from.

    In a daemon, from its runner's counters (``"daemon"``; None for a watcher it does not
    run); in ``watchkeeper api``, counted in the event log (``"event_log"``; None for a
    store that cannot count).
    """
    if ctx.rates is not None:
        return ctx.rates.counts().get, "daemon"
    counted = await counted_in_event_log(ctx.backend, request.app.state)
    if counted is None:
        return (lambda _name: None), "event_log"
    return (lambda name: counted.get(name, 0)), "event_log"


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
    for lease in await backend.leases.alist_leases() if backend.services.leases is not None else []:
        if lease.owner is not None and lease.expires_at is not None and lease.expires_at > now:
            leases[lease.owner] = leases.get(lease.owner, 0) + 1
    return JSONResponse(
        {"daemons": [row | {"leases": leases.get(row["owner"], 0)} for row in report.rows]}
    )
