"""Events, tasks and runs as JSON data: the one shape the HTTP API serves and ``--json`` prints.

``GET /api/v1/events`` and ``watchkeeper events --json`` give the same object per event,
``GET /api/v1/tasks`` and ``watchkeeper tasks list --json`` the same object per task,
``GET /api/v1/runs/{id}`` and ``watchkeeper runs show --json`` the same object per run,
and ``watchkeeper runs logs --json`` one object per chunk of a run's logs (:func:`log_record`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from watchkeeper.store import AssetEvent, LogChunk
    from watchkeeper.store.protocols import TaskInfo, TaskRun

__all__ = ["event_record", "iso", "log_record", "run_record", "task_record"]


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def event_record(event: AssetEvent) -> dict[str, Any]:
    """An event with every URL password in it masked (see ``redact_data``)."""
    from watchkeeper.store.protocols import redact_data  # not at import: the CLI starts faster

    return cast("dict[str, Any]", redact_data(event.to_record()))


def task_record(info: TaskInfo) -> dict[str, Any]:
    spec = info.spec
    return {
        "name": spec.name,
        "assets": list(spec.assets),
        "mode": spec.mode,
        "max_events": spec.max_events,
        "max_tries": spec.max_tries,
        "paused": info.paused,
        "removed": info.removed,
        "removed_at": iso(info.removed_at),
        "pending": {asset: info.pending.get(asset, 0) for asset in spec.assets},
        "cursors": {asset: info.cursors.get(asset, 0) for asset in spec.assets},
    }


def run_record(run: TaskRun, *, events: bool = False) -> dict[str, Any]:
    """A run; with ``events``, the events it was created with (their payloads are asset data:
    the API adds them only for tokens that may read every asset)."""
    duration = None
    if run.started_at is not None and run.finished_at is not None:
        duration = (run.finished_at - run.started_at).total_seconds()
    record: dict[str, Any] = {
        "id": run.id,
        "task": run.task,
        "state": run.state,
        "try_number": run.try_number,
        "max_tries": run.max_tries,
        "failures": run.failures,
        "lost_tries": run.lost_tries,
        "event_count": run.event_count,
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "duration_seconds": duration,
        "not_before": iso(run.not_before),
        "lease_owner": run.lease_owner,
        "lease_expires_at": iso(run.lease_expires_at),
        "errors": [
            {
                "try": e.try_number,
                "cause": e.cause,
                "error": e.error,
                "traceback": e.traceback,
                "at": iso(e.at),
            }
            for e in run.errors
        ],
        "outlet_event_ids": list(run.outlet_event_ids),
        "event_ids": list(run.event_ids or (e.id for e in run.events)),
    }
    if events:
        record["events"] = [event_record(e) for e in run.events]
    return record


def log_record(chunk: LogChunk) -> dict[str, Any]:
    """A chunk of a try's output (its text was redacted when it was stored)."""
    return {
        "run_id": chunk.run_id,
        "try_number": chunk.try_number,
        "seq": chunk.seq,
        "stream": chunk.stream,
        "text": chunk.text,
        "created_at": iso(chunk.created_at),
    }
