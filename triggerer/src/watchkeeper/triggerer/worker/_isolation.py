"""Tries in child processes: ``asset_task(isolation="process")``.

A :class:`ProcessPool` keeps up to ``[worker] concurrency`` child processes (started with
``forkserver``), each running one try at a time. A child opens the store from the worker's
settings once, imports the task's module (or the definition files) once, and then serves tries
sent over a pipe: it builds the try's context as the worker does, calls the task, and answers
with the outlet events' payloads or the error and its traceback.

What the worker's own process no longer shares with the task: a segfault, ``os._exit``, a
C extension holding the GIL, or a leak ends or bloats the child only. The worker records such a
try as failed with the child's exit status or signal; past ``execution_timeout`` it kills the
child (a sync try no longer keeps running in an abandoned thread); ``[worker]
process_memory_limit_mb`` caps a child's address space (``RLIMIT_AS``), where the platform
has it. A child that died, was killed or ran out of memory is replaced by a new one for the
next try.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.connection
import signal
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from watchkeeper.store.protocols import OutletEvent, TaskRun, get_logger

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from ..settings import Settings, WorkerSettings
    from ._asset_task import AssetTask

__all__ = [
    "ChildFailure",
    "ChildResult",
    "IsolationUnavailableError",
    "ProcessPool",
    "process_pool_for",
]

log = get_logger(__name__)

_STOP_GRACE = 2.0
"""Seconds a child gets to exit after its pipe closes, before it is killed."""


class IsolationUnavailableError(RuntimeError):
    """A task asks for ``isolation="process"`` and the worker cannot give it (no settings for
    the children to open the store with, or an in-memory store they cannot share)."""


class TaskProcessError(RuntimeError):
    """What a try in a child process raised (or how the child ended), as the worker's own
    exception for the task's callbacks: ``type_name`` is the child's exception type."""

    def __init__(self, message: str, type_name: str) -> None:
        super().__init__(message)
        self.type_name = type_name


@dataclass(frozen=True, slots=True)
class ChildResult:
    """A try that returned in its child: the outlet events it set."""

    outlets: tuple[OutletEvent, ...]


@dataclass(frozen=True, slots=True)
class ChildFailure:
    """A try that failed in its child (``cause`` ``task_error``), or whose child died or was
    killed past ``execution_timeout`` (``cause`` ``timeout``)."""

    error: BaseException
    traceback: str | None
    cause: str = "task_error"


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a child needs to open the store and find the tasks (sent once, at its start)."""

    settings: Settings
    memory_limit_mb: int | None


@dataclass(frozen=True, slots=True)
class _Request:
    task: str
    module: str
    run: TaskRun


class _Child:
    def __init__(self, process: BaseProcess, conn: multiprocessing.connection.Connection) -> None:
        self.process = process
        self.conn = conn

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def close(self) -> None:
        self.conn.close()
        self.process.join(_STOP_GRACE)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class ProcessPool:
    """Up to ``size`` child processes, each running one try at a time.

    :param size: the most children at once (the worker's ``concurrency``).
    :param settings: the worker's whole configuration: each child opens the store from it and
        finds tasks it cannot import under ``[triggerer] watchers_path``.
    """

    def __init__(self, size: int, settings: Settings) -> None:
        self.size = size
        self.settings = settings
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._context = multiprocessing.get_context("forkserver")
        self._limit = anyio.Semaphore(size)
        self._closed = False

    async def run(
        self, task: AssetTask, run: TaskRun, time_limit: float | None
    ) -> ChildResult | ChildFailure:
        """One try of ``run`` in a child: its result, or how it failed."""
        async with self._limit:
            child = self._idle.pop() if self._idle else await self._start()
            self._busy.add(child)
            keep = False
            try:
                answer = await self._ask(child, task, run, time_limit)
                keep = isinstance(answer, ChildResult) or (
                    isinstance(answer, ChildFailure)
                    and answer.cause == "task_error"
                    and child.process.is_alive()
                    and not isinstance(answer.error, MemoryError)
                    and getattr(answer.error, "type_name", "") != "MemoryError"
                )
                return answer
            finally:
                self._busy.discard(child)
                if keep and not self._closed:
                    self._idle.append(child)
                else:
                    child.kill()
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(child.close)

    async def _ask(
        self, child: _Child, task: AssetTask, run: TaskRun, time_limit: float | None
    ) -> ChildResult | ChildFailure:
        request = _Request(task.name, task.fn.__module__, run)
        await anyio.to_thread.run_sync(child.conn.send, request)
        answer: Any = None
        with anyio.move_on_after(time_limit if time_limit is not None else float("inf")) as late:
            try:
                answer = await anyio.to_thread.run_sync(child.conn.recv, abandon_on_cancel=True)
            except (EOFError, OSError):
                await anyio.to_thread.run_sync(child.process.join, _STOP_GRACE)
                return ChildFailure(_died(child.process), None)
            except BaseException:
                child.kill()  # cancelled (the worker stops, or a lost lease): end the try
                raise
        if late.cancelled_caught:
            child.kill()
            assert time_limit is not None
            error = TimeoutError(
                f"the try ran past its execution_timeout of {time_limit:g} s; "
                "its process was killed"
            )
            return ChildFailure(error, None, cause="timeout")
        kind, *rest = answer
        if kind == "ok":
            return ChildResult(tuple(OutletEvent(a, p) for a, p in rest[0]))
        message, type_name, traceback_text = rest
        return ChildFailure(TaskProcessError(message, type_name), traceback_text)

    async def _start(self) -> _Child:
        parent, child_end = self._context.Pipe()
        spec = _Spec(self.settings, self.settings.worker.process_memory_limit_mb)
        process = self._context.Process(
            target=_child_main, args=(child_end, spec), name="watchkeeper-task", daemon=True
        )
        await anyio.to_thread.run_sync(process.start)
        child_end.close()
        return _Child(process, parent)

    async def aclose(self) -> None:
        """End every child (idle ones at once; a busy one's try is abandoned)."""
        self._closed = True
        children = [*self._idle, *self._busy]
        self._idle.clear()
        for child in children:
            if child in self._busy:
                child.kill()
        with anyio.CancelScope(shield=True):
            for child in children:
                await anyio.to_thread.run_sync(child.close)


def _died(process: BaseProcess) -> TaskProcessError:
    code = process.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return TaskProcessError(f"the task's process was killed by {name}", name)
    return TaskProcessError(f"the task's process exited with status {code}", "SystemExit")


def process_pool_for(
    isolated: set[str], settings: WorkerSettings, process_settings: Settings | None
) -> ProcessPool | None:
    """The pool of child processes the ``isolated`` tasks run in (None when there are none)."""
    if not isolated:
        return None
    names = ", ".join(sorted(isolated))
    if process_settings is None:
        raise IsolationUnavailableError(
            f"task(s) {names} run in child processes (isolation='process'), which open the "
            "store from the worker's settings: pass Worker(..., process_settings=settings)"
        )
    url = process_settings.database_url()
    if process_settings.state_store.backend is None and url.split("://", 1)[-1] in (
        "",
        "/",
        "/:memory:",
    ):
        raise IsolationUnavailableError(
            f"task(s) {names} run in child processes (isolation='process'), which cannot "
            "share an in-memory store: configure a SQLite file or PostgreSQL"
        )
    return ProcessPool(settings.concurrency, process_settings)


# -- the child's side ----------------------------------------------------------------------------


def _child_main(conn: multiprocessing.connection.Connection, spec: _Spec) -> None:
    """A child's main: cap its memory, configure logging, then serve tries until the pipe
    closes."""
    if spec.memory_limit_mb is not None:
        import resource

        limit = spec.memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from .._core import configure_logging

    logging_settings = spec.settings.logging
    configure_logging(logging_settings.level, logging_settings.format)
    anyio.run(_serve, conn, spec)


async def _serve(conn: multiprocessing.connection.Connection, spec: _Spec) -> None:
    from watchkeeper.store import open_state_backend

    tasks: dict[str, AssetTask] = {}
    async with open_state_backend(spec.settings) as backend:
        while True:
            try:
                request: _Request = await anyio.to_thread.run_sync(conn.recv)
            except (EOFError, OSError):
                return  # the worker closed the pipe: stop
            task = tasks.get(request.task)
            if task is None:
                try:
                    task = await anyio.to_thread.run_sync(
                        _find_task, request, Path(spec.settings.triggerer.watchers_path)
                    )
                except Exception as exc:  # noqa: BLE001 - answered as the try's failure
                    await anyio.to_thread.run_sync(conn.send, _error(exc, None))
                    continue
                tasks[request.task] = task
            answer = await _one_try(backend, task, request.run)
            await anyio.to_thread.run_sync(conn.send, answer)


def _error(exc: BaseException, traceback_text: str | None) -> tuple[Any, ...]:
    from .._core import describe_error

    return ("error", describe_error(exc), type(exc).__name__, traceback_text)


async def _one_try(backend: Any, task: AssetTask, run: TaskRun) -> tuple[Any, ...]:
    import greenback
    from watchkeeper.store.protocols import encode_payload

    from ._context import run_context
    from ._task_traceback import format_task_traceback

    context = run_context(backend, task, run)
    try:
        if task.is_async:
            await greenback.with_portal_run(task.fn, **context)
        else:
            await anyio.to_thread.run_sync(partial(task.fn, **context))
        outlets = [
            (
                a.name,
                encode_payload(
                    context["outlet_events"][a].extra,
                    max_payload_bytes=backend.max_payload_bytes,
                ),
            )
            for a in task.outlets
        ]
    except BaseException as exc:
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            raise
        return _error(exc, format_task_traceback(exc))
    return ("ok", outlets)


def _find_task(request: _Request, watchers_path: Path) -> AssetTask:
    """The task the worker named: from its module when that imports, else from the
    definition files (a file's module exists only where the files were imported)."""
    from ._asset_task import AssetTask
    from ._task_loader import load_tasks

    try:
        module = importlib.import_module(request.module)
    except ImportError:
        module = None
    if module is not None:
        for value in vars(module).values():
            if isinstance(value, AssetTask) and value.name == request.task:
                return value
    tasks, _ = load_tasks(watchers_path)
    for task in tasks:
        if task.name == request.task:
            return task
    raise LookupError(f"task {request.task!r} is not defined in {request.module}")
