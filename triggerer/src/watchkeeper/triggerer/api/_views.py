"""The read routes behind the page's pictures: a watcher's last hour, and the asset graph.

``GET /api/v1/watchers/{name}/history`` answers the points and state changes
:class:`~._series.WatcherSeries` keeps. ``GET /api/v1/graph`` answers the assets, the
watchers that feed them, the tasks scheduled on them and the assets those tasks emit: a
task's outlets are not declared to the store, so they are read from its newest successful
runs (the assets of their outlet events); a task that has not yet succeeded emits nothing in
the graph. Both are the operational record (names, states, counts): ``read`` or ``operate``.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import TaskInfo

from ..daemon import unknown_watcher, watcher_rows
from ._base import ApiError, authenticate, ctx_of, require
from ._parse import path_param
from ._scoping import error_type
from ._series import WatcherSeries

__all__ = ["asset_graph", "watcher_history"]

OUTLET_RUNS: Final = 5
"""A task's newest successful runs whose outlet events name the assets it emits."""
MAX_OUTLET_IDS: Final = 50
"""Most outlet events looked up per task and request."""
_ASSET_OF_CACHE: Final = 10_000
"""Event ids whose asset one server remembers (an event's asset never changes)."""


async def watcher_history(request: Request) -> Response:
    principal = await authenticate(request)
    require(principal.can_see_watchers(), principal, "read watchers (needs read or operate)")
    name = path_param(request, "name")
    ctx = ctx_of(request)
    rows = {row.watcher: row for row in await watcher_rows(ctx.backend)}
    series = ctx.series or WatcherSeries(ctx.backend)
    row = rows.get(name)
    if row is None and not series.knows(name):
        raise ApiError(404, "not_found", unknown_watcher(name, rows))
    view = series.view(name)
    if not principal.can_read():  # an error's text is data; its type is not
        for change in view["changes"]:
            if change["state"] in ("failed", "backing_off"):
                change["detail"] = error_type(change["detail"])
    return JSONResponse(
        {
            "watcher": name,
            "state": None if row is None else row.state,
            "assets": [] if row is None else list(row.assets),
            **view,
        }
    )


async def asset_graph(request: Request) -> Response:
    principal = await authenticate(request)
    require(principal.can_see_watchers(), principal, "read the graph (needs read or operate)")
    ctx = ctx_of(request)
    backend = ctx.backend
    assets = await backend.events.alist_assets()
    rows = await watcher_rows(backend)
    tasks: list[TaskInfo] = []
    last_run: dict[str, str] = {}
    emits: dict[str, list[str]] = {}
    if backend.services.tasks is not None:
        tasks = await backend.tasks.alist_tasks()
        state = request.app.state
        cache: dict[int, str] | None = getattr(state, "graph_asset_of", None)
        if cache is None:
            cache = state.graph_asset_of = {}
        for info in tasks:
            runs = await backend.tasks.alist_runs(task=info.name, limit=1)
            if runs:
                last_run[info.name] = runs[0].state
            emits[info.name] = await _outlets(backend, info.name, cache)

    nodes: dict[str, dict[str, Any]] = {}
    edges: list[dict[str, str]] = []

    def asset_node(name: str) -> str:
        key = f"asset:{name}"
        nodes.setdefault(
            key, {"id": key, "kind": "asset", "name": name, "state": "active", "backlog": 0}
        )
        return key

    for asset in assets:
        nodes[asset_node(asset.name)]["state"] = "active" if asset.active else "inactive"
    for row in rows:
        key = f"watcher:{row.watcher}"
        nodes[key] = {
            "id": key,
            "kind": "watcher",
            "name": row.watcher,
            "state": row.state,
            "backlog": None,
        }
        edges.extend({"from": key, "to": asset_node(a), "kind": "feeds"} for a in row.assets)
    for info in tasks:
        key = f"task:{info.name}"
        pending = sum(info.pending.get(a, 0) for a in info.spec.assets)
        nodes[key] = {
            "id": key,
            "kind": "task",
            "name": info.name,
            "state": "paused" if info.paused else last_run.get(info.name, "idle"),
            "backlog": pending,
        }
        for scheduled in info.spec.assets:
            source = asset_node(scheduled)
            nodes[source]["backlog"] += info.pending.get(scheduled, 0)
            edges.append({"from": source, "to": key, "kind": "schedules"})
        edges.extend(
            {"from": key, "to": asset_node(a), "kind": "emits"} for a in emits.get(info.name, [])
        )
    return JSONResponse({"nodes": list(nodes.values()), "edges": edges})


async def _outlets(backend: BaseStateBackend, task: str, cache: dict[int, str]) -> list[str]:
    """The assets of the outlet events of ``task``'s newest successful runs, sorted."""
    assert backend.services.tasks is not None
    ids: list[int] = []
    for run in await backend.tasks.alist_runs(task=task, state="success", limit=OUTLET_RUNS):
        ids.extend(run.outlet_event_ids)
    found: set[str] = set()
    for event_id in sorted(set(ids))[-MAX_OUTLET_IDS:]:
        asset = cache.get(event_id)
        if asset is None and backend.services.events is not None:
            events = await backend.events.alist_events(since_id=event_id - 1, limit=1)
            if events and events[0].id == event_id:
                asset = events[0].asset
                if len(cache) >= _ASSET_OF_CACHE:
                    cache.clear()
                cache[event_id] = asset
        if asset is not None:
            found.add(asset)
    return sorted(found)
