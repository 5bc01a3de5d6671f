"""Retrying every failed run of a task: one rule for ``watchkeeper runs retry --task`` and
``POST /api/v1/tasks/{name}/retry``, so the two act the same way."""

from __future__ import annotations

from watchkeeper.store import RunStateError, TaskNotFoundError
from watchkeeper.store.protocols import TaskQueue

__all__ = ["retry_failed_runs"]

_PAGE = 500


async def retry_failed_runs(queue: TaskQueue, task: str) -> list[int]:
    """Queue every failed run of ``task`` for one more try, oldest first; the ids retried.

    The failed runs are listed first (a retried run leaves the listing, so paging while
    retrying would skip some), then each is retried on its own. A run that stopped being
    failed meanwhile (another operator retried it) is left as it is.

    :raises TaskNotFoundError: no task of that name is registered.
    """
    if task not in {info.name for info in await queue.alist_tasks()}:
        raise TaskNotFoundError(f"task {task!r}")
    failed: list[int] = []
    before = None
    while page := await queue.alist_runs(task=task, state="failed", limit=_PAGE, before=before):
        failed += [run.id for run in page]
        before = page[-1].id
    retried = []
    for run_id in sorted(failed):
        try:
            await queue.aretry_run(run_id)
        except RunStateError:
            continue
        retried.append(run_id)
    return retried
