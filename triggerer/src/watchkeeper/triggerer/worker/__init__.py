"""The task worker (``watchkeeper worker``): :class:`Worker` driving the task queue,
:func:`asset_task` and ``AnyOf`` (how a definition file declares a task), the loader that
imports the tasks of the definition files and follows them (:class:`TaskFiles`), the outlet accessor a running task receives, and a
failed task's traceback. (``run_task`` and the task's context stay in the store: a task that
only reads state needs nothing but ``watchkeeper-store``.)

It may import the store, the authoring API, :mod:`.._core` and the daemon's public names (node
identity, the definition files); never the runtime, the CLI or the API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core import lazy_exports

if TYPE_CHECKING:
    from ._asset_task import (
        AnyOf,
        AssetTask,
        OutletEventAccessor,
        OutletEvents,
        RunCallback,
        asset_task,
    )
    from ._isolation import IsolationUnavailableError
    from ._run import configure_connections, run_worker
    from ._task_files import TaskFiles, TaskLoad
    from ._task_loader import load_tasks
    from ._worker import Worker

__all__ = [
    "AnyOf",
    "AssetTask",
    "IsolationUnavailableError",
    "OutletEventAccessor",
    "OutletEvents",
    "RunCallback",
    "TaskFiles",
    "TaskLoad",
    "Worker",
    "asset_task",
    "configure_connections",
    "load_tasks",
    "run_worker",
]

_EXPORTS: dict[str, tuple[str, ...]] = {
    "._asset_task": (
        "AnyOf",
        "AssetTask",
        "OutletEventAccessor",
        "OutletEvents",
        "RunCallback",
        "asset_task",
    ),
    "._isolation": ("IsolationUnavailableError",),
    "._task_files": ("TaskFiles", "TaskLoad"),
    "._task_loader": ("load_tasks",),
    "._run": ("configure_connections", "run_worker"),
    "._worker": ("Worker",),
}

if not TYPE_CHECKING:  # type checkers read the imports above
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
