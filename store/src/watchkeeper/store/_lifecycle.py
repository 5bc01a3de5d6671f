"""Opening and closing a backend, and running its coroutines from synchronous code.

:class:`Lifecycle` is the part of :class:`~watchkeeper.store.protocols.BaseStateBackend` that owns
the event loop side: ``async with`` opens the backend on the running loop (its ``_aopen`` hook
starts background tasks in a task group the backend owns); ``with`` opens it on a private
loop thread for purely synchronous use; :meth:`Lifecycle._run_sync` runs a coroutine function
to completion from sync code: through a greenback portal on the loop's own thread, on the
private loop, or on the opening loop from another thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import anyio
import anyio.abc

from .errors import StoreAlreadyOpenError, StoreClosedError, SyncCallInLoopError

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

__all__ = ["Lifecycle"]

T = TypeVar("T")

SYNC_CALL_WITHOUT_PORTAL: contextvars.ContextVar[Callable[[], None] | None] = (
    contextvars.ContextVar("watchkeeper_sync_call_without_portal", default=None)
)
"""Called (when set in the calling task's context) just before a sync store call made on the
event loop without a greenback portal raises :class:`SyncCallInLoopError`. The triggerer sets
it for each trigger, so that even a trigger that catches the error gets restarted with a
portal instead of carrying on without its store."""


class Lifecycle:
    """Open/close on a loop or a private loop thread, and the sync-to-async bridge."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._portal: BlockingPortal | None = None
        self._portal_cm: Any = None
        self._sync_cm: Any = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._open = False

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._open

    def missing_database(self) -> str | None:
        """Where this store would keep its data, when that is not there yet and opening the
        store would create it empty (a SQLite file); None otherwise (the file is there, or
        the data lives in memory or on a server). A command that only reads can then say
        that nothing ran there, instead of leaving an empty database behind."""
        return None

    async def _aopen(self, task_group: anyio.abc.TaskGroup) -> None:
        """Open connections, apply migrations; start background tasks in ``task_group``."""

    async def _aclose(self) -> None:
        """Flush pending writes and close connections; the task group is cancelled after."""

    async def __aenter__(self) -> Self:
        if self._open:
            raise StoreAlreadyOpenError(self)
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await self._aopen(tg)
        except BaseException:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            self._loop = None
            raise
        self._task_group = tg
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._task_group
        self._open = False
        try:
            with anyio.move_on_after(10, shield=True):
                await self._aclose()
        finally:
            self._task_group = None
            self._loop = None
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        return None

    def __enter__(self) -> Self:
        """Open the backend on a private event-loop thread, for purely synchronous use."""
        from anyio.from_thread import start_blocking_portal  # only sync users need it

        portal_cm = start_blocking_portal(backend="asyncio")
        portal = portal_cm.__enter__()
        try:
            cm = portal.wrap_async_context_manager(self)
            cm.__enter__()
        except BaseException:
            portal_cm.__exit__(None, None, None)
            raise
        self._portal, self._portal_cm, self._sync_cm = portal, portal_cm, cm
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cm, portal_cm = self._sync_cm, self._portal_cm
        self._portal = self._portal_cm = self._sync_cm = None
        try:
            if cm is not None:
                cm.__exit__(exc_type, exc, tb)
        finally:
            if portal_cm is not None:
                portal_cm.__exit__(None, None, None)

    def _check_open(self) -> None:
        if not self._open:
            raise StoreClosedError(self)

    # -- the bridge ----------------------------------------------------------------------------

    def _run_sync(
        self, method: str, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any
    ) -> T:
        """Run the coroutine function ``fn`` to completion from synchronous code."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            # On an event loop thread: blocking here would stall every other coroutine.
            import greenback  # loaded by the first sync call on a loop, not by every import

            if greenback.has_portal():
                return greenback.await_(fn(*args, **kwargs))
            on_missing_portal = SYNC_CALL_WITHOUT_PORTAL.get()
            if on_missing_portal is not None:
                on_missing_portal()
            raise SyncCallInLoopError(method)
        if self._portal is not None:

            async def call() -> T:
                return await fn(*args, **kwargs)

            return self._portal.call(call)
        loop = self._loop
        if not self._open:
            raise StoreClosedError(self)
        if loop is None:
            # Open without an event loop of its own (MemoryStateBackend is usable without
            # 'async with'): nothing is bound to a loop, so a short-lived one in this thread does.
            return anyio.run(functools.partial(fn, *args, **kwargs))
        future = asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), loop)
        return future.result()

    def run_sync(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run one of this backend's coroutine methods from sync code (CLI, task threads)."""

        async def call() -> T:
            return await fn(*args, **kwargs)

        return self._run_sync(getattr(fn, "__name__", "call"), call)
