"""The Starlette application: health, metrics, the REST API under ``/api/v1``, the web page.

:func:`create_app` builds it over an :class:`ApiContext` (the opened backend and, inside a
daemon, the daemon and its runner). Every ``/api/v1`` route needs ``Authorization: Bearer
<token>`` (see :mod:`._tokens`); ``/healthz``, ``/readyz``, ``/metrics`` and the page's files
do not (the page asks for a token and sends it with each call). Errors are JSON ``{"error":
<code>, "detail": <sentence>}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from watchkeeper.store import (
    AssetEvent,
    AssetNotFoundError,
    AssetScope,
    BaseStateBackend,
    InvalidNameError,
    InvalidValueError,
    KeyTypeError,
    RunNotFoundError,
    RunStateError,
    StateEntry,
    StateStoreError,
    StoreUnavailableError,
    ValueTooLargeError,
    ValueTypeError,
    VersionConflictError,
)
from watchkeeper.store.backend import (
    RUN_STATES,
    LeaseTable,
    OperatorControls,
    TaskInfo,
    TaskQueue,
    TaskRun,
    Writer,
    get_logger,
    redact_data,
    redact_secrets,
    require_asset_registry,
    require_event_log,
)

from .._daemon_report import daemon_report
from .._supervisor import describe_error
from .._watcher_controls import controls_of, watcher_rows
from ._metrics import CONTENT_TYPE, Metrics
from ._openapi import openapi_document
from ._page import page
from ._tokens import Principal, verify_token

if TYPE_CHECKING:
    from ..daemon import Daemon
    from ..runner import TriggerRunner

__all__ = ["ApiContext", "ApiError", "create_app"]

log = get_logger(__name__)

MAX_PAGE = 1000
SSE_BATCH = 500
SSE_KEEPALIVE = 15.0


class ApiError(Exception):
    """Raised by a route: answered as ``{"error": code, "detail": detail}`` with ``status``."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers
        self.extra = extra or {}


@dataclass
class ApiContext:
    """What the routes work on. ``daemon``/``runner`` are None in ``watchkeeper api``."""

    backend: BaseStateBackend
    metrics: Metrics
    daemon: Daemon | None = None
    runner: TriggerRunner | None = None
    sse_poll: float = 0.25
    """Seconds between two reads of new events for each live stream."""
    closing: anyio.Event = field(default_factory=anyio.Event)
    """Set when the server stops: live streams end."""
    task_group: anyio.abc.TaskGroup | None = None
    """The server's task group (set by :func:`~._server.serve_api`): for heartbeat kicks."""

    @property
    def tasks(self) -> TaskQueue:
        backend = self.backend
        if not isinstance(backend, TaskQueue):
            raise ApiError(501, "not_supported", f"{type(backend).__name__} keeps no tasks")
        return backend

    @property
    def controls(self) -> OperatorControls:
        store = controls_of(self.backend)
        if store is None:
            raise ApiError(
                501, "not_supported", f"{type(self.backend).__name__} keeps no tokens or controls"
            )
        return store

    def kick(self) -> None:
        """Let the in-process daemon act on a control now instead of at its next heartbeat."""
        daemon, tg = self.daemon, self.task_group
        if daemon is None or tg is None:
            return

        async def heartbeat() -> None:
            try:
                await daemon.renew_leases()
            except Exception as exc:  # noqa: BLE001 - the regular heartbeat tries again
                log.warning("api_heartbeat_failed", error=describe_error(exc))

        tg.start_soon(heartbeat)


def _ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


def _now() -> datetime:
    return datetime.now(UTC)


# -- authorization -------------------------------------------------------------------------------


async def authenticate(request: Request) -> Principal:
    """The request's principal; 401 without a valid bearer token (never says which part failed)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="watchkeeper"'}
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>", headers=challenge)
    principal = await verify_token(_ctx(request).controls, token.strip(), _now())
    if principal is None:
        raise ApiError(
            401, "unauthorized", "the token is unknown, revoked or expired", headers=challenge
        )
    return principal


def _forbid(principal: Principal, what: str) -> ApiError:
    return ApiError(403, "forbidden", f"token {principal.name!r} may not {what}")


def _require(allowed: bool, principal: Principal, what: str) -> None:
    if not allowed:
        raise _forbid(principal, what)


# -- JSON shapes ----------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _entry(entry: StateEntry) -> dict[str, Any]:
    return {
        "key": entry.key,
        "value": entry.value,
        "version": entry.version,
        "writer": None if entry.writer is None else str(entry.writer),
        "updated_at": _iso(entry.updated_at),
    }


def _event(event: AssetEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "asset": event.asset,
        "watcher": event.watcher,
        "payload": redact_data(event.payload),  # as `watchkeeper events` shows it
        "dedup_key": event.dedup_key,
        "created_at": _iso(event.created_at),
    }


def _etag(version: int) -> str:
    return f'"{version}"'


def _parse_etag(value: str, header: str) -> int:
    text = value.strip()
    text = text.removeprefix("W/")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    if not text.isdigit():
        raise ApiError(
            400, "bad_request", f"{header} must be an ETag such as '\"3\"', got {value!r}"
        )
    return int(text)


def _int_param(request: Request, name: str, default: int, low: int, high: int | None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError(400, "bad_request", f"{name} must be {bound}, got {value}")
    return value


# -- health and metrics -----------------------------------------------------------------------------


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    ctx = _ctx(request)
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
    collector = _ctx(request).metrics
    await collector.prepare()
    return Response(collector.render(), media_type=CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    await authenticate(request)
    return JSONResponse(openapi_document())


# -- assets and state -----------------------------------------------------------------------------


async def list_assets(request: Request) -> Response:
    principal = await authenticate(request)
    assets = await require_asset_registry(_ctx(request).backend).alist_assets()
    shown = [a for a in assets if principal.can_read_asset(a.name)]
    if (
        not shown
        and not principal.can_read()
        and not any(s.startswith("write:asset:") or s == "admin" for s in principal.scopes)
    ):
        raise _forbid(principal, "read assets")
    return JSONResponse(
        {
            "assets": [
                {"name": a.name, "uri": a.uri, "active": a.active, "updated_at": _iso(a.updated_at)}
                for a in shown
            ]
        }
    )


async def _asset_principal(request: Request) -> tuple[Principal, str]:
    principal = await authenticate(request)
    name = request.path_params["name"]
    _require(principal.can_read_asset(name), principal, f"read asset {name!r}")
    return principal, name


async def asset_detail(request: Request) -> Response:
    principal, name = await _asset_principal(request)
    ctx = _ctx(request)
    found = [a for a in await require_asset_registry(ctx.backend).alist_assets() if a.name == name]
    if not found:
        raise ApiError(404, "not_found", f"no asset named {name!r}")
    asset = found[0]
    watchers = [w.to_json() for w in await watcher_rows(ctx.backend) if name in w.assets]
    entries = await ctx.backend.alist(AssetScope(name=name)) if asset.active else []
    return JSONResponse(
        {
            "name": asset.name,
            "uri": asset.uri,
            "active": asset.active,
            "updated_at": _iso(asset.updated_at),
            "state": [_entry(e) for e in entries],
            "watchers": watchers,
            "writable": principal.can_write_asset(name),
        }
    )


async def list_state(request: Request) -> Response:
    _, name = await _asset_principal(request)
    entries = await _ctx(request).backend.alist(AssetScope(name=name))
    return JSONResponse({"asset": name, "entries": [_entry(e) for e in entries]})


async def get_state(request: Request) -> Response:
    _, name = await _asset_principal(request)
    key = request.path_params["key"]
    entry = await _ctx(request).backend.aget_entry(AssetScope(name=name), key)
    if entry is None:
        raise ApiError(404, "not_found", f"key {key!r} is not set for asset {name!r}")
    return JSONResponse(_entry(entry), headers={"ETag": _etag(entry.version)})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _body_value(request: Request, limit: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > 4 * limit + 1024:
        raise ApiError(
            413, "too_large", f"the body is {declared} bytes; a value is at most {limit}"
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > 4 * limit + 1024:
            raise ApiError(413, "too_large", f"the body is over {4 * limit + 1024} bytes")
    try:
        return json.loads(bytes(body), parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"the body is not a JSON value: {exc}") from None


async def put_state(request: Request) -> Response:
    principal = await authenticate(request)
    name, key = request.path_params["name"], request.path_params["key"]
    _require(principal.can_write_asset(name), principal, f"write the state of asset {name!r}")
    backend = _ctx(request).backend
    expected: int | None = None
    if_match = request.headers.get("if-match")
    if if_match is not None:
        expected = _parse_etag(if_match, "If-Match")
    elif request.headers.get("if-none-match", "").strip() == "*":
        expected = 0  # create only
    value = await _body_value(request, backend.max_value_bytes)
    try:
        version = await backend.aset(
            AssetScope(name=name),
            key,
            value,
            expected_version=expected,
            writer=Writer("api", principal.name),
        )
    except VersionConflictError as exc:
        raise _conflict(exc) from None
    status = 201 if version == 1 else 200
    return JSONResponse(
        {"asset": name, "key": key, "version": version},
        status_code=status,
        headers={"ETag": _etag(version)},
    )


def _conflict(exc: VersionConflictError) -> ApiError:
    return ApiError(
        412,
        "version_conflict",
        str(exc),
        headers={"ETag": _etag(exc.actual)} if exc.actual else None,
        extra={"current_version": exc.actual},
    )


async def delete_state(request: Request) -> Response:
    principal = await authenticate(request)
    name, key = request.path_params["name"], request.path_params["key"]
    _require(principal.can_write_asset(name), principal, f"write the state of asset {name!r}")
    backend = _ctx(request).backend
    scope = AssetScope(name=name)
    if_match = request.headers.get("if-match")
    if if_match is not None:
        expected = _parse_etag(if_match, "If-Match")
        try:
            await _ctx(request).controls.adelete_if_version(name, key, expected)
        except VersionConflictError as exc:
            raise _conflict(exc) from None
    else:
        await backend.adelete(scope, key, writer=Writer("api", principal.name))
    return Response(status_code=204)


# -- events -----------------------------------------------------------------------------------------


async def _events_principal(request: Request) -> str | None:
    principal = await authenticate(request)
    asset = request.query_params.get("asset") or None
    if principal.can_read():
        return asset
    if asset is None:
        raise _forbid(principal, "read the events of every asset; pass ?asset=NAME")
    _require(principal.can_read_asset(asset), principal, f"read the events of asset {asset!r}")
    return asset


async def list_events(request: Request) -> Response:
    asset = await _events_principal(request)
    after = _int_param(request, "after", 0, 0, None)
    limit = _int_param(request, "limit", 100, 1, MAX_PAGE)
    events = await require_event_log(_ctx(request).backend).alist_events(
        asset=asset, since_id=after, limit=limit
    )
    next_after = events[-1].id if events else after
    return JSONResponse(
        {
            "events": [_event(e) for e in events],
            "next_after": next_after,
            "more": len(events) == limit,
        }
    )


async def stream_events(request: Request) -> Response:
    asset = await _events_principal(request)
    ctx = _ctx(request)
    last_id = request.headers.get("last-event-id")
    if last_id is not None:
        if not last_id.strip().isdigit():
            raise ApiError(
                400, "bad_request", f"Last-Event-ID must be an event id, got {last_id!r}"
            )
        after = int(last_id)
    elif request.query_params.get("after") not in (None, ""):
        after = _int_param(request, "after", 0, 0, None)
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


# -- watchers and daemons -------------------------------------------------------------------------


async def list_watchers(request: Request) -> Response:
    principal = await authenticate(request)
    _require(principal.can_see_watchers(), principal, "list watchers (needs read or operate)")
    rows = await watcher_rows(_ctx(request).backend)
    now = _now()
    return JSONResponse(
        {
            "watchers": [row.to_json(now) for row in rows],
            "may_operate": principal.can_operate(),
        }
    )


def _control(action: str) -> Callable[[Request], Awaitable[Response]]:
    async def control(request: Request) -> Response:
        principal = await authenticate(request)
        name = request.path_params["name"]
        _require(principal.can_operate(), principal, f"{action} watchers (needs operate)")
        ctx = _ctx(request)
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
    _require(principal.can_see_watchers(), principal, "list daemons (needs read or operate)")
    backend = _ctx(request).backend
    report = await daemon_report(backend)
    now = backend.clock()
    leases: dict[str, int] = {}
    for lease in await backend.alist_leases() if isinstance(backend, LeaseTable) else []:
        if lease.owner is not None and lease.expires_at is not None and lease.expires_at > now:
            leases[lease.owner] = leases.get(lease.owner, 0) + 1
    return JSONResponse(
        {"daemons": [row | {"leases": leases.get(row["owner"], 0)} for row in report.rows]}
    )


# -- tasks and runs -------------------------------------------------------------------------------


def _task(info: TaskInfo) -> dict[str, Any]:
    spec = info.spec
    return {
        "name": spec.name,
        "assets": list(spec.assets),
        "mode": spec.mode,
        "max_events": spec.max_events,
        "max_tries": spec.max_tries,
        "paused": info.paused,
        "pending": {asset: info.pending.get(asset, 0) for asset in spec.assets},
        "cursors": {asset: info.cursors.get(asset, 0) for asset in spec.assets},
    }


def _run(run: TaskRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "task": run.task,
        "state": run.state,
        "try_number": run.try_number,
        "max_tries": run.max_tries,
        "event_count": run.event_count,
        "created_at": _iso(run.created_at),
        "updated_at": _iso(run.updated_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "not_before": _iso(run.not_before),
        "lease_owner": run.lease_owner,
        "lease_expires_at": _iso(run.lease_expires_at),
        "errors": [
            {"try": e.try_number, "error": e.error, "traceback": e.traceback, "at": _iso(e.at)}
            for e in run.errors
        ],
        "outlet_event_ids": list(run.outlet_event_ids),
    }


def _run_id(request: Request) -> int:
    raw = request.path_params["run_id"]
    if not raw.isdigit() or int(raw) < 1:
        raise ApiError(400, "bad_request", f"a run id is an integer >= 1, got {raw!r}")
    return int(raw)


async def _tasks_principal(request: Request, what: str) -> Principal:
    principal = await authenticate(request)
    _require(principal.can_see_watchers(), principal, f"{what} (needs read or operate)")
    return principal


async def list_tasks(request: Request) -> Response:
    await _tasks_principal(request, "list tasks")
    infos = await _ctx(request).tasks.alist_tasks()
    return JSONResponse({"tasks": [_task(info) for info in infos]})


async def list_runs(request: Request) -> Response:
    await _tasks_principal(request, "list runs")
    task = request.query_params.get("task") or None
    state = request.query_params.get("state") or None
    if state is not None and state not in RUN_STATES:
        raise ApiError(
            400, "bad_request", f"state must be one of {', '.join(RUN_STATES)}, got {state!r}"
        )
    limit = _int_param(request, "limit", 100, 1, MAX_PAGE)
    runs = await _ctx(request).tasks.alist_runs(task=task, state=state, limit=limit)
    return JSONResponse({"runs": [_run(run) for run in runs]})


async def run_detail(request: Request) -> Response:
    principal = await _tasks_principal(request, "read runs")
    run_id = _run_id(request)
    try:
        run = await _ctx(request).tasks.aget_run(run_id)
    except RunNotFoundError:
        raise ApiError(404, "not_found", f"no run with id {run_id}") from None
    body = _run(run)
    if principal.can_read():  # the events' payloads are asset data: read scope only
        body["events"] = [_event(e) for e in run.events]
    return JSONResponse(body)


async def retry_run(request: Request) -> Response:
    principal = await authenticate(request)
    _require(principal.can_operate(), principal, "retry runs (needs operate)")
    run_id = _run_id(request)
    try:
        run = await _ctx(request).tasks.aretry_run(run_id)
    except RunNotFoundError:
        raise ApiError(404, "not_found", f"no run with id {run_id}") from None
    except RunStateError as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    log.info("run_control", run=run_id, action="retry", by=principal.writer_name)
    return JSONResponse(_run(run), status_code=202)


# -- errors and the app ---------------------------------------------------------------------------


def _error_response(exc: ApiError) -> Response:
    body = {"error": exc.code, "detail": exc.detail, **exc.extra}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error_response(exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error_response(ApiError(exc.status_code, code, str(exc.detail)))


async def _on_store_error(request: Request, exc: Exception) -> Response:
    """The store's errors, with the store's own message."""
    if isinstance(exc, AssetNotFoundError):
        return _error_response(ApiError(404, "not_found", str(exc.args[0] if exc.args else exc)))
    if isinstance(exc, ValueTooLargeError):
        return _error_response(ApiError(413, "too_large", str(exc)))
    if isinstance(exc, InvalidValueError | ValueTypeError | InvalidNameError | KeyTypeError):
        return _error_response(ApiError(400, "invalid_value", str(exc)))
    if isinstance(exc, StoreUnavailableError):
        return _error_response(ApiError(503, "store_unavailable", str(exc)))
    log.error("api_store_error", error=describe_error(exc))
    return _error_response(ApiError(500, "store_error", describe_error(exc)))


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("api_error", path=request.url.path, error=describe_error(exc))
    return _error_response(ApiError(500, "internal", type(exc).__name__))


def create_app(ctx: ApiContext) -> Starlette:
    """The application over ``ctx``."""
    v1 = "/api/v1"
    routes = [
        Route("/", page),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        Route(f"{v1}/openapi.json", openapi),
        Route(f"{v1}/assets", list_assets),
        Route(f"{v1}/assets/{{name}}", asset_detail),
        Route(f"{v1}/assets/{{name}}/state", list_state),
        Route(f"{v1}/assets/{{name}}/state/{{key:path}}", get_state, methods=["GET"]),
        Route(f"{v1}/assets/{{name}}/state/{{key:path}}", put_state, methods=["PUT"]),
        Route(f"{v1}/assets/{{name}}/state/{{key:path}}", delete_state, methods=["DELETE"]),
        Route(f"{v1}/events", list_events),
        Route(f"{v1}/events/stream", stream_events),
        Route(f"{v1}/watchers", list_watchers),
        Route(f"{v1}/watchers/{{name}}/pause", _control("pause"), methods=["POST"]),
        Route(f"{v1}/watchers/{{name}}/resume", _control("resume"), methods=["POST"]),
        Route(f"{v1}/watchers/{{name}}/retry", _control("retry"), methods=["POST"]),
        Route(f"{v1}/daemons", list_daemons),
        Route(f"{v1}/tasks", list_tasks),
        Route(f"{v1}/runs", list_runs),
        Route(f"{v1}/runs/{{run_id}}", run_detail),
        Route(f"{v1}/runs/{{run_id}}/retry", retry_run, methods=["POST"]),
        Mount(
            "/static",
            app=StaticFiles(packages=[("watchkeeper.triggerer.api", "static")]),
            name="static",
        ),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            ApiError: _on_api_error,
            HTTPException: _on_http_error,
            StateStoreError: _on_store_error,
            Exception: _on_unexpected,
        },
    )
    app.state.ctx = ctx
    return app
