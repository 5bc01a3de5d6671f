"""``GET /api/v1/openapi.json``: the OpenAPI 3.1 description of the REST API, written by hand.

It describes what the server does, exactly: every status a route answers (with its body's
schema), the headers (``ETag``, ``If-Match``, ``If-None-Match``, ``Allow`` on 405), the limits
of names, keys, ids and pages, and the parsing rules of :mod:`._parse`. The test suite fuzzes
the server against it (``tests/triggerer/test_api_conformance.py``), so a route that answers
what the document does not say fails there.
"""

from __future__ import annotations

from typing import Any

from watchkeeper.store import MAX_BIGINT, MAX_KEY_LENGTH, MAX_NAME_BYTES, MAX_VALUE_DEPTH

from ._base import MAX_PAGE

__all__ = ["openapi_document"]

_ID_MAX = MAX_BIGINT
# A name or key: no C0 control character or DEL (what the store's naming rule refuses); the
# store also counts at most MAX_NAME_BYTES bytes of UTF-8.
_NAME_PATTERN = "^[^\\u0000-\\u001f\\u007f]+$"
# RFC 9110's list of entity-tags; a bare version number is read as its ETag too.
_ETAG_ITEM = '((W/)?"[!#-~]*"|[0-9]+)'
_ETAG_LIST = f"^(\\*|{_ETAG_ITEM}( ?, ?{_ETAG_ITEM})*)$"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema}},
        **extra,
    }


def _error(description: str) -> dict[str, Any]:
    return _json(description, _ref("Error"))


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
        _ref("Error"),
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


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def _obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **optional},
    }


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUM = {"type": "number"}
_VALUE = {
    "not": {"type": "null"},
    "description": f"any JSON value but null, nested at most {MAX_VALUE_DEPTH} deep",
}

_SCHEMAS: dict[str, Any] = {
    "Error": _obj({"error": _STR, "detail": _STR}),
    "Conflict": _obj(
        {"error": {"const": "version_conflict"}, "detail": _STR, "current_version": _INT}
    ),
    "Asset": _obj(
        {
            "name": _STR,
            "uri": _nullable("string"),
            "active": _BOOL,
            "updated_at": _nullable("string"),
        }
    ),
    "Assets": _obj({"assets": _array(_ref("Asset"))}, may_read_all=_BOOL),
    "AssetDetail": _obj(
        {
            "name": _STR,
            "uri": _nullable("string"),
            "active": _BOOL,
            "updated_at": _nullable("string"),
            "state": _array(_ref("Entry")),
            "watchers": _array(_ref("Watcher")),
            "writable": _BOOL,
        }
    ),
    "Entry": _obj(
        {
            "key": _STR,
            "value": _VALUE,
            "version": {"type": "integer", "minimum": 1},
            "writer": _nullable("string"),
            "updated_at": _nullable("string"),
        }
    ),
    "Entries": _obj({"asset": _STR, "entries": _array(_ref("Entry"))}),
    "Written": _obj({"asset": _STR, "key": _STR, "version": {"type": "integer", "minimum": 1}}),
    "Event": _obj(
        {
            "id": _INT,
            "asset": _STR,
            "watcher": _STR,
            "payload": {},
            "dedup_key": _nullable("string"),
            "created_at": _STR,
        }
    ),
    "EventPage": _obj(
        {"events": _array(_ref("Event")), "next_after": _INT, "more": _BOOL},
        next_before={**_nullable("integer"), "description": "with order=desc: the next page"},
    ),
    "Watcher": _obj(
        {
            "watcher": _STR,
            "trigger_id": _nullable("string"),
            "assets": _array(_STR),
            "state": _STR,
            "daemon": _nullable("string"),
            "events": _INT,
            "failures": _INT,
            "last_event_at": _nullable("string"),
            "last_event_age_seconds": _nullable("number"),
            "last_error": {
                **_nullable("string"),
                "description": "without read scope: the error's type only",
            },
            "paused": _BOOL,
        },
        events_in_window=_nullable("integer"),
        events_per_minute=_nullable("number"),
    ),
    "Watchers": _obj(
        {"watchers": _array(_ref("Watcher")), "may_operate": _BOOL},
        rate_window_seconds=_INT,
    ),
    "Control": _obj(
        {
            "watcher": _STR,
            "paused": _BOOL,
            "retry_seq": _INT,
            "updated_by": _nullable("string"),
            "known": _BOOL,
        }
    ),
    "Daemon": _obj(
        {
            "owner": _STR,
            "state": {"type": "string", "enum": ["running", "stale"]},
            "heartbeat_age_seconds": _NUM,
            "heartbeat_at": _nullable("string"),
            "lease_ttl_seconds": _NUM,
            "started_at": _nullable("string"),
            "watchers_path": _nullable("string"),
            "refused": _array(_obj({"file": _STR, "watcher": _nullable("string"), "reason": _STR})),
            "leases": _INT,
        }
    ),
    "Daemons": _obj({"daemons": _array(_ref("Daemon"))}),
    "Task": _obj(
        {
            "name": _STR,
            "assets": _array(_STR),
            "mode": {"type": "string", "enum": ["all", "any"]},
            "max_events": _nullable("integer"),
            "max_tries": _INT,
            "paused": _BOOL,
            "pending": {"type": "object", "additionalProperties": _INT},
            "cursors": {"type": "object", "additionalProperties": _INT},
        }
    ),
    "Tasks": _obj({"tasks": _array(_ref("Task")), "may_operate": _BOOL}),
    "Run": _obj(
        {
            "id": _INT,
            "task": _STR,
            "state": {"type": "string", "enum": ["queued", "running", "success", "failed"]},
            "try_number": _INT,
            "max_tries": _INT,
            "event_count": _INT,
            "created_at": _nullable("string"),
            "errors": _array(
                _obj(
                    {
                        "try": _INT,
                        "error": _nullable("string"),
                        "traceback": _nullable("string"),
                        "at": _nullable("string"),
                    },
                    cause={"type": "string", "enum": ["task_error", "timeout", "worker_lost"]},
                )
            ),
        },
        failures=_INT,
        lost_tries=_INT,
        event_ids=_array(_INT),
        data_withheld={**_BOOL, "description": "errors' text and events withheld (no read)"},
        events={**_array(_ref("Event")), "description": "for tokens with read scope"},
    ),
    "Runs": _obj(
        {"runs": _array(_ref("Run"))},
        next_before={**_nullable("integer"), "description": "pass as before: the next page"},
        more=_BOOL,
    ),
}


def openapi_document() -> dict[str, Any]:
    """The document (a fresh dict each call)."""
    control: dict[str, Any] = {
        "parameters": [_NAME],
        "responses": {
            "202": _json("recorded; the daemon acts within one heartbeat", _ref("Control")),
            "400": _error("a name the store refuses"),
            "404": _error("no watcher of that name (the detail names the closest)"),
        },
    }
    task: dict[str, Any] = {
        "parameters": [_NAME],
        "responses": {
            "200": _json("the task, paused or not", _ref("Task")),
            "404": _error("no such task"),
        },
    }
    conflict = _json(
        "a precondition failed; current_version is the entry's version (0: not set)",
        _ref("Conflict"),
        headers={"ETag": {"required": False, "schema": {"type": "string"}}},
    )
    return {
        "openapi": "3.1.0",
        "info": {"title": "watchkeeper", "version": "1"},
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/assets": {
                "get": _op(
                    "registered assets the token may read",
                    {"200": _json("assets", _ref("Assets"))},
                )
            },
            "/api/v1/assets/{name}": {
                "get": _op(
                    "an asset with its state entries and watchers",
                    {
                        "200": _json("the asset", _ref("AssetDetail")),
                        "404": _error("no such asset"),
                    },
                    parameters=[_NAME],
                )
            },
            "/api/v1/assets/{name}/state": {
                "get": _op(
                    "the asset's state entries",
                    {"200": _json("entries", _ref("Entries")), "404": _error("no such asset")},
                    bad=True,
                    parameters=[_NAME],
                )
            },
            "/api/v1/assets/{name}/state/{key}": {
                "parameters": [_NAME, _KEY],
                "get": _op(
                    "one entry; its version is the ETag",
                    {
                        "200": _json("the entry", _ref("Entry"), headers=_ETAG_HEADER),
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
                        "200": _json("written", _ref("Written"), headers=_ETAG_HEADER),
                        "201": _json("created", _ref("Written"), headers=_ETAG_HEADER),
                        "404": _error("no such asset"),
                        "412": conflict,
                        "413": _error("over the size limit (max_value_bytes)"),
                    },
                    bad=True,
                    parameters=[_IF_MATCH, _IF_NONE_MATCH],
                    requestBody={
                        "required": True,
                        "content": {"application/json": {"schema": _VALUE}},
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
            "/api/v1/events": {
                "get": _op(
                    "committed events after an id, in id order",
                    {"200": _json("a page of events", _ref("EventPage"))},
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
            "/api/v1/watchers": {
                "get": _op("every watcher", {"200": _json("watchers", _ref("Watchers"))})
            },
            "/api/v1/watchers/{name}/pause": {"post": _op("pause", **control)},
            "/api/v1/watchers/{name}/resume": {"post": _op("resume", **control)},
            "/api/v1/watchers/{name}/retry": {"post": _op("retry a failed watcher", **control)},
            "/api/v1/daemons": {
                "get": _op(
                    "daemons with their leases and heartbeat age",
                    {"200": _json("daemons", _ref("Daemons"))},
                )
            },
            "/api/v1/tasks": {
                "get": _op(
                    "tasks with their pending events per asset and whether paused",
                    {"200": _json("tasks", _ref("Tasks"))},
                )
            },
            "/api/v1/tasks/{name}/pause": {"post": _op("pause a task (needs operate)", **task)},
            "/api/v1/tasks/{name}/resume": {"post": _op("resume a task (needs operate)", **task)},
            "/api/v1/tasks/{name}/rewind": {
                "post": _op(
                    "redeliver a scheduled asset's events from an id on (needs operate); a "
                    "rewind only moves the cursor back",
                    {
                        "200": _json("the task", _ref("Task")),
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
            "/api/v1/runs": {
                "get": _op(
                    "runs, newest first",
                    {"200": _json("runs", _ref("Runs"))},
                    bad=True,
                    parameters=[
                        {
                            "name": "task",
                            "in": "query",
                            "description": "only this task's runs (empty or absent: every task)",
                            "schema": {"type": "string"},
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
                    {"200": _json("the run", _ref("Run")), "404": _error("no such run")},
                    bad=True,
                    parameters=[_RUN],
                )
            },
            "/api/v1/runs/{run_id}/retry": {
                "post": _op(
                    "queue a failed run again with one more try (needs operate)",
                    {
                        "202": _json("queued", _ref("Run")),
                        "404": _error("no such run"),
                        "409": _error("the run has not failed"),
                    },
                    bad=True,
                    parameters=[_RUN],
                )
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _SCHEMAS,
        },
    }
