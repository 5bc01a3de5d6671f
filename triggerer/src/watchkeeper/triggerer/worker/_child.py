"""The child's side of ``isolation="process"``: ``python -m watchkeeper.triggerer.worker._child``.

The worker writes framed messages (a 4-byte length, then a pickle) to the child's stdin and
reads its answers from the child's stdout; the child moves both pipes aside at start, so what a
task prints never goes into the answers: the child keeps each try's output with its run, as
the worker does (:mod:`._try_logs`), and anything printed outside a try goes to stderr (the
worker's log). The first message is
the worker's settings; each later one is a try: the child builds the try's context as the
worker does, calls the task and answers ``("ok", outlets)`` or ``("error", message, type name,
traceback)``. A thread reads the requests as they come: when the worker closes the pipe, or
dies, it kills the child at once, even in the middle of a try.
"""

from __future__ import annotations

import importlib
import os
import pickle
import queue
import signal
import struct
import threading
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from watchkeeper.store import BaseStateBackend
    from watchkeeper.store.protocols import TaskRun

    from ._asset_task import AssetTask

__all__ = ["main", "read_message", "write_message"]

HEADER = struct.Struct(">I")


def write_message(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    """The next message, or raise ``EOFError`` at the end of the stream."""
    header = _read_exactly(stream, HEADER.size)
    return pickle.loads(_read_exactly(stream, HEADER.unpack(header)[0]))


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # a task's print() goes to the worker's log, not into the answers
    try:
        spec = read_message(requests)
    except EOFError:
        return
    if spec.memory_limit_mb is not None:
        import resource

        limit = spec.memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from .._core import configure_logging

    configure_logging(spec.settings.logging.level, spec.settings.logging.format)
    incoming: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(
        target=_read_requests, args=(requests, incoming), name="watchkeeper-requests", daemon=True
    ).start()
    import anyio

    anyio.run(_serve, incoming, answers, spec)


def _read_requests(requests: IO[bytes], incoming: queue.SimpleQueue[Any]) -> None:
    """Hand each request over; at the end of the pipe (the worker closed it, or died) kill
    this process, so no try outlives its worker."""
    try:
        while True:
            incoming.put(read_message(requests))
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


async def _serve(incoming: queue.SimpleQueue[Any], answers: IO[bytes], spec: Any) -> None:
    import anyio.to_thread
    from watchkeeper.store import open_state_backend

    from ._try_logs import TryLogs

    tasks: dict[str, AssetTask] = {}
    async with open_state_backend(spec.settings) as backend, anyio.create_task_group() as tg:
        cap, store_logs = spec.settings.worker.log_max_bytes, backend.services.logs
        logs = TryLogs(store_logs, max_bytes=cap) if cap and store_logs is not None else None
        if logs is not None:
            await tg.start(logs.run)
        while True:
            request = await anyio.to_thread.run_sync(incoming.get)
            task = tasks.get(request.task)
            if task is None:
                try:
                    task = _find_task(request, Path(spec.settings.triggerer.watchers_path))
                except Exception as exc:  # noqa: BLE001 - answered as the try's failure
                    write_message(answers, _error(exc, None))
                    continue
                tasks[request.task] = task
            if logs is None:
                write_message(answers, await _one_try(backend, task, request.run))
                continue
            buffer = logs.open(request.run.id, request.run.try_number)
            try:
                with logs.routed(buffer):
                    answer = await _one_try(backend, task, request.run)
            finally:
                await logs.close(buffer)  # stored before the worker records the outcome
            write_message(answers, answer)


def _error(exc: BaseException, traceback_text: str | None) -> tuple[Any, ...]:
    from .._core import describe_error

    names = tuple(f"{t.__module__}.{t.__qualname__}" for t in type(exc).__mro__)
    return ("error", describe_error(exc), names, traceback_text)


async def _one_try(backend: BaseStateBackend, task: AssetTask, run: TaskRun) -> tuple[Any, ...]:
    import anyio
    import anyio.to_thread
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


def _find_task(request: Any, watchers_path: Path) -> AssetTask:
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


if __name__ == "__main__":
    main()
