"""Following the definition files in the worker: :class:`TaskFiles`.

A task is a function the worker calls, so the worker imports the definition files in its own
process (:mod:`._task_loader`). It follows them as the daemon follows its watchers: every
``[worker] reload_interval`` it takes the path's stamps (mtime, size, checksum), and when they
changed it reads again only the files that may define something else now (changed, new or gone
files, those refused last time, and those importing a changed one, directly or not; see
:class:`~..daemon.FileReads`). Those are read first in a child process, each within
``[triggerer] import_timeout`` (:func:`~..daemon.evaluate_files`), so a file that hangs or ends
its process at import is refused without touching the worker; only the files the child read
cleanly are then imported again here, in a thread bounded by the same timeout, and every other
module of the path stays as it was.

A refused file is named (``task_refused``, its file and reason) and the tasks it defined before
stay as they were. The start imports every file here, where the imports between files are not
noted, so the first change after it reads every file in the child once; later changes read only
what changed.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread
from watchkeeper.store.protocols import get_logger

from .._core import describe_error
from ..daemon import (
    FileDefinitions,
    FileReads,
    WatcherError,
    evaluate_files,
    import_definition_files,
    scan_watchers_path,
)
from ._asset_task import AssetTask
from ._task_loader import merge_tasks, module_tasks

__all__ = ["TaskFiles", "TaskLoad"]

log = get_logger(__name__)

_Stamps = Mapping[str, tuple[int, int, int]]


@dataclass(frozen=True, slots=True)
class TaskLoad:
    """The tasks the definition files define now, by name, and the refusals in force.

    :param tasks: every task defined now, by name (sorted).
    :param errors: the files refused now and the task names defined twice; a refused file's
        tasks are in ``tasks`` as it last defined them.
    """

    tasks: dict[str, AssetTask]
    errors: tuple[WatcherError, ...]


class TaskFiles:
    """The definition files of one worker: what each file defined when it last imported, and
    the reloads that follow the files.

    :param path: the definitions directory (``[triggerer] watchers_path``).
    :param import_timeout: seconds a file may take to import (``[triggerer] import_timeout``).
    """

    def __init__(self, path: Path | str, *, import_timeout: float) -> None:
        self.path = Path(path).resolve()
        self.import_timeout = import_timeout
        self.current = TaskLoad({}, ())
        """The last load."""
        self._tasks: dict[str, tuple[AssetTask, ...]] = {}  # each file's, as last imported
        self._refused: dict[str, WatcherError] = {}  # each file refused now
        self._stamps: _Stamps = {}  # the stamps the files were last read at
        self._reads: FileReads | None = None  # None: the import edges are not known yet

    def load(self) -> TaskLoad:
        """The first load: every file imported in this process. Blocking (it runs the files).

        :raises NotADirectoryError: the path is not a directory.
        """
        if not self.path.is_dir():
            raise NotADirectoryError(f"watchers path {str(self.path)!r} is not a directory")
        self._stamps = scan_watchers_path(self.path)
        for rel, module, error in import_definition_files(self.path):
            self._settle(rel, module_tasks(module) if module is not None else error)
        return self._merge()

    async def reload(self, stamps: _Stamps) -> TaskLoad:
        """Read again what may have changed, the path's stamps being ``stamps`` now (see the
        module's docstring); the new load. A path that is not a directory now (gone for a
        moment, during a deploy) keeps every task as it was."""
        if not await anyio.Path(self.path).is_dir():
            missing = WatcherError(str(self.path), None, "watchers path is not a directory")
            log.warning("task_refused", file=missing.file, reason=missing.reason, kept=True)
            return TaskLoad(self.current.tasks, (missing,))
        reads = self._reads
        todo = list(stamps) if reads is None else [r for r in stamps if r in reads.stale(stamps)]
        edges: dict[str, set[str]] = {}
        read = await evaluate_files(
            self.path, todo, import_timeout=self.import_timeout, imports=edges
        )
        imports = {k: v for k, v in (reads.imports.items() if reads else ()) if k not in read}
        imports.update((k, frozenset(v)) for k, v in edges.items())
        definitions = {**(reads.definitions if reads else {}), **read}
        if reads is None:  # what the start imported, against the files now
            errors = {rel: FileDefinitions(rel, error=e) for rel, e in self._refused.items()}
            started = {rel: errors.get(rel, FileDefinitions(rel)) for rel in self._stamps}
            stale = FileReads(self._stamps, started, imports, None).stale(stamps)
        else:
            stale = set(todo)
        again = [rel for rel in stamps if rel in stale and read[rel].error is None]
        gone = [rel for rel in (*self._tasks, *self._refused) if rel not in stamps]
        for rel in stale:
            error = read[rel].error
            if error is not None:  # refused: what it defined before stays
                self._refused[rel] = error
                log.warning("task_refused", file=rel, reason=error.reason, kept=True)
        imported: list[tuple[str, types.ModuleType | None, WatcherError | None]] | None = []
        if again or gone:
            imported = None  # until the import answers within its time
            with anyio.move_on_after(self.import_timeout * max(1, len(again))):
                imported = await anyio.to_thread.run_sync(
                    partial(import_definition_files, self.path, again, forget=gone),
                    abandon_on_cancel=True,
                )
        for rel in gone:
            self._tasks.pop(rel, None)
            self._refused.pop(rel, None)
        if imported is None:  # timed out here although the child read them in time
            late = f"import timed out after {self.import_timeout:g} s in the worker"
            imported = [(rel, None, WatcherError(rel, None, late)) for rel in again]
        for rel, module, error in imported:
            self._settle(rel, module_tasks(module) if module is not None else error)
            if error is not None:  # read again next time, as a refusal by the child would be
                definitions[rel] = FileDefinitions(rel, error=error)
        self._stamps = stamps
        self._reads = FileReads(
            stamps,
            {rel: d for rel, d in definitions.items() if rel in stamps},
            {rel: v for rel, v in imports.items() if rel in stamps},
            None,
        )
        return self._merge()

    def _settle(self, rel: str, outcome: tuple[AssetTask, ...] | WatcherError | None) -> None:
        """Record what importing ``rel`` gave: its tasks, or its refusal (logged; the tasks
        it defined before stay)."""
        if isinstance(outcome, tuple):
            self._tasks[rel] = outcome
            self._refused.pop(rel, None)
        elif outcome is not None:
            self._refused[rel] = outcome
            log.warning("task_refused", file=rel, reason=outcome.reason)

    def _merge(self) -> TaskLoad:
        order = [rel for rel in self._stamps if rel in self._tasks]
        tasks, twice = merge_tasks((rel, self._tasks[rel]) for rel in order)
        for error in twice:
            log.warning("task_refused", file=error.file, reason=error.reason)
        refused = [self._refused[rel] for rel in self._stamps if rel in self._refused]
        self.current = TaskLoad(dict(sorted(tasks.items())), (*refused, *twice))
        return self.current

    async def follow(self, interval: float, apply: Callable[[TaskLoad], Awaitable[None]]) -> None:
        """Every ``interval`` seconds: scan the path (in a thread), and when it changed,
        reload and hand the load to ``apply``. A failed reload or apply is logged and tried
        again at the next look."""
        snapshot = self._stamps
        while True:
            await anyio.sleep(interval)
            try:
                current = await anyio.to_thread.run_sync(scan_watchers_path, self.path)
                if current == snapshot:
                    continue
                await apply(await self.reload(current))
            except Exception as exc:  # noqa: BLE001 - the next look tries again
                log.error("tasks_reload_failed", error=describe_error(exc))
                continue
            snapshot = current
