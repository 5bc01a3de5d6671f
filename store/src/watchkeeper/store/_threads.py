"""Threads that run blocking calls for one event loop: the worker's sync tasks, the SQLite
writer's batches.

A caller hands a call to :meth:`LoopThreads.call` and awaits its future; one of the pool's
threads takes it from a queue, runs it (in a copy of the caller's context variables), and
puts the finished call on a list the loop drains. The hand-back is what this module is for:
one wake-up of the event loop for every call that finished while the loop was busy, where
``anyio.to_thread.run_sync`` pays a wake-up (a write to the loop's self-pipe), a capacity
limiter and a cancel scope per call. With a no-op task that hand-off was a third of a run's
CPU time (``benchmarks/tasks_bench.py``).

Cancellation, by default, abandons the call, as ``to_thread.run_sync(abandon_on_cancel=True)``
does: a call not yet started never runs; a started one runs to its end in its thread (Python
cannot stop a thread), its result is dropped, and the pool starts another thread in its place
so ``size`` calls can still run at once. With ``abandon=False`` the caller waits, shielded,
until the call has run, then is cancelled (the writer must know what its batch did). Threads
are daemons: a hung call never blocks the process's exit.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import anyio

__all__ = ["LoopThreads"]


class _Call:
    __slots__ = ("abandoned", "context", "error", "fn", "future", "result", "started", "stuck")

    def __init__(self, fn: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future
        self.context = contextvars.copy_context()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = False  # set by its thread before it looks at ``abandoned``
        self.abandoned = False  # set by the loop before it looks at ``started``
        self.stuck = False  # abandoned while running: its thread is counted as occupied


_STOP: Final = None


class LoopThreads:
    """Up to ``size`` sync calls at once in threads, plus one per abandoned call still running.

    Use on one event loop: :meth:`call` from its tasks, :meth:`close` when done.
    """

    def __init__(self, size: int, *, name: str) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._finished: deque[_Call] = deque()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # Touched by the loop only:
        self._threads = 0  # alive, not told to stop
        self._waiting = 0  # calls submitted and not yet finished or abandoned
        self._stuck = 0  # abandoned calls still running in their threads
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"<LoopThreads size={self.size} threads={self._threads} "
            f"waiting={self._waiting} stuck={self._stuck}>"
        )

    async def call(self, fn: Callable[[], Any], *, abandon: bool = True) -> Any:
        """Run ``fn()`` in one of the threads and return its result (or raise its error);
        cancelled, abandon it, or (``abandon=False``) wait until it has run."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        item = _Call(fn, loop.create_future())
        self._waiting += 1
        self._grow()
        self._calls.put(item)
        if not abandon:
            return await self._outcome(item)
        try:
            return await item.future
        except BaseException:
            if not item.future.done() or item.future.cancelled():
                self._abandon(item)
            raise

    async def _outcome(self, item: _Call) -> Any:
        # The shield keeps the call's own future out of a cancellation of the caller.
        try:
            return await asyncio.shield(item.future)
        except BaseException:
            if item.future.done():
                raise
            with anyio.CancelScope(shield=True):
                await asyncio.wait([item.future])
            raise

    def close(self) -> None:
        """Stop the threads once they finish what they run (queued calls are not started)."""
        self._closed = True
        for _ in range(self._threads):
            self._calls.put(_STOP)
        self._threads = 0

    # -- on the loop ---------------------------------------------------------------------------

    def _grow(self) -> None:
        busy = self._waiting + self._stuck
        if self._threads < busy and self._threads < self.size + self._stuck:
            self._threads += 1
            thread = threading.Thread(
                target=self._serve, name=f"{self.name}-{self._threads}", daemon=True
            )
            thread.start()

    def _abandon(self, item: _Call) -> None:
        item.abandoned = True
        self._waiting -= 1
        if item.started:  # it runs on in its thread, which must not count as free
            item.stuck = True
            self._stuck += 1
            if not self._closed:
                self._grow()

    def _drain(self) -> None:
        self._wake_pending = False
        finished = self._finished
        while finished:
            item = finished.popleft()
            if item.abandoned:
                if item.stuck:
                    self._stuck -= 1
                continue
            self._waiting -= 1
            if item.future.done():
                continue
            if item.error is not None:
                item.future.set_exception(item.error)
                item.error = None  # no cycle through the traceback
            else:
                item.future.set_result(item.result)

    # -- in the threads ------------------------------------------------------------------------

    def _serve(self) -> None:
        calls, finished = self._calls, self._finished
        while True:
            item = calls.get()
            if item is _STOP:
                return
            item.started = True
            if not item.abandoned:
                try:
                    item.result = item.context.run(item.fn)
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                    item.error = exc
            finished.append(item)
            if not self._wake_pending:
                self._wake_pending = True
                loop = self._loop
                assert loop is not None
                try:
                    loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return
            del item
