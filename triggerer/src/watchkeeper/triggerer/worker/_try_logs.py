"""Each try's output, kept with its run: what a task prints and the log records of its code.

A worker (and a task's child process) routes ``sys.stdout``, ``sys.stderr`` and the root
logger through this module while it runs. What decides where a write goes is a context
variable, set for the duration of one try: the try's own :class:`TryLog` buffer, or none
(then the write goes where it went before, the process's own streams). A try's tasks and its
threads see its buffer and only its buffer: asyncio tasks copy their context, the worker's
threads run each sync call in the caller's context (``LoopThreads``), and so do anyio's
``to_thread.run_sync``. Two tries never write into each other's buffers, whatever they
interleave. A thread the task starts itself (``threading.Thread``) does not inherit the
context: what it prints goes to the process's streams.

A buffer is flushed to the store (``store.logs.aappend``) every :data:`FLUSH_INTERVAL`
seconds and once more when the try ends, before its outcome is recorded (so a run that is no
longer running has all its logs stored). A killed worker loses at most the last interval's
output. What waits in a buffer is bounded by the cap (``[worker] log_max_bytes``): its tail
is kept, as the store keeps a try's tail.

Log records are also still handled by the process's own logging (the daemon's JSON log),
with the try's ``run_id`` and ``try_number`` bound (structlog's context variables), so a
pipeline that reads that log keeps its warnings; printed text goes only to the run's logs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import IO, Any, Final

import anyio
import anyio.abc
import structlog
from watchkeeper.store import StateStoreError
from watchkeeper.store.protocols import RunLogs, get_logger

from .._core import describe_error

__all__ = ["FLUSH_INTERVAL", "TryLog", "TryLogs"]

log = get_logger(__name__)

FLUSH_INTERVAL: Final = 0.5
"""Seconds between two flushes of the tries' output to the store."""

_FLUSH_LIMIT: Final = 10.0
"""Seconds one flush may take (it runs shielded from cancellation)."""

_CURRENT: ContextVar[TryLog | None] = ContextVar("watchkeeper_try_log", default=None)


class TryLog:
    """The output of one try not yet stored: written from any thread, taken by a flush."""

    __slots__ = ("_lock", "_pending", "_size", "flushing", "max_bytes", "run_id", "try_number")

    def __init__(self, run_id: int, try_number: int, max_bytes: int) -> None:
        self.run_id, self.try_number, self.max_bytes = run_id, try_number, max_bytes
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str]] = []  # each write, joined when taken
        self._size = 0  # characters pending: a cheap bound on the bytes
        #: Held while a flush takes and stores: flushes of one try store in order.
        self.flushing = anyio.Lock()

    def __repr__(self) -> str:
        return f"<TryLog run={self.run_id} try={self.try_number} pending={self._size}>"

    @property
    def idle(self) -> bool:
        """Nothing waits and no flush is storing: the try's output is all stored."""
        return not self._pending and not self.flushing.locked()

    def write(self, stream: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            self._pending.append((stream, text))
            self._size += len(text)
            if self._size > 2 * self.max_bytes:  # bound the memory: the tail is what is kept
                self._trim()

    def _trim(self) -> None:
        kept: list[tuple[str, str]] = []
        room = self.max_bytes
        for stream, text in reversed(self._pending):
            part = text[-room:]
            kept.append((stream, part))
            room -= len(part)
            if room <= 0:
                break
        kept.reverse()
        self._pending = kept
        self._size = sum(len(text) for _, text in kept)

    def take(self) -> list[tuple[str, str]]:
        """What waits, in order, each stream's consecutive writes as one chunk; and nothing
        waits any more."""
        with self._lock:
            taken, self._pending, self._size = self._pending, [], 0
        runs: list[tuple[str, list[str]]] = []
        for stream, text in taken:
            if runs and runs[-1][0] == stream:
                runs[-1][1].append(text)
            else:
                runs.append((stream, [text]))
        return [(stream, "".join(parts)) for stream, parts in runs]

    def put_back(self, chunks: list[tuple[str, str]]) -> None:
        """Return ``chunks`` (taken, not stored) before what was written since."""
        with self._lock:
            self._pending[:0] = chunks
            self._size += sum(len(text) for _, text in chunks)
            if self._size > 2 * self.max_bytes:
                self._trim()


class _Route:
    """``sys.stdout`` or ``sys.stderr`` while a worker runs: a write during a try goes to the
    try's buffer, any other to the stream it replaced (every other attribute is that
    stream's: ``fileno``, ``encoding``, ``buffer``...)."""

    def __init__(self, stream: str, original: IO[str]) -> None:
        self._stream = stream
        self._original = original

    def write(self, text: str) -> int:
        current = _CURRENT.get()
        if current is None:
            return self._original.write(text)
        current.write(self._stream, text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if _CURRENT.get() is None:
            self._original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


class _RecordRoute(logging.Handler):
    """On the root logger: a record logged during a try, rendered as one line of its logs."""

    def __init__(self) -> None:
        super().__init__()
        formatter = logging.Formatter(
            "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
        formatter.converter = time.gmtime  # UTC, as the daemon's own log
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        current = _CURRENT.get()
        if current is not None:
            try:
                current.write("log", self.format(record) + "\n")
            except Exception:  # noqa: BLE001 - logging's own rule: a bad record never raises
                self.handleError(record)


_install_lock = threading.Lock()
_installed: list[Any] = []  # [count, stdout route, stderr route, handler] while installed


@contextlib.contextmanager
def _routes() -> Iterator[None]:
    """``sys.stdout``, ``sys.stderr`` and the root logger routed while inside (nested: once)."""
    with _install_lock:
        if _installed:
            _installed[0] += 1
        else:
            out, err = _Route("stdout", sys.stdout), _Route("stderr", sys.stderr)
            handler = _RecordRoute()
            sys.stdout, sys.stderr = out, err
            logging.getLogger().addHandler(handler)
            _installed[:] = [1, out, err, handler]
    try:
        yield
    finally:
        with _install_lock:
            _installed[0] -= 1
            if not _installed[0]:
                _, out, err, handler = _installed
                if sys.stdout is out:  # unless someone replaced it meanwhile
                    sys.stdout = out._original
                if sys.stderr is err:
                    sys.stderr = err._original
                logging.getLogger().removeHandler(handler)
                _installed.clear()


class TryLogs:
    """A worker's side: routes the process's output while :meth:`run` runs, gives each try a
    buffer (:meth:`open`, :meth:`routed`, :meth:`close`) and flushes the buffers to ``logs`` (each try keeps at most
    ``max_bytes``)."""

    def __init__(self, logs: RunLogs, *, max_bytes: int, interval: float = FLUSH_INTERVAL) -> None:
        self._logs = logs
        self.max_bytes = max_bytes
        self._interval = interval
        self._live: dict[int, TryLog] = {}  # by id(), the tries running now

    def __repr__(self) -> str:
        return f"<TryLogs live={len(self._live)} max_bytes={self.max_bytes}>"

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Route the output (started once it is routed), and flush every interval, until
        cancelled."""
        with _routes():
            task_status.started()
            while True:
                await anyio.sleep(self._interval)
                for buffer in list(self._live.values()):
                    await self.flush(buffer)

    def open(self, run_id: int, try_number: int) -> TryLog:
        """A buffer for this try, flushed every interval until :meth:`close`."""
        buffer = TryLog(run_id, try_number, self.max_bytes)
        self._live[id(buffer)] = buffer
        return buffer

    @staticmethod
    @contextlib.contextmanager
    def routed(buffer: TryLog) -> Iterator[None]:
        """Inside, the output of this task (and of the tasks and sync calls it starts) goes
        to ``buffer``, and the daemon's log lines carry its run id and try number."""
        token = _CURRENT.set(buffer)
        try:
            with structlog.contextvars.bound_contextvars(
                run_id=buffer.run_id, try_number=buffer.try_number
            ):
                yield
        finally:
            _CURRENT.reset(token)

    async def close(self, buffer: TryLog) -> None:
        """Store what is left of a try's output; the try is over (when it returns, all of
        the try's output is stored, or given up on with a warning)."""
        self._live.pop(id(buffer), None)
        if not buffer.idle:  # most tries print nothing: no lock, no scope
            await self.flush(buffer)

    async def flush(self, buffer: TryLog) -> None:
        """Store what waits in ``buffer``: shielded from cancellation (what was taken is
        stored or put back, never dropped half-way) and bounded; when the store fails, it
        waits for the next flush."""
        with anyio.move_on_after(_FLUSH_LIMIT, shield=True):
            async with buffer.flushing:
                chunks = buffer.take()
                if not chunks:
                    return
                try:
                    await self._logs.aappend(
                        buffer.run_id, buffer.try_number, chunks, max_bytes=self.max_bytes
                    )
                except BaseException as exc:
                    buffer.put_back(chunks)
                    if not isinstance(exc, StateStoreError):
                        raise
                    log.warning(
                        "run_logs_not_stored", run_id=buffer.run_id, error=describe_error(exc)
                    )
