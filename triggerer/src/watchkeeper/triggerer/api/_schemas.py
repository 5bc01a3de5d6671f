"""The schemas of the OpenAPI document's bodies (``components.schemas``), and the helpers
that write them: each body the API answers, with the fields it always has (``required``) and
those it has only sometimes."""

from __future__ import annotations

from typing import Any

from watchkeeper.store import MAX_VALUE_DEPTH

__all__ = ["BOOL", "INT", "SCHEMAS", "STR", "VALUE", "array", "nullable", "obj", "ref"]


def ref(name: str) -> dict[str, Any]:
    """A reference to the schema ``name``."""
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **optional},
    }


def array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
NUM = {"type": "number"}
VALUE = {
    "not": {"type": "null"},
    "description": f"any JSON value but null, nested at most {MAX_VALUE_DEPTH} deep",
}

SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": STR, "detail": STR}),
    "HookReceipt": obj(
        {
            "asset": STR,
            "delivery": nullable("string"),
            "duplicate": BOOL,
            "event_id": nullable("integer"),
        }
    ),
    "Conflict": obj(
        {"error": {"const": "version_conflict"}, "detail": STR, "current_version": INT}
    ),
    "Asset": obj(
        {
            "name": STR,
            "uri": nullable("string"),
            "active": BOOL,
            "updated_at": nullable("string"),
        }
    ),
    "Assets": obj({"assets": array(ref("Asset"))}, may_read_all=BOOL),
    "AssetDetail": obj(
        {
            "name": STR,
            "uri": nullable("string"),
            "active": BOOL,
            "updated_at": nullable("string"),
            "state": array(ref("Entry")),
            "watchers": array(ref("Watcher")),
            "writable": BOOL,
        }
    ),
    "Entry": obj(
        {
            "key": STR,
            "value": VALUE,
            "version": {"type": "integer", "minimum": 1},
            "writer": nullable("string"),
            "updated_at": nullable("string"),
        }
    ),
    "Entries": obj({"asset": STR, "entries": array(ref("Entry"))}),
    "Written": obj({"asset": STR, "key": STR, "version": {"type": "integer", "minimum": 1}}),
    "Event": obj(
        {
            "id": INT,
            "asset": STR,
            "watcher": STR,
            "payload": {},
            "dedup_key": nullable("string"),
            "created_at": STR,
        }
    ),
    "EventPage": obj(
        {"events": array(ref("Event")), "next_after": INT, "more": BOOL},
        next_before={**nullable("integer"), "description": "with order=desc: the next page"},
    ),
    "Watcher": obj(
        {
            "watcher": STR,
            "trigger_id": nullable("string"),
            "assets": array(STR),
            "state": STR,
            "daemon": nullable("string"),
            "events": INT,
            "failures": INT,
            "last_event_at": nullable("string"),
            "last_event_age_seconds": nullable("number"),
            "last_error": {
                **nullable("string"),
                "description": "without read scope: the error's type only",
            },
            "paused": BOOL,
        },
        events_in_window=nullable("integer"),
        events_per_minute=nullable("number"),
    ),
    "Watchers": obj(
        {"watchers": array(ref("Watcher")), "may_operate": BOOL},
        rate_window_seconds=INT,
        rate_source={"type": "string", "enum": ["daemon", "event_log"]},
    ),
    "Control": obj(
        {
            "watcher": STR,
            "paused": BOOL,
            "retry_seq": INT,
            "updated_by": nullable("string"),
            "known": BOOL,
        }
    ),
    "Daemon": obj(
        {
            "owner": STR,
            "state": {"type": "string", "enum": ["running", "stale"]},
            "heartbeat_age_seconds": NUM,
            "heartbeat_at": nullable("string"),
            "lease_ttl_seconds": NUM,
            "started_at": nullable("string"),
            "watchers_path": nullable("string"),
            "refused": array(obj({"file": STR, "watcher": nullable("string"), "reason": STR})),
            "leases": INT,
        }
    ),
    "Daemons": obj({"daemons": array(ref("Daemon"))}),
    "Task": obj(
        {
            "name": STR,
            "assets": array(STR),
            "mode": {"type": "string", "enum": ["all", "any"]},
            "max_events": nullable("integer"),
            "max_tries": INT,
            "paused": BOOL,
            "removed": {**BOOL, "description": "the definitions no longer declare the task"},
            "removed_at": nullable("string"),
            "pending": {"type": "object", "additionalProperties": INT},
            "cursors": {"type": "object", "additionalProperties": INT},
        }
    ),
    "Tasks": obj({"tasks": array(ref("Task")), "may_operate": BOOL}),
    "TaskRetry": obj(
        {"task": STR, "retried": {**array(INT), "description": "run ids, oldest first"}}
    ),
    "Run": obj(
        {
            "id": INT,
            "task": STR,
            "state": {"type": "string", "enum": ["queued", "running", "success", "failed"]},
            "try_number": INT,
            "max_tries": INT,
            "event_count": INT,
            "created_at": nullable("string"),
            "errors": array(
                obj(
                    {
                        "try": INT,
                        "error": nullable("string"),
                        "traceback": nullable("string"),
                        "at": nullable("string"),
                    },
                    cause={"type": "string", "enum": ["task_error", "timeout", "worker_lost"]},
                )
            ),
        },
        failures=INT,
        lost_tries=INT,
        event_ids=array(INT),
        data_withheld={**BOOL, "description": "errors' text and events withheld (no read)"},
        events={**array(ref("Event")), "description": "for tokens with read scope"},
    ),
    "Runs": obj(
        {"runs": array(ref("Run"))},
        next_before={**nullable("integer"), "description": "pass as before: the next page"},
        more=BOOL,
    ),
}

# The page's pictures: a watcher's last hour, and the asset graph.
SCHEMAS["WatcherHistory"] = obj(
    {
        "watcher": STR,
        "state": nullable("string"),
        "assets": array(STR),
        "interval_seconds": NUM,
        "window_seconds": NUM,
        "points": array(
            obj(
                {
                    "at": STR,
                    "events_per_minute": nullable("number"),
                    "last_event_age_seconds": nullable("number"),
                }
            )
        ),
        "changes": array(obj({"at": STR, "state": STR, "detail": nullable("string")})),
    }
)
SCHEMAS["Graph"] = obj(
    {
        "nodes": array(
            obj(
                {
                    "id": STR,
                    "kind": {"type": "string", "enum": ["asset", "watcher", "task"]},
                    "name": STR,
                    "state": STR,
                    "backlog": nullable("integer"),
                }
            )
        ),
        "edges": array(
            obj(
                {
                    "from": STR,
                    "to": STR,
                    "kind": {"type": "string", "enum": ["feeds", "schedules", "emits"]},
                }
            )
        ),
    }
)
