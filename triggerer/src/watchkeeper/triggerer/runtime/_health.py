"""Whether the store answers: one view shared by a runner's supervisors and the daemon's loops.

A database outage is nobody's fault among the watchers, so it must neither count as their
failure nor make each of them log and retry on its own. The backends classify driver errors
once, at their boundary: :class:`~watchkeeper.store.StoreUnavailableError` means the store
cannot serve us now (connection refused or lost, a server not accepting connections, a
read-only failover, too many connections, a locked SQLite file, a disk I/O error).

Whoever meets such an error calls :meth:`StoreHealth.report` and then waits in
:meth:`StoreHealth.wait_available`. The one prober task (:meth:`StoreHealth.run`, in the
runner's task group) checks at once with ``backend.aping()``: if the store answers, it was a
blip and everyone goes on, with nothing logged. Otherwise the outage is confirmed and logged
once (``store_unavailable``); the prober pings with a doubling delay (``backoff_initial`` up to
``store_retry_max``) until the store answers, runs the recovery hooks (the daemon renews its
leases there, before any watcher writes again), logs ``store_available`` and wakes everyone.

:class:`~watchkeeper.store.DatabaseFileRemovedError` is different: the store is gone for
good. :meth:`StoreHealth.report` logs ``database_file_removed`` once and returns it; the
caller stops (a watcher is ``stopped``, the daemon exits with that error).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import anyio.abc
from watchkeeper.store import BaseStateBackend, DatabaseFileRemovedError, StoreUnavailableError
from watchkeeper.store.protocols import get_logger

from .._core import describe_error
from ._config import RunnerConfig

__all__ = ["StoreHealth", "find_cause", "store_unavailable"]

log = get_logger(__name__)

E = TypeVar("E", bound=BaseException)

_PING_TIMEOUT = 10.0
"""Seconds a ping may take before it counts as unanswered (a server that drops packets)."""


def find_cause(error: BaseException | None, kind: type[E]) -> E | None:
    """The ``kind`` error behind ``error``: itself, one it was raised from or while handling,
    or one inside an exception group (a watcher's own task group), searched a few levels deep."""
    todo: list[tuple[BaseException, int]] = [] if error is None else [(error, 0)]
    while todo:
        current, depth = todo.pop(0)
        if isinstance(current, kind):
            return current
        if depth >= 8:
            continue
        if isinstance(current, BaseExceptionGroup):
            todo.extend((inner, depth + 1) for inner in current.exceptions)
        nxt = current.__cause__ or current.__context__
        if nxt is not None:
            todo.append((nxt, depth + 1))
    return None


def store_unavailable(error: BaseException | None) -> StoreUnavailableError | None:
    """The :class:`StoreUnavailableError` behind ``error``, if any (see :func:`find_cause`)."""
    return find_cause(error, StoreUnavailableError)


class StoreHealth:
    """Whether ``backend`` answers; see the module docstring.

    ``available`` is False from a confirmed outage until the store answers again;
    ``outages`` counts the confirmed ones; ``removed`` holds the
    :class:`DatabaseFileRemovedError` once one was reported.
    """

    def __init__(self, backend: BaseStateBackend, config: RunnerConfig) -> None:
        self.backend = backend
        self.config = config
        self.available = True
        self.outages = 0
        self.reports = 0
        """Errors reported as store unavailability (by every watcher and loop, each try)."""
        self.removed: DatabaseFileRemovedError | None = None
        self._hooks: list[Callable[[], Awaitable[object]]] = []
        self._checking = False
        self._wake = anyio.Event()
        self._answered = anyio.Event()
        self._answered.set()

    def __repr__(self) -> str:
        return (
            f"<StoreHealth available={self.available} checking={self._checking} "
            f"outages={self.outages} removed={self.removed is not None}>"
        )

    def add_recovery_hook(self, hook: Callable[[], Awaitable[object]]) -> None:
        """Await ``hook()`` after an outage, once the store answers and before anyone waiting
        resumes; a hook that meets the store unavailable again prolongs the outage."""
        self._hooks.append(hook)

    def report(
        self, error: BaseException | None
    ) -> StoreUnavailableError | DatabaseFileRemovedError | None:
        """Classify an error met while using the store, act on it, and return its cause.

        A :class:`StoreUnavailableError`: the store did not answer; a check starts (if none is
        running) and the caller should :meth:`wait_available` before trying again. A
        :class:`DatabaseFileRemovedError`: the database file is gone for good (logged once).
        ``None``: neither; the error is the caller's own.
        """
        removed = find_cause(error, DatabaseFileRemovedError)
        if removed is not None:
            if self.removed is None:
                self.removed = removed
                log.error(
                    "database_file_removed",
                    path=removed.path,
                    reason=removed.reason,
                    error=describe_error(removed),
                )
            return removed
        cause = store_unavailable(error)
        if cause is None:
            return None
        self.reports += 1
        if not self._checking:
            self._checking = True
            self._answered = anyio.Event()
            self._wake.set()
        return cause

    async def wait_available(self) -> None:
        """Return once no check is running: the store answered after the last report."""
        await self._answered.wait()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The prober: check each report, and ping through an outage until the store answers."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self._check()
            finally:
                self._checking = False
                self._answered.set()

    async def _check(self) -> None:
        attempt = 0
        down_since: float | None = None
        while True:
            error = await self._ping()
            if error is None and down_since is not None:
                error = await self._recover()
            if error is None:
                break
            if down_since is None:
                down_since = time.monotonic()
                self.available = False
                self.outages += 1
                log.warning("store_unavailable", error=describe_error(error))
            attempt += 1
            delay = self._delay(attempt)
            log.debug("store_ping_failed", attempt=attempt, retry_in=round(delay, 3))
            await anyio.sleep(delay)
        if down_since is not None:
            self.available = True
            log.info(
                "store_available",
                down_seconds=round(time.monotonic() - down_since, 3),
                pings=attempt + 1,
            )

    async def _ping(self) -> BaseException | None:
        """None when the store answered (even with an error that is not about availability:
        that one is for the caller to meet); the error when it did not."""
        with anyio.move_on_after(_PING_TIMEOUT) as scope:
            try:
                await self.backend.aping()
            except Exception as exc:  # noqa: BLE001 - classified just below
                return exc if store_unavailable(exc) is not None else None
        if scope.cancelled_caught:
            return TimeoutError(f"the store did not answer a ping within {_PING_TIMEOUT} s")
        return None

    async def _recover(self) -> BaseException | None:
        """Run the recovery hooks; the error if the store went away again meanwhile."""
        for hook in self._hooks:
            try:
                await hook()
            except Exception as exc:  # noqa: BLE001 - a hook must not keep watchers waiting
                if store_unavailable(exc) is not None:
                    return exc
                log.error("store_recovery_hook_failed", error=describe_error(exc))
        return None

    def _delay(self, attempt: int) -> float:
        """Seconds before ping number ``attempt + 1``: doubling, capped at ``store_retry_max``."""
        exponent = min(attempt - 1, 64)
        first = max(self.config.backoff_initial, 0.001)
        return min(self.config.store_retry_max, first * 2.0**exponent)
