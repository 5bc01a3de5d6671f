"""The Starlette application: health, metrics, the REST API under ``/api/v1``, the web page.

:func:`create_app` builds it over an :class:`ApiContext` (the opened backend and, inside a
daemon, the daemon and its runner). Every ``/api/v1`` route needs ``Authorization: Bearer
<token>`` (see :mod:`._tokens`); ``POST /hooks/{asset}`` a token or a sender's signature (see
:mod:`._hooks`); ``/healthz``, ``/readyz``, ``/metrics`` and the page's files
do not (the page asks for a token and sends it with each call). Errors are JSON ``{"error":
<code>, "detail": <sentence>}``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from watchkeeper.store import (
    AssetNotFoundError,
    InvalidNameError,
    InvalidValueError,
    KeyTypeError,
    StateStoreError,
    StoreUnavailableError,
    ValueTooLargeError,
    ValueTypeError,
)
from watchkeeper.store.protocols import get_logger

from .._core import describe_error
from ._assets import asset_detail, list_assets, list_state, state_entry
from ._base import ApiContext, ApiError
from ._events import list_events, stream_events
from ._headers import SecurityHeaders
from ._health import healthz, metrics, openapi, readyz
from ._hooks import receive_hook
from ._logs import run_logs
from ._page import page
from ._parse import PathSegments
from ._tasks import (
    delete_task,
    list_runs,
    list_tasks,
    retry_run,
    retry_task_runs,
    rewind_task,
    run_detail,
    task_control,
)
from ._views import asset_graph, watcher_history
from ._watchers import control, list_daemons, list_watchers

__all__ = ["ApiContext", "ApiError", "create_app"]

log = get_logger(__name__)

STATE_METHODS = ["GET", "PUT", "DELETE"]


def _error_response(exc: ApiError) -> Response:
    body = {"error": exc.code, "detail": exc.detail, **exc.extra}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error_response(exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else None  # a 405 says what is Allowed
    return _error_response(ApiError(exc.status_code, code, str(exc.detail), headers=headers))


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
    """Build the Starlette application (every route, the page, errors as JSON).

    :param ctx: what the routes work on (see :func:`~watchkeeper.triggerer.api.api_context`).
    :returns: the application, ``ctx`` on its state; serve it with :func:`serve_app`.
    """
    v1 = "/api/v1"
    routes = [
        Route("/", page),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        Route("/hooks/{asset}", receive_hook, methods=["POST"]),
        Route(f"{v1}/openapi.json", openapi),
        Route(f"{v1}/assets", list_assets),
        Route(f"{v1}/assets/{{name}}", asset_detail),
        Route(f"{v1}/assets/{{name}}/state", list_state),
        Route(f"{v1}/assets/{{name}}/state/{{key:path}}", state_entry, methods=STATE_METHODS),
        Route(f"{v1}/events", list_events),
        Route(f"{v1}/events/stream", stream_events),
        Route(f"{v1}/watchers", list_watchers),
        Route(f"{v1}/watchers/{{name}}/pause", control("pause"), methods=["POST"]),
        Route(f"{v1}/watchers/{{name}}/resume", control("resume"), methods=["POST"]),
        Route(f"{v1}/watchers/{{name}}/retry", control("retry"), methods=["POST"]),
        Route(f"{v1}/daemons", list_daemons),
        Route(f"{v1}/tasks", list_tasks),
        Route(f"{v1}/tasks/{{name}}", delete_task, methods=["DELETE"]),
        Route(f"{v1}/tasks/{{name}}/pause", task_control("pause"), methods=["POST"]),
        Route(f"{v1}/tasks/{{name}}/resume", task_control("resume"), methods=["POST"]),
        Route(f"{v1}/tasks/{{name}}/rewind", rewind_task, methods=["POST"]),
        Route(f"{v1}/tasks/{{name}}/retry", retry_task_runs, methods=["POST"]),
        Route(f"{v1}/runs", list_runs),
        Route(f"{v1}/runs/{{run_id}}", run_detail),
        Route(f"{v1}/runs/{{run_id}}/retry", retry_run, methods=["POST"]),
        Route(f"{v1}/runs/{{run_id}}/logs", run_logs),
        Route(f"{v1}/watchers/{{name}}/history", watcher_history),
        Route(f"{v1}/graph", asset_graph),
        Mount(
            "/static",
            app=StaticFiles(packages=[("watchkeeper.triggerer.api", "static")]),
            name="static",
        ),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders), Middleware(PathSegments)],
        exception_handlers={
            ApiError: _on_api_error,
            HTTPException: _on_http_error,
            StateStoreError: _on_store_error,
            Exception: _on_unexpected,
        },
    )
    app.state.ctx = ctx
    return app
