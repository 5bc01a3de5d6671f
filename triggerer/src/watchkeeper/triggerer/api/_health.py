"""Health, readiness, the Prometheus exposition and the OpenAPI document."""

from __future__ import annotations

import anyio
import anyio.abc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._core import describe_error
from ._base import authenticate, ctx_of, require
from ._metrics import CONTENT_TYPE
from ._openapi import openapi_document

__all__ = ["healthz", "metrics", "openapi", "readyz"]


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    ctx = ctx_of(request)
    reasons: list[str] = []
    try:
        with anyio.fail_after(2):
            await ctx.backend.aping()
    except TimeoutError:
        reasons.append("store: no answer within 2 s")
    except Exception as exc:  # noqa: BLE001 - any failure is the reason to report
        reasons.append(f"store: {describe_error(exc)}")
    daemon = ctx.daemon
    if daemon is not None:
        try:
            if not daemon.runner.store_health.available:
                reasons.append("store: the daemon is waiting out an outage")
            age = daemon.lease_renewal_age()
            ttl = daemon.settings.triggerer.lease_seconds
            if age is not None and age > ttl:
                reasons.append(f"leases: not renewed for {age:.0f} s (lease_ttl {ttl:g} s)")
            missing = daemon.unleased()
            if missing:
                reasons.append(f"leases: {len(missing)} running watcher(s) without their lease")
        except RuntimeError:
            reasons.append("daemon: not running")
    if reasons:
        return JSONResponse({"error": "not_ready", "detail": "; ".join(reasons)}, status_code=503)
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    ctx = ctx_of(request)
    if ctx.metrics_token_required:  # the exposition names every asset, watcher and task
        principal = await authenticate(request)
        require(principal.can_read(), principal, "read /metrics (needs read)")
    collector = ctx.metrics
    await collector.prepare()
    return Response(collector.render(), media_type=CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    await authenticate(request)
    return JSONResponse(openapi_document())
