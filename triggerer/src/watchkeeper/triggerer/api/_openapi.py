"""``GET /api/v1/openapi.json``: the OpenAPI 3.1 description of the REST API, written by hand."""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


_AUTH = {"401": _error("no valid bearer token"), "403": _error("outside the token's scopes")}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_KEY = {"name": "key", "in": "path", "required": True, "schema": {"type": "string"}}
_ASSET_Q = {"name": "asset", "in": "query", "schema": {"type": "string"}}
_RUN = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "integer"}}
_AFTER_Q = {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}}


def _ok(description: str, schema: str | None = None) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def _op(summary: str, responses: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    given = extra.pop("responses", None) or responses or {}
    return {"summary": summary, "responses": {**given, **_AUTH}, **extra}


def openapi_document() -> dict[str, Any]:
    """The document (a fresh dict each call)."""
    control: dict[str, Any] = {
        "parameters": [_NAME],
        "responses": {"202": _ok("recorded; the daemon acts within one heartbeat", "Control")},
    }
    task: dict[str, Any] = {
        "parameters": [_NAME],
        "responses": {"200": _ok("the task, paused or not", "Task"), "404": _error("no such task")},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "watchkeeper", "version": "1"},
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/assets": {
                "get": _op("registered assets the token may read", {"200": _ok("assets")})
            },
            "/api/v1/assets/{name}": {
                "get": _op(
                    "an asset with its state entries and watchers",
                    {"200": _ok("the asset"), "404": _error("no such asset")},
                    parameters=[_NAME],
                )
            },
            "/api/v1/assets/{name}/state": {
                "get": _op("the asset's state entries", {"200": _ok("entries")}, parameters=[_NAME])
            },
            "/api/v1/assets/{name}/state/{key}": {
                "parameters": [_NAME, _KEY],
                "get": _op(
                    "one entry; its version is the ETag",
                    {"200": _ok("the entry", "Entry"), "404": _error("key not set")},
                ),
                "put": _op(
                    "write the JSON body as the value; If-Match makes it a compare-and-set",
                    {
                        "200": _ok("written"),
                        "201": _ok("created"),
                        "400": _error("not JSON, or a value the store refuses"),
                        "412": _error("If-Match does not match; current_version says what does"),
                        "413": _error("over max_value_bytes"),
                    },
                    requestBody={"required": True, "content": {"application/json": {}}},
                ),
                "delete": _op(
                    "delete the key; If-Match makes it conditional",
                    {"204": _ok("deleted"), "412": _error("If-Match does not match")},
                ),
            },
            "/api/v1/events": {
                "get": _op(
                    "committed events after an id, in id order",
                    {"200": _ok("a page of events", "EventPage")},
                    parameters=[
                        _ASSET_Q,
                        _AFTER_Q,
                        {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                        {
                            "name": "before",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1},
                        },
                        {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                    ],
                )
            },
            "/api/v1/events/stream": {
                "get": _op(
                    "Server-Sent Events of new events; resumes after Last-Event-ID",
                    {
                        "200": {"description": "text/event-stream"},
                        "404": _error("no such asset"),
                        "429": _error("the token holds max_streams_per_token streams"),
                    },
                    parameters=[
                        _ASSET_Q,
                        _AFTER_Q,
                        {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                    ],
                )
            },
            "/api/v1/watchers": {"get": _op("every watcher", {"200": _ok("watchers")})},
            "/api/v1/watchers/{name}/pause": {"post": _op("pause", **control)},
            "/api/v1/watchers/{name}/resume": {"post": _op("resume", **control)},
            "/api/v1/watchers/{name}/retry": {"post": _op("retry a failed watcher", **control)},
            "/api/v1/daemons": {
                "get": _op("daemons with their leases and heartbeat age", {"200": _ok("daemons")})
            },
            "/api/v1/tasks": {
                "get": _op(
                    "tasks with their pending events per asset and whether paused",
                    {"200": _ok("tasks")},
                )
            },
            "/api/v1/tasks/{name}/pause": {"post": _op("pause a task (needs operate)", **task)},
            "/api/v1/tasks/{name}/resume": {"post": _op("resume a task (needs operate)", **task)},
            "/api/v1/tasks/{name}/rewind": {
                "post": _op(
                    "redeliver a scheduled asset's events from an id on (needs operate); a "
                    "rewind only moves the cursor back",
                    {
                        "200": _ok("the task", "Task"),
                        "400": _error(
                            "an id past the log's end or after the cursor, or an "
                            "asset outside the schedule"
                        ),
                        "404": _error("no such task"),
                    },
                    parameters=[
                        _NAME,
                        {
                            "name": "asset",
                            "in": "query",
                            "required": True,
                            "schema": {"type": "string"},
                        },
                        {
                            "name": "to_event",
                            "in": "query",
                            "required": True,
                            "schema": {"type": "integer", "minimum": 1},
                        },
                    ],
                )
            },
            "/api/v1/runs": {
                "get": _op(
                    "runs, newest first",
                    {"200": _ok("runs"), "400": _error("an unknown state")},
                    parameters=[
                        {"name": "task", "in": "query", "schema": {"type": "string"}},
                        {"name": "state", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                        {
                            "name": "before",
                            "in": "query",
                            "description": "runs with ids below this one: pass a page's "
                            "next_before to get the next page (null next_before: no more)",
                            "schema": {"type": "integer", "minimum": 1},
                        },
                    ],
                )
            },
            "/api/v1/runs/{run_id}": {
                "get": _op(
                    "one run with its errors and its events (operate alone: error types only)",
                    {"200": _ok("the run", "Run"), "404": _error("no such run")},
                    parameters=[_RUN],
                )
            },
            "/api/v1/runs/{run_id}/retry": {
                "post": _op(
                    "queue a failed run again with one more try (needs operate)",
                    {
                        "202": _ok("queued", "Run"),
                        "404": _error("no such run"),
                        "409": _error("the run has not failed"),
                    },
                    parameters=[_RUN],
                )
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "detail"],
                    "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
                },
                "Entry": {
                    "type": "object",
                    "properties": {
                        "key": {"type": "string"},
                        "value": {},
                        "version": {"type": "integer"},
                        "writer": {"type": ["string", "null"]},
                        "updated_at": {"type": "string"},
                    },
                },
                "EventPage": {
                    "type": "object",
                    "properties": {
                        "events": {"type": "array"},
                        "next_after": {"type": "integer"},
                        "next_before": {"type": ["integer", "null"]},
                        "more": {"type": "boolean"},
                    },
                },
                "Task": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "assets": {"type": "array", "items": {"type": "string"}},
                        "mode": {"type": "string", "enum": ["all", "any"]},
                        "paused": {"type": "boolean"},
                        "pending": {"type": "object"},
                    },
                },
                "Run": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "task": {"type": "string"},
                        "state": {
                            "type": "string",
                            "enum": ["queued", "running", "success", "failed"],
                        },
                        "try_number": {"type": "integer"},
                        "max_tries": {"type": "integer"},
                        "event_count": {"type": "integer"},
                        "errors": {"type": "array"},
                    },
                },
                "Control": {
                    "type": "object",
                    "properties": {
                        "watcher": {"type": "string"},
                        "paused": {"type": "boolean"},
                        "retry_seq": {"type": "integer"},
                    },
                },
            },
        },
    }
