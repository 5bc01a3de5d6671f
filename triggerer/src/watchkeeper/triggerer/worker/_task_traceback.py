"""A failed task's traceback as its run records it: the task's own frames, not the runtime's.

A task's exception travels up through the worker (its try, the call in a thread or on the
loop through a greenback portal) before it is caught, so Python's traceback of it starts with
several frames of watchkeeper, anyio and the standard library's thread and event-loop code:
noise to the person reading ``watchkeeper runs show``. :func:`format_task_traceback` drops
those leading frames, from the exception and from each exception chained to it; frames below
the task's first one are kept, whatever module they are in (a task calling into the store
shows that call). When every frame is the runtime's (a timeout cancelling the call), the
traceback is kept whole.
"""

from __future__ import annotations

import importlib.util
import threading
import traceback
from pathlib import Path

__all__ = ["format_task_traceback"]

_RUNTIME_PACKAGES = (
    "watchkeeper.triggerer",
    "watchkeeper.store",
    "anyio",
    "greenback",
    "outcome",  # greenback's way of resuming the task's coroutine
    "asyncio",
    "concurrent.futures",
)
"""What calls a task: the frames of these packages before the task's first are dropped."""


def _package_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _RUNTIME_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            dirs.append(str(Path(spec.origin).resolve().parent) + "/")
    return tuple(dirs)


_RUNTIME_DIRS = _package_dirs()
_RUNTIME_FILES: frozenset[str] = frozenset({str(Path(threading.__file__).resolve())})


def _is_runtime(filename: str) -> bool:
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):  # "<string>" and the like: not the runtime's
        return False
    return resolved in _RUNTIME_FILES or resolved.startswith(_RUNTIME_DIRS)


def _trim(summary: traceback.TracebackException, seen: set[int]) -> None:
    if id(summary) in seen:  # a chain that loops back on itself
        return
    seen.add(id(summary))
    frames = list(summary.stack)
    first = next((i for i, frame in enumerate(frames) if not _is_runtime(frame.filename)), None)
    if first:  # None: all the runtime's, keep them; 0: nothing to drop
        summary.stack = traceback.StackSummary.from_list(frames[first:])
    for chained in (summary.__cause__, summary.__context__):
        if chained is not None:
            _trim(chained, seen)
    for inner in summary.exceptions or ():
        _trim(inner, seen)


def format_task_traceback(exc: BaseException) -> str:
    """The text of ``exc``'s traceback (with its chained exceptions) as ``traceback`` prints
    it, without the leading frames of the runtime that called the task.

    Parameters:
        exc: the exception the task raised, as the worker caught it.
    """
    summary = traceback.TracebackException.from_exception(exc)
    _trim(summary, set())
    return "".join(summary.format())
