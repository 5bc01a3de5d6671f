"""The lifecycle every long-lived part of the triggerer shares: :class:`AsyncService`.

A service holds resources and runs background tasks in a task group it owns. ``async with
service:`` (or ``await service.start()`` ... ``await service.aclose()`` in the same task)
opens it once; closing winds it down, cancels its tasks, then releases its resources in
reverse order. One dropped while open warns with :class:`ResourceWarning`.
"""

from __future__ import annotations

import contextlib
import warnings
from types import TracebackType
from typing import Literal, Self

import anyio
import anyio.abc

__all__ = ["AsyncService"]

ServiceState = Literal["new", "starting", "running", "closing", "closed"]


class AsyncService:
    """Base of a long-lived async part that owns a task group.

    A subclass fills in up to three hooks, each optional:

    - :meth:`_aopen` acquires what the service holds, pushing each release on the exit stack
      it is given (the runner of a daemon, its leases, its store);
    - :meth:`_astart` starts the service's tasks in its task group, entered after the
      resources (so the tasks end before any resource is released);
    - :meth:`_astop` winds down while the tasks still run (the runner stops its triggers
      and saves their statuses).

    Then closing cancels the task group, waits for its tasks and releases the resources.
    A failed start undoes what it did and re-raises. A service starts once: a closed one is
    not opened again (build a new one). A service without tasks (no :meth:`_astart`) opens
    no task group, so several of them may be closed in any order.
    """

    _service_state: ServiceState = "new"
    _task_group: anyio.abc.TaskGroup | None = None
    _exit_stack: contextlib.AsyncExitStack | None = None

    async def _aopen(self, resources: contextlib.AsyncExitStack) -> None:
        """Acquire the service's resources; push the release of each on ``resources``."""

    async def _astart(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start the service's background tasks in ``task_group``."""

    async def _astop(self) -> None:
        """Wind down while the tasks still run; the task group is cancelled after it."""

    @property
    def is_running(self) -> bool:
        """Whether the service has started and is not closing or closed."""
        return self._service_state == "running"

    async def start(self) -> Self:
        """Open the resources and start the tasks; raises ``RuntimeError`` on a second start."""
        if self._service_state != "new":
            raise RuntimeError(
                f"a {type(self).__name__} can be started only once; create a new one"
            )
        self._service_state = "starting"
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._aopen(stack)
            if type(self)._astart is not AsyncService._astart:
                task_group = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(task_group.cancel_scope.cancel)  # on exit: cancel, then wait
                self._task_group = task_group
                await self._astart(task_group)
        except BaseException:
            self._task_group = None
            self._service_state = "closed"
            # As in aclose(): the error propagates as it was raised, not in an ExceptionGroup.
            await stack.__aexit__(None, None, None)
            raise
        self._exit_stack = stack
        self._service_state = "running"
        return self

    async def aclose(self) -> None:
        """Wind down, cancel the tasks, release the resources; a no-op unless running."""
        stack = self._exit_stack
        if self._service_state != "running" or stack is None:
            return
        self._service_state = "closing"
        try:
            await self._astop()
        finally:
            self._exit_stack = None
            self._task_group = None
            self._service_state = "closed"
            # The body's exception (if any) is not handed to the task group, which would wrap
            # it in an ExceptionGroup: it propagates unchanged once every task has ended.
            await stack.__aexit__(None, None, None)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if self._service_state in ("starting", "running"):
            warnings.warn(
                f"{type(self).__name__} was not closed: leave its 'async with' block or "
                "await its aclose()",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
