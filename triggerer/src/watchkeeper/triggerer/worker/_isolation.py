"""Tries in child processes: ``asset_task(isolation="process")``.

A :class:`ProcessPool` keeps up to ``[worker] concurrency`` child processes (each a fresh
interpreter running :mod:`._child`), each running one try at a time. A child opens the store
from the worker's settings once, imports the task's module (or the definition files) once, and
then serves tries sent over its stdin: it builds the try's context as the worker does, calls
the task, and answers with the outlet events' payloads or the error and its traceback.

What the worker's own process no longer shares with the task: a segfault, ``os._exit``, a
C extension holding the GIL, or a leak ends or bloats the child only. The worker records such a
try as failed with the child's exit status or signal; past ``execution_timeout`` it kills the
child (a sync try no longer keeps running in an abandoned thread); ``[worker]
process_memory_limit_mb`` caps a child's address space (``RLIMIT_AS``), where the platform
has it. A child that died, was killed or ran out of memory is replaced by a new one for the
next try; a child whose worker died (its stdin closed) kills itself, even mid-try. When the
worker reloads its definition files, the pool is renewed: a child keeps the tasks it imported,
so the idle ones end at once and the busy ones once their try is answered.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from watchkeeper.store.protocols import OutletEvent, TaskRun, get_logger

from ._child import HEADER

if TYPE_CHECKING:
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
    exception for the task's callbacks and its ``retry_on``: ``type_names`` are the qualified
    names of the child's exception type and its bases (empty when the child died)."""

    def __init__(self, message: str, type_names: tuple[str, ...]) -> None:
        super().__init__(message)
        self.type_names = type_names


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
    """One child process and the two ends of its pipes the worker holds."""

    def __init__(self, process: anyio.abc.Process, generation: int) -> None:
        self.process = process
        self.generation = generation
        assert process.stdin is not None and process.stdout is not None
        self.requests = process.stdin
        self.answers = BufferedByteReceiveStream(process.stdout)

    async def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        await self.requests.send(HEADER.pack(len(data)) + data)

    async def receive(self) -> Any:
        header = await self.answers.receive_exactly(HEADER.size)
        return pickle.loads(await self.answers.receive_exactly(HEADER.unpack(header)[0]))

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()

    async def close(self) -> None:
        """End the child: close its stdin (it kills itself), then wait (killing it if it
        lingers)."""
        with anyio.CancelScope(shield=True):
            await self.requests.aclose()
            with anyio.move_on_after(_STOP_GRACE):
                await self.process.wait()
            self.kill()
            await self.process.wait()
            await self.process.aclose()


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
        self._limit = anyio.Semaphore(size)
        self._closed = False
        self._generation = 0

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
                    and child.process.returncode is None
                    and not isinstance(answer.error, MemoryError)
                    and "builtins.MemoryError" not in getattr(answer.error, "type_names", ())
                )
                return answer
            finally:
                self._busy.discard(child)
                if keep and not self._closed and child.generation == self._generation:
                    self._idle.append(child)
                else:
                    child.kill()
                    await child.close()

    async def warm(self) -> None:
        """Start the children ahead of the first tries (each opens the store and imports
        Python's and watchkeeper's modules: up to a second each on a busy machine)."""
        while len(self._idle) + len(self._busy) < self.size and not self._closed:
            async with self._limit:
                child = await self._start()
                if not self._keep(child):  # closed or renewed while the child started
                    await child.close()
                    return

    async def renew(self) -> None:
        """From now on, tries run in new children (which import the definition files as
        they are now): the idle ones end, the busy ones after their try."""
        self._generation += 1
        idle, self._idle = self._idle, []
        for child in idle:
            await child.close()

    def _keep(self, child: _Child) -> bool:
        """Put a started ``child`` with the idle ones, unless the pool was closed meanwhile."""
        if self._closed or child.generation != self._generation:
            return False
        self._idle.append(child)
        return True

    async def _ask(
        self, child: _Child, task: AssetTask, run: TaskRun, time_limit: float | None
    ) -> ChildResult | ChildFailure:
        answer: Any = None
        with anyio.move_on_after(time_limit if time_limit is not None else float("inf")) as late:
            try:
                await child.send(_Request(task.name, task.fn.__module__, run))
                answer = await child.receive()
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
                with anyio.move_on_after(_STOP_GRACE, shield=True):
                    await child.process.wait()
                return ChildFailure(_died(child.process.returncode), None)
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
        message, type_names, traceback_text = rest
        return ChildFailure(TaskProcessError(message, tuple(type_names)), traceback_text)

    async def _start(self) -> _Child:
        """A new child, its settings sent (it opens the store while the first try is sent)."""
        env = dict(os.environ)
        # The child imports what this process can: the task's module, the test kit...
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        process = await anyio.open_process(
            [sys.executable, "-m", "watchkeeper.triggerer.worker._child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the worker's own stderr: the task's prints and the child's log
            env=env,
        )
        child = _Child(process, self._generation)
        await child.send(_Spec(self.settings, self.settings.worker.process_memory_limit_mb))
        return child

    async def aclose(self) -> None:
        """End every child (idle ones at once; a busy one's try is abandoned)."""
        self._closed = True
        children = [*self._idle, *self._busy]
        self._idle.clear()
        for child in children:
            if child in self._busy:
                child.kill()
        for child in children:
            await child.close()


def _died(code: int | None) -> TaskProcessError:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return TaskProcessError(f"the task's process was killed by {name}", ())
    return TaskProcessError(f"the task's process exited with status {code}", ())


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
