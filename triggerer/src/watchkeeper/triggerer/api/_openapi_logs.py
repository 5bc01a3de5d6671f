"""The OpenAPI description of ``GET /api/v1/runs/{run_id}/logs`` (see :mod:`._logs`): its
parameters, its two answers (a JSON page, or with ``follow=true`` an event stream) and the
page's schema."""

from __future__ import annotations

from typing import Any

from watchkeeper.store import MAX_BIGINT

from ._base import MAX_PAGE
from ._logs import LOG_BATCH
from ._schemas import BOOL, INT, STR, array, obj, ref

__all__ = ["LOG_SCHEMAS", "log_paths"]

_RUN_STATE = {"type": "string", "enum": ["queued", "running", "success", "failed"]}
_POSITION = {"type": "integer", "minimum": 0, "maximum": MAX_BIGINT}

LOG_SCHEMAS: dict[str, Any] = {
    "LogChunk": obj(
        {
            "run_id": INT,
            "try_number": INT,
            "seq": INT,
            "stream": {"type": "string", "enum": ["stdout", "stderr", "log"]},
            "text": STR,
            "created_at": STR,
        }
    ),
    "LogPage": obj(
        {
            "run_id": INT,
            "state": _RUN_STATE,
            "try_number": INT,
            "chunks": array(ref("LogChunk")),
            "next_after": {**INT, "description": "pass as after: the next page"},
            "more": {**BOOL, "description": "more chunks are kept after this page"},
        }
    ),
}


_FRAME = {
    "type": "object",
    "description": "one event of the stream: a 'log' frame holds a LogChunk as JSON, its seq "
    "the id; the 'end' frame the run's id, state and try_number",
    "required": ["data"],
    "properties": {
        "event": {"type": "string", "enum": ["log", "end"]},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
}


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": ref("Error")}},
        **extra,
    }


def log_paths(common: dict[str, Any]) -> dict[str, Any]:
    """The route's path item; ``common`` are the answers every route may give (401, 403...)."""
    return {
        "/api/v1/runs/{run_id}/logs": {
            "get": {
                "summary": (
                    "what a run's tries printed and logged (needs read): a page of chunks, or "
                    "with follow=true Server-Sent Events until the run is over"
                ),
                "responses": {
                    "200": {
                        "description": (
                            "a page of chunks in seq order; with follow=true, a stream of "
                            "'log' frames (each chunk's seq its id) and a last 'end' frame"
                        ),
                        "content": {
                            "application/json": {"schema": ref("LogPage")},
                            "text/event-stream": {"schema": _FRAME},
                        },
                    },
                    "400": _error("a malformed parameter or header (the detail names it)"),
                    "404": _error("no such run"),
                    "429": _error(
                        "following: the token holds [api] max_streams_per_token open streams",
                        headers={"Retry-After": {"schema": {"type": "string"}}},
                    ),
                    **common,
                },
                "parameters": [
                    {
                        "name": "run_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_BIGINT},
                    },
                    {
                        "name": "try",
                        "in": "query",
                        "description": "only this try's chunks (absent: every try's)",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_BIGINT},
                    },
                    {
                        "name": "after",
                        "in": "query",
                        "description": "the seq of the last chunk seen (absent: 0)",
                        "schema": _POSITION,
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "description": f"at most this many chunks (absent: {LOG_BATCH})",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                    },
                    {
                        "name": "follow",
                        "in": "query",
                        "description": "true: stream the chunks until the run (or the try) "
                        "is over; false (absent): one page",
                        "schema": {"type": "string", "enum": ["true", "false"]},
                    },
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "description": "resume after this seq (wins over after)",
                        "schema": {"type": "string", "pattern": "^[ \\t]*[0-9]{1,19}[ \\t]*$"},
                    },
                ],
            }
        }
    }
