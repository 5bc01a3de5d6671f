"""How a run's tries are recorded: their causes, their errors (as the JSON the SQL backends
keep), and the guard against a run lost to the infrastructure forever."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "LAPSED",
    "MAX_LOST_TRIES",
    "TRY_CAUSES",
    "RunError",
    "TryCause",
    "errors_from_json",
    "errors_to_json",
    "ids_from_json",
    "ids_to_json",
    "lapsed_error",
]

TryCause = Literal["task_error", "timeout", "worker_lost"]
TRY_CAUSES: tuple[TryCause, ...] = ("task_error", "timeout", "worker_lost")
"""Why a try failed: the task raised (``task_error``), ran past its ``execution_timeout``
(``timeout``), or its worker stopped renewing the lease (``worker_lost``: killed, frozen,
cut off from the database). Only the first two count against the task's ``retries``."""

MAX_LOST_TRIES = 10
"""How many tries of one run may be lost to the infrastructure (``worker_lost``) before the
run fails for good: a guard against a task that kills its own worker, retried forever."""


@dataclass(frozen=True, slots=True)
class RunError:
    """Why one try of a run failed: the error, its traceback (if any), when, and its cause
    (one of :data:`TRY_CAUSES`)."""

    try_number: int
    error: str
    traceback: str | None
    at: datetime
    cause: TryCause = "task_error"


LAPSED = "the lease of worker '{owner}' lapsed: the try did not finish"


def lapsed_error(owner: str | None, try_number: int, now: datetime) -> RunError:
    """The error recorded for a try whose worker stopped renewing its lease (killed, frozen)."""
    return RunError(try_number, LAPSED.format(owner=owner), None, now, "worker_lost")


def errors_to_json(errors: Iterable[RunError]) -> str:
    return json.dumps(
        [
            {
                "try": e.try_number,
                "error": e.error,
                "traceback": e.traceback,
                "at": e.at.isoformat(),
                "cause": e.cause,
            }
            for e in errors
        ]
    )


def errors_from_json(text: str | None) -> tuple[RunError, ...]:
    if not text or text == "[]":  # most runs: no JSON to parse
        return ()
    items: list[dict[str, Any]] = json.loads(text)
    return tuple(
        RunError(i["try"], i["error"], i["traceback"], datetime.fromisoformat(i["at"]), _cause(i))
        for i in items
    )


_LAPSED_PREFIX = LAPSED.split("'", 1)[0]


def _cause(item: Mapping[str, Any]) -> TryCause:
    """A recorded try's cause (one recorded before causes were kept: a lapsed lease's text
    says ``worker_lost``, anything else ``task_error``)."""
    cause = item.get("cause")
    if cause in TRY_CAUSES:
        return cause  # type: ignore[no-any-return]
    return "worker_lost" if str(item.get("error", "")).startswith(_LAPSED_PREFIX) else "task_error"


def ids_to_json(ids: Iterable[int]) -> str:
    return json.dumps(list(ids))


def ids_from_json(text: str | None) -> tuple[int, ...]:
    return tuple(json.loads(text)) if text and text != "[]" else ()
