"""Tasks (list, pause, resume, rewind, delete, retry of their failed runs) and runs (list,
detail, retry)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import (
    InvalidArgumentError,
    RunNotFoundError,
    RunStateError,
    TaskNotFoundError,
)
from watchkeeper.store.protocols import RUN_STATES, Writer, get_logger

from .._core import retry_failed_runs, task_record
from ._base import MAX_PAGE, ApiError, authenticate, ctx_of, int_param, require
from ._parse import parse_int, path_param
from ._scoping import run_json
from ._tokens import Principal

__all__ = [
    "delete_task",
    "list_runs",
    "list_tasks",
    "retry_run",
    "retry_task_runs",
    "rewind_task",
    "run_detail",
    "task_control",
]

log = get_logger(__name__)


def _run_id(request: Request) -> int:
    return parse_int(request.path_params["run_id"], "a run id", low=1)


async def _tasks_principal(request: Request, what: str) -> Principal:
    principal = await authenticate(request)
    require(principal.can_see_watchers(), principal, f"{what} (needs read or operate)")
    return principal


async def list_tasks(request: Request) -> Response:
    principal = await _tasks_principal(request, "list tasks")
    infos = await ctx_of(request).tasks.alist_tasks()
    return JSONResponse(
        {"tasks": [task_record(info) for info in infos], "may_operate": principal.can_operate()}
    )


def task_control(action: str) -> Callable[[Request], Awaitable[Response]]:
    """``POST /tasks/{name}/pause|resume``: a paused task gets no new runs and none is claimed."""
    paused = action == "pause"

    async def control(request: Request) -> Response:
        principal = await authenticate(request)
        require(principal.can_operate(), principal, f"{action} tasks (needs operate)")
        name = path_param(request, "name")
        tasks = ctx_of(request).tasks
        try:
            await tasks.aset_task_paused(name, paused)
        except TaskNotFoundError:
            raise ApiError(404, "not_found", f"no task named {name!r} is registered") from None
        log.info("task_control", task=name, action=action, by=principal.writer_name)
        found = [info for info in await tasks.alist_tasks() if info.name == name]
        body = task_record(found[0]) if found else {"name": name, "paused": paused}
        return JSONResponse(body)

    return control


async def rewind_task(request: Request) -> Response:
    """``POST /tasks/{name}/rewind?asset=A&to_event=ID``: the events of ``A`` from ``ID`` on
    run again. A rewind only moves back: an id past the asset's last event or after the
    task's cursor, or an asset outside its schedule, is a 409 that changes nothing."""
    principal = await authenticate(request)
    require(principal.can_operate(), principal, "rewind tasks (needs operate)")
    name = path_param(request, "name")
    asset = request.query_params.get("asset") or ""
    if not asset:
        raise ApiError(400, "bad_request", "asset is required: the scheduled asset to rewind")
    to_event = int_param(request, "to_event", 0, 1, None)
    if to_event == 0:
        raise ApiError(400, "bad_request", "to_event is required: the first event id to redeliver")
    tasks = ctx_of(request).tasks
    try:
        await tasks.arewind_task(name, asset, to_event, writer=Writer("api", principal.name))
    except TaskNotFoundError:
        raise ApiError(404, "not_found", f"no task named {name!r} is registered") from None
    except InvalidArgumentError as exc:  # well formed; the task's cursor or schedule refuses it
        raise ApiError(409, "conflict", str(exc)) from None
    log.info("task_control", task=name, action="rewind", asset=asset, to_event=to_event,
             by=principal.writer_name)  # fmt: skip
    found = [info for info in await tasks.alist_tasks() if info.name == name]
    return JSONResponse(task_record(found[0]) if found else {"name": name})


async def list_runs(request: Request) -> Response:
    principal = await _tasks_principal(request, "list runs")
    task = request.query_params.get("task") or None
    state = request.query_params.get("state") or None
    if state is not None and state not in RUN_STATES:
        raise ApiError(
            400, "bad_request", f"state must be one of {', '.join(RUN_STATES)}, got {state!r}"
        )
    limit = int_param(request, "limit", 100, 1, MAX_PAGE)
    before = int_param(request, "before", 0, 1, None) or None
    # One run more than the page: whether there is a next page, without a second call.
    runs = await ctx_of(request).tasks.alist_runs(
        task=task, state=state, limit=limit + 1, before=before, event_ids=True
    )
    more = len(runs) > limit
    page = runs[:limit]
    return JSONResponse(
        {
            "runs": [run_json(run, principal) for run in page],
            "next_before": page[-1].id if more else None,
            "more": more,
        }
    )


async def run_detail(request: Request) -> Response:
    principal = await _tasks_principal(request, "read runs")
    run_id = _run_id(request)
    try:
        run = await ctx_of(request).tasks.aget_run(run_id)
    except RunNotFoundError:
        raise ApiError(404, "not_found", f"no run with id {run_id}") from None
    return JSONResponse(run_json(run, principal, events=True))


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
    return JSONResponse(run_json(run, principal), status_code=202)


async def retry_task_runs(request: Request) -> Response:
    """``POST /tasks/{name}/retry?state=failed``: every failed run of the task queued for one
    more try, oldest first (as ``watchkeeper runs retry --task NAME``); 202 with their ids.
    Only failed runs can be retried, so ``state`` is ``failed`` or absent."""
    principal = await authenticate(request)
    require(principal.can_operate(), principal, "retry runs (needs operate)")
    name = path_param(request, "name")
    state = request.query_params.get("state", "failed")
    if state != "failed":
        raise ApiError(
            400,
            "bad_request",
            f"state must be failed (only failed runs can be retried), got {state!r}",
        )
    try:
        retried = await retry_failed_runs(ctx_of(request).tasks, name)
    except TaskNotFoundError:
        raise ApiError(404, "not_found", f"no task named {name!r} is registered") from None
    log.info("task_control", task=name, action="retry", runs=len(retried), by=principal.writer_name)
    return JSONResponse({"task": name, "retried": retried}, status_code=202)


async def delete_task(request: Request) -> Response:
    """``DELETE /tasks/{name}``: forget a task for good, its cursors and pending events (as
    ``watchkeeper tasks delete``); its runs stay until retention. 409 while a run of it is
    running (nothing changed)."""
    principal = await authenticate(request)
    require(principal.can_operate(), principal, "delete tasks (needs operate)")
    name = path_param(request, "name")
    try:
        await ctx_of(request).tasks.adelete_task(name)
    except TaskNotFoundError:
        raise ApiError(404, "not_found", f"no task named {name!r} is registered") from None
    except RunStateError as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    log.info("task_control", task=name, action="delete", by=principal.writer_name)
    return Response(status_code=204)
