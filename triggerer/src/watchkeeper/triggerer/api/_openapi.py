"""``GET /api/v1/openapi.json``: the OpenAPI 3.1 description of the REST API, written by hand.

It describes what the server does, exactly: every status a route answers (with its body's
schema), the headers (``ETag``, ``If-Match``, ``If-None-Match``, ``Allow`` on 405), the limits
of names, keys, ids and pages, and the parsing rules of :mod:`._parse`. The test suite fuzzes
the server against it (``tests/triggerer/test_api_conformance.py``), so a route that answers
what the document does not say fails there.
"""

from __future__ import annotations

from typing import Any

from watchkeeper.store import MAX_BIGINT, MAX_KEY_LENGTH, MAX_NAME_BYTES

from ._base import MAX_PAGE
from ._openapi_hooks import hook_paths
from ._openapi_logs import LOG_SCHEMAS, log_paths
from ._schemas import SCHEMAS, VALUE, ref

__all__ = ["openapi_document"]

_ID_MAX = MAX_BIGINT
# A name or key: no C0 control character or DEL (what the store's naming rule refuses); the
# store also counts at most MAX_NAME_BYTES bytes of UTF-8.
_NAME_PATTERN = "^[^\\u0000-\\u001f\\u007f]+$"
# RFC 9110's list of entity-tags; a bare version number is read as its ETag too.
_ETAG_ITEM = '((W/)?"[!#-~]*"|[0-9]+)'
_ETAG_LIST = f"^(\\*|{_ETAG_ITEM}( ?, ?{_ETAG_ITEM})*)$"


def _json(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema}},
        **extra,
    }


def _error(description: str) -> dict[str, Any]:
    return _json(description, ref("Error"))


_ETAG_HEADER = {
    "ETag": {
        "description": "the entry's version as a strong ETag",
        "required": True,
        "schema": {"type": "string", "pattern": '^"[0-9]+"$'},
    }
}
_COMMON = {
    "401": _json(
        "no valid bearer token",
        ref("Error"),
        headers={"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
    ),
    "403": _error("outside the token's scopes"),
    "501": _error("the store keeps no tokens, controls or tasks"),
    "503": _error("the store does not answer"),
}
_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": (
        f"a name (at most {MAX_NAME_BYTES} bytes of UTF-8, no control character); "
        "a '/' in it is sent as %2F"
    ),
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_NAME_BYTES,
        "pattern": _NAME_PATTERN,
    },
}
_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": f"a state key (at most {MAX_KEY_LENGTH} characters, no control character)",
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_LENGTH,
        "pattern": _NAME_PATTERN,
    },
}
_ASSET_Q = {
    "name": "asset",
    "in": "query",
    "description": "only this asset's events (empty or absent: every asset)",
    "schema": {
        "type": "string",
        "maxLength": MAX_NAME_BYTES,
        "pattern": "^[^\\u0000-\\u001f\\u007f]*$",
    },
}
_RUN = {
    "name": "run_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": _ID_MAX},
}
_AFTER_Q = {
    "name": "after",
    "in": "query",
    "description": "the id of the last event seen (absent: 0; on the stream, absent: from now on)",
    "schema": {"type": "integer", "minimum": 0, "maximum": _ID_MAX},
}
_LIMIT_Q = {
    "name": "limit",
    "in": "query",
    "description": "at most this many (absent: 100)",
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
}
_IF_MATCH = {
    "name": "If-Match",
    "in": "header",
    "description": "* or ETags; the request applies only if the entry's ETag is one of them "
    "(strong comparison: a weak ETag never matches)",
    "schema": {"type": "string", "pattern": _ETAG_LIST},
}
_IF_NONE_MATCH = {
    "name": "If-None-Match",
    "in": "header",
    "description": "* or ETags; the request applies only if the entry's ETag is none of them "
    "(weak comparison; * : only if the key is not set)",
    "schema": {"type": "string", "pattern": _ETAG_LIST},
}
_BAD = _error("a malformed parameter, header or body (the detail names it)")


def _op(
    summary: str, responses: dict[str, Any], *, bad: bool = False, **extra: Any
) -> dict[str, Any]:
    given = {**responses, **_COMMON}
    if bad:
        given["400"] = _BAD
    return {"summary": summary, "responses": given, **extra}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the REST API.

    :returns: a fresh dict each call: the paths of every route, by resource, and the body schemas.
    """
    return {
        "openapi": "3.1.0",
        "info": {"title": "watchkeeper", "version": "1"},
        "security": [{"bearer": []}],
        "paths": {
            **_asset_paths(),
            **_state_entry_path(),
            **_event_paths(),
            **_watcher_paths(),
            **_task_paths(),
            **_run_paths(),
            **log_paths(_COMMON),
            **_view_paths(),
            **hook_paths(),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {**SCHEMAS, **LOG_SCHEMAS},
        },
    }


def _asset_paths() -> dict[str, Any]:
    """The assets, one asset, and its state entries."""
    return {
        "/api/v1/assets": {
            "get": _op(
                "registered assets the token may read",
                {"200": _json("assets", ref("Assets"))},
            )
        },
        "/api/v1/assets/{name}": {
            "get": _op(
                "an asset with its state entries and watchers",
                {
                    "200": _json("the asset", ref("AssetDetail")),
                    "404": _error("no such asset"),
                },
                parameters=[_NAME],
            )
        },
        "/api/v1/assets/{name}/state": {
            "get": _op(
                "the asset's state entries",
                {"200": _json("entries", ref("Entries")), "404": _error("no such asset")},
                bad=True,
                parameters=[_NAME],
            )
        },
    }


def _state_entry_path() -> dict[str, Any]:
    """One state entry: read, write and delete, with its version as the ETag."""
    conflict = _json(
        "a precondition failed; current_version is the entry's version (0: not set)",
        ref("Conflict"),
        headers={"ETag": {"required": False, "schema": {"type": "string"}}},
    )
    return {
        "/api/v1/assets/{name}/state/{key}": {
            "parameters": [_NAME, _KEY],
            "get": _op(
                "one entry; its version is the ETag",
                {
                    "200": _json("the entry", ref("Entry"), headers=_ETAG_HEADER),
                    "304": {
                        "description": "If-None-Match holds the entry's ETag",
                        "headers": _ETAG_HEADER,
                    },
                    "404": _error("no such asset, or the key is not set"),
                    "412": conflict,
                },
                bad=True,
                parameters=[_IF_MATCH, _IF_NONE_MATCH],
            ),
            "put": _op(
                "write the JSON body as the value; If-Match/If-None-Match make it a "
                "compare-and-set",
                {
                    "200": _json("written", ref("Written"), headers=_ETAG_HEADER),
                    "201": _json("created", ref("Written"), headers=_ETAG_HEADER),
                    "404": _error("no such asset"),
                    "412": conflict,
                    "413": _error("over the size limit (max_value_bytes)"),
                },
                bad=True,
                parameters=[_IF_MATCH, _IF_NONE_MATCH],
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": VALUE}},
                },
            ),
            "delete": _op(
                "delete the key (204 when it was not set); If-Match/If-None-Match make "
                "it conditional",
                {
                    "204": {"description": "deleted"},
                    "404": _error("no such asset"),
                    "412": conflict,
                },
                bad=True,
                parameters=[_IF_MATCH, _IF_NONE_MATCH],
            ),
        },
    }


def _event_paths() -> dict[str, Any]:
    """The event log: pages, and the live stream."""
    return {
        "/api/v1/events": {
            "get": _op(
                "committed events after an id, in id order",
                {"200": _json("a page of events", ref("EventPage"))},
                bad=True,
                parameters=[
                    _ASSET_Q,
                    _AFTER_Q,
                    _LIMIT_Q,
                    {
                        "name": "before",
                        "in": "query",
                        "description": "only events with ids below this one",
                        "schema": {"type": "integer", "minimum": 1, "maximum": _ID_MAX},
                    },
                    {
                        "name": "order",
                        "in": "query",
                        "description": "asc (absent): oldest first; desc: newest first",
                        "schema": {"type": "string", "enum": ["asc", "desc"]},
                    },
                ],
            )
        },
        "/api/v1/events/stream": {
            "get": _op(
                "Server-Sent Events of new events; resumes after Last-Event-ID",
                {
                    "200": {
                        "description": "a stream of 'asset_event' frames, each with its id",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    "404": _error("no such asset"),
                    "429": _error(
                        "the token holds [api] max_streams_per_token open streams",
                    )
                    | {"headers": {"Retry-After": {"schema": {"type": "string"}}}},
                },
                bad=True,
                parameters=[
                    _ASSET_Q,
                    _AFTER_Q,
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "description": "resume after this event id (wins over after)",
                        "schema": {"type": "string", "pattern": "^[ \\t]*[0-9]{1,19}[ \\t]*$"},
                    },
                ],
            )
        },
    }


def _watcher_paths() -> dict[str, Any]:
    """The watchers, their controls, and the daemons."""
    control: dict[str, Any] = {
        "parameters": [_NAME],
        "responses": {
            "202": _json("recorded; the daemon acts within one heartbeat", ref("Control")),
            "400": _error("a name the store refuses"),
            "404": _error("no watcher of that name (the detail names the closest)"),
        },
    }
    return {
        "/api/v1/watchers": {
            "get": _op("every watcher", {"200": _json("watchers", ref("Watchers"))})
        },
        "/api/v1/watchers/{name}/pause": {"post": _op("pause", **control)},
        "/api/v1/watchers/{name}/resume": {"post": _op("resume", **control)},
        "/api/v1/watchers/{name}/retry": {"post": _op("retry a failed watcher", **control)},
        "/api/v1/daemons": {
            "get": _op(
                "daemons with their leases and heartbeat age",
                {"200": _json("daemons", ref("Daemons"))},
            )
        },
    }


def _task_paths() -> dict[str, Any]:
    """The tasks: their controls, rewind, deletion and the retry of their failed runs."""
    task: dict[str, Any] = {
        "parameters": [_NAME],
        "responses": {
            "200": _json("the task, paused or not", ref("Task")),
            "400": _error("a name the store refuses"),
            "404": _error("no such task"),
        },
    }
    return {
        "/api/v1/tasks": {
            "get": _op(
                "tasks with their pending events per asset and whether paused",
                {"200": _json("tasks", ref("Tasks"))},
            )
        },
        "/api/v1/tasks/{name}": {
            "delete": _op(
                "forget a task: its cursors and pending events; its runs kept (needs operate)",
                {
                    "204": {"description": "deleted"},
                    "404": _error("no such task"),
                    "409": _error("a run of the task is running: nothing changed"),
                },
                bad=True,
                parameters=[_NAME],
            )
        },
        "/api/v1/tasks/{name}/pause": {"post": _op("pause a task (needs operate)", **task)},
        "/api/v1/tasks/{name}/resume": {"post": _op("resume a task (needs operate)", **task)},
        "/api/v1/tasks/{name}/retry": {
            "post": _op(
                "queue every failed run of a task for one more try, oldest first (needs operate)",
                {"202": _json("the runs queued", ref("TaskRetry")), "404": _error("no such task")},
                bad=True,
                parameters=[
                    _NAME,
                    {
                        "name": "state",
                        "in": "query",
                        "description": "the runs to retry: only failed runs can be (absent: failed)",
                        "schema": {"type": "string", "enum": ["failed"]},
                    },
                ],
            )
        },
        "/api/v1/tasks/{name}/rewind": {
            "post": _op(
                "redeliver a scheduled asset's events from an id on (needs operate); a "
                "rewind only moves the cursor back",
                {
                    "200": _json("the task", ref("Task")),
                    "409": _error(
                        "an id past the log's end or after the cursor, or an "
                        "asset outside the schedule: nothing changed"
                    ),
                    "404": _error("no such task"),
                },
                bad=True,
                parameters=[
                    _NAME,
                    {
                        "name": "asset",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1, "pattern": _NAME_PATTERN},
                    },
                    {
                        "name": "to_event",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 1, "maximum": _ID_MAX},
                    },
                ],
            )
        },
    }


def _run_paths() -> dict[str, Any]:
    """The runs, one run, and its retry."""
    return {
        "/api/v1/runs": {
            "get": _op(
                "runs, newest first",
                {"200": _json("runs", ref("Runs"))},
                bad=True,
                parameters=[
                    {
                        "name": "task",
                        "in": "query",
                        "description": "only this task's runs (empty or absent: every task)",
                        "schema": {
                            "type": "string",
                            "maxLength": MAX_NAME_BYTES,
                            "pattern": "^[^\\u0000-\\u001f\\u007f]*$",
                        },
                    },
                    {
                        "name": "state",
                        "in": "query",
                        "description": "only runs in this state (empty or absent: any)",
                        "schema": {
                            "type": "string",
                            "enum": ["", "queued", "running", "success", "failed"],
                        },
                    },
                    _LIMIT_Q,
                    {
                        "name": "before",
                        "in": "query",
                        "description": "runs with ids below this one: a page's next_before",
                        "schema": {"type": "integer", "minimum": 1, "maximum": _ID_MAX},
                    },
                ],
            )
        },
        "/api/v1/runs/{run_id}": {
            "get": _op(
                "one run with its errors and its events (operate alone: error types only)",
                {"200": _json("the run", ref("Run")), "404": _error("no such run")},
                bad=True,
                parameters=[_RUN],
            )
        },
        "/api/v1/runs/{run_id}/retry": {
            "post": _op(
                "queue a failed run again with one more try (needs operate)",
                {
                    "202": _json("queued", ref("Run")),
                    "404": _error("no such run"),
                    "409": _error("the run has not failed"),
                },
                bad=True,
                parameters=[_RUN],
            )
        },
    }


def _view_paths() -> dict[str, Any]:
    """The read routes behind the page's watcher view and asset graph."""
    return {
        "/api/v1/watchers/{name}/history": {
            "get": _op(
                "a watcher's last hour: event rate and last-event age per sample, and its "
                "state changes (operate alone: an error's type only)",
                {
                    "200": _json("the watcher's history", ref("WatcherHistory")),
                    "404": _error("no watcher of that name (the detail names the closest)"),
                },
                parameters=[_NAME],
            )
        },
        "/api/v1/graph": {
            "get": _op(
                "assets, the watchers feeding them, the tasks scheduled on them and the "
                "assets those tasks emitted (from their newest successful runs)",
                {"200": _json("the graph", ref("Graph"))},
            )
        },
    }
