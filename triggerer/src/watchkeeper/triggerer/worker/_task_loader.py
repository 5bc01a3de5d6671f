"""Loading the ``asset_task`` tasks of the definition files, in the worker's own process.

The daemon reads the files for their watchers in a child process and gets plain data back
(:mod:`..daemon._loader`); a task is a function the worker must call, so ``watchkeeper worker`` imports
the files itself, with the same package set-up (``watchkeeper_watchers.<module>``), and keeps
the module-level :class:`~._asset_task.AssetTask` objects. A file that does not import is
reported and skipped; a task name defined by two files is kept in the first (path order).
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Sequence
from pathlib import Path

from watchkeeper.store.protocols import get_logger

from ..daemon import WatcherError, import_definition_files
from ._asset_task import AssetTask

__all__ = ["load_tasks", "merge_tasks", "module_tasks"]

log = get_logger(__name__)


def module_tasks(module: types.ModuleType) -> tuple[AssetTask, ...]:
    """The :class:`AssetTask` objects ``module`` defines at its top level (each once, even
    when bound to two names)."""
    seen: dict[int, AssetTask] = {}
    for value in vars(module).values():
        if isinstance(value, AssetTask):
            seen.setdefault(id(value), value)
    return tuple(seen.values())


def merge_tasks(
    by_file: Iterable[tuple[str, Sequence[AssetTask]]],
) -> tuple[dict[str, AssetTask], list[WatcherError]]:
    """The tasks of several files (given in path order) by name, and the refusals of a name
    defined again after its first definition."""
    tasks: dict[str, AssetTask] = {}
    where: dict[str, str] = {}
    errors: list[WatcherError] = []
    for rel, found in by_file:
        for task in found:
            if task.name in tasks:
                reason = f"task {task.name!r} is already defined in {where[task.name]}"
                errors.append(WatcherError(rel, None, reason))
                continue
            tasks[task.name], where[task.name] = task, rel
    return tasks, errors


def load_tasks(path: Path | str) -> tuple[tuple[AssetTask, ...], tuple[WatcherError, ...]]:
    """Import every definition file under ``path``; its tasks (by name) and the refusals.

    Blocking (it imports modules and runs their code).

    :param path: the definitions directory (``[triggerer] watchers_path``).
    :returns: the tasks, sorted by name, and the refusals (a file that did not import, a task
        name defined twice), each also logged as ``task_refused``.
    :raises NotADirectoryError: ``path`` is not a directory.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"watchers path {str(root)!r} is not a directory")
    found = import_definition_files(root)
    errors = [error for _, module, error in found if module is None and error is not None]
    tasks, twice = merge_tasks(
        (rel, module_tasks(module)) for rel, module, _ in found if module is not None
    )
    errors += twice
    for error in errors:
        log.warning("task_refused", file=error.file, reason=error.reason)
    return tuple(tasks[name] for name in sorted(tasks)), tuple(errors)
