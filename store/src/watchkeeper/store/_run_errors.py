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
    "bucketed",
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

MAX_LOST_TRIES = 25
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
    final: bool = False
    """Whether this failure failed the run (no tries left of its kind)."""


LAPSED = "the lease of worker '{owner}' lapsed: the try did not finish"


def lapsed_error(
    owner: str | None, try_number: int, now: datetime, *, final: bool = False
) -> RunError:
    """The error recorded for a try whose worker stopped renewing its lease (killed, frozen)."""
    return RunError(try_number, LAPSED.format(owner=owner), None, now, "worker_lost", final)


def errors_to_json(errors: Iterable[RunError]) -> str:
    out = []
    for e in errors:
        item: dict[str, Any] = {
            "try": e.try_number,
            "error": e.error,
            "traceback": e.traceback,
            "at": e.at.isoformat(),
            "cause": e.cause,
        }
        if e.final:
            item["final"] = True
        out.append(item)
    return json.dumps(out)


def errors_from_json(text: str | None) -> tuple[RunError, ...]:
    if not text or text == "[]":  # most runs: no JSON to parse
        return ()
    items: list[dict[str, Any]] = json.loads(text)
    return tuple(
        RunError(
            i["try"],
            i["error"],
            i["traceback"],
            datetime.fromisoformat(i["at"]),
            _cause(i),
            bool(i.get("final")),
        )
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


def bucketed(rows: Iterable[Any], edges: int) -> dict[str, tuple[list[int], float]]:
    """``(task, bucket, count, seconds)`` rows as ``{task: (counts, total seconds)}`` with
    ``edges + 1`` buckets (what the SQL backends' run durations read)."""
    found: dict[str, tuple[list[int], float]] = {}
    for task, index, count, seconds in rows:
        counts, total = found.get(task) or ([0] * (edges + 1), 0.0)
        counts[index] += count
        found[task] = (counts, total + float(seconds or 0.0))
    return found
