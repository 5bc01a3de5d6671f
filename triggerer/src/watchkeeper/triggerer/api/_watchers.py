"""Watchers (list, pause, resume, retry) and daemons."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store.backend import LeaseTable, get_logger

from .._daemon_report import daemon_report
from .._watcher_controls import watcher_rows
from ._base import ApiError, authenticate, ctx_of, require, utc_now
from ._parse import path_param

__all__ = ["control", "list_daemons", "list_watchers"]

log = get_logger(__name__)


async def list_watchers(request: Request) -> Response:
    principal = await authenticate(request)
    require(principal.can_see_watchers(), principal, "list watchers (needs read or operate)")
    rows = await watcher_rows(ctx_of(request).backend)
    now = utc_now()
    return JSONResponse(
        {
            "watchers": [row.to_json(now) for row in rows],
            "may_operate": principal.can_operate(),
        }
    )


def control(action: str) -> Callable[[Request], Awaitable[Response]]:
    async def control(request: Request) -> Response:
        principal = await authenticate(request)
        name = path_param(request, "name")
        require(principal.can_operate(), principal, f"{action} watchers (needs operate)")
        ctx = ctx_of(request)
        controls = ctx.controls
        rows = {row.watcher: row for row in await watcher_rows(ctx.backend)}
        if action == "retry" and name not in rows:
            raise ApiError(404, "not_found", f"no daemon has reported a watcher named {name!r}")
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
