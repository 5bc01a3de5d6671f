"""Tasks (list, pause, resume) and runs (list, detail, retry)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import RunNotFoundError, RunStateError, TaskNotFoundError
from watchkeeper.store.backend import RUN_STATES, TaskInfo, TaskRun, get_logger

from ._base import MAX_PAGE, ApiError, authenticate, ctx_of, event_json, int_param, iso, require
from ._tokens import Principal

__all__ = ["list_runs", "list_tasks", "retry_run", "run_detail", "task_control"]

log = get_logger(__name__)


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
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "not_before": iso(run.not_before),
        "lease_owner": run.lease_owner,
        "lease_expires_at": iso(run.lease_expires_at),
        "errors": [
            {"try": e.try_number, "error": e.error, "traceback": e.traceback, "at": iso(e.at)}
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
    require(principal.can_see_watchers(), principal, f"{what} (needs read or operate)")
    return principal


async def list_tasks(request: Request) -> Response:
    principal = await _tasks_principal(request, "list tasks")
    infos = await ctx_of(request).tasks.alist_tasks()
    return JSONResponse(
        {"tasks": [_task(info) for info in infos], "may_operate": principal.can_operate()}
    )


def task_control(action: str) -> Callable[[Request], Awaitable[Response]]:
    """``POST /tasks/{name}/pause|resume``: a paused task gets no new runs and none is claimed."""
    paused = action == "pause"

    async def control(request: Request) -> Response:
        principal = await authenticate(request)
        require(principal.can_operate(), principal, f"{action} tasks (needs operate)")
        name = request.path_params["name"]
        tasks = ctx_of(request).tasks
        try:
            await tasks.aset_task_paused(name, paused)
        except TaskNotFoundError:
            raise ApiError(404, "not_found", f"no task named {name!r} is registered") from None
        log.info("task_control", task=name, action=action, by=principal.writer_name)
        found = [info for info in await tasks.alist_tasks() if info.name == name]
        body = _task(found[0]) if found else {"name": name, "paused": paused}
        return JSONResponse(body)

    return control


async def list_runs(request: Request) -> Response:
    await _tasks_principal(request, "list runs")
    task = request.query_params.get("task") or None
    state = request.query_params.get("state") or None
    if state is not None and state not in RUN_STATES:
        raise ApiError(
            400, "bad_request", f"state must be one of {', '.join(RUN_STATES)}, got {state!r}"
        )
    limit = int_param(request, "limit", 100, 1, MAX_PAGE)
    runs = await ctx_of(request).tasks.alist_runs(task=task, state=state, limit=limit)
    return JSONResponse({"runs": [_run(run) for run in runs]})


async def run_detail(request: Request) -> Response:
    principal = await _tasks_principal(request, "read runs")
    run_id = _run_id(request)
    try:
        run = await ctx_of(request).tasks.aget_run(run_id)
    except RunNotFoundError:
        raise ApiError(404, "not_found", f"no run with id {run_id}") from None
    body = _run(run)
    if principal.can_read():  # the events' payloads are asset data: read scope only
        body["events"] = [event_json(e) for e in run.events]
    return JSONResponse(body)


async def retry_run(request: Request) -> Response:
    principal = await authenticate(request)
    require(principal.can_operate(), principal, "retry runs (needs operate)")
    run_id = _run_id(request)
    try:
        run = await ctx_of(request).tasks.aretry_run(run_id)
    except RunNotFoundError:
        raise ApiError(404, "not_found", f"no run with id {run_id}") from None
    except RunStateError as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    log.info("run_control", run=run_id, action="retry", by=principal.writer_name)
    return JSONResponse(_run(run), status_code=202)
