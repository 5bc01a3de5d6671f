"""The long-lived daemon: load the watchers path, run its triggers, follow its changes.

:class:`Daemon` is an async context manager that owns, in order, the state backend, a
:class:`~watchkeeper.triggerer.runner.TriggerRunner` and a task group for its own two loops:

- the **reload loop** polls the watchers path (file mtimes and sizes, in a worker thread) and,
  when something changed, re-imports the definitions, registers their assets, starts the new
  triggers, stops the removed or changed ones, and deactivates the assets no file defines any
  more (their state is then swept by garbage collection). Only assets that an earlier load of
  this process defined are deactivated: tasks may use assets no watcher file declares, so a
  starting daemon never deactivates anything. A file that fails to import keeps its last good
  definitions, so a typo being edited neither stops a watcher nor deactivates its asset;
- the **GC loop** calls ``acollect_garbage`` every ``[triggerer] gc_interval`` seconds and
  forgets the status rows of triggers that no daemon runs any more.

A reload also restarts a trigger that is in the ``failed`` state (it exhausted
``max_failures``): touching its file retries it once its source is fixed.

:func:`run_daemon` adds the signal handling of the ``watchkeeper triggerer`` command: on
SIGTERM or SIGINT it stops taking work (no more reloads or GC passes), lets the runner cancel
the triggers within ``stop_grace`` and flush their status, closes the store and returns.

A restarted daemon resumes every watcher from its stored watermark: triggers read it from
their asset state, which the store keeps across restarts and ``kill -9``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio
import anyio.abc
import anyio.to_thread
import structlog
from watchkeeper.store import BaseStateBackend, GcReport, open_state_backend

from ._loader import LoadResult, WatcherGroup, load_watchers, scan_watchers_path
from .errors import TriggererError
from .runner import RunnerConfig, TriggerRunner, WatchSpec
from .settings import Settings

__all__ = ["Daemon", "ReloadReport", "run_daemon"]

log = structlog.get_logger()

DEFAULT_RELOAD_INTERVAL = 2.0
"""Seconds between two scans of the watchers path."""


@dataclass(slots=True)
class ReloadReport:
    """What one reload changed (trigger ids and asset names)."""

    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    deactivated: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)
    errors: int = 0


def runner_config(settings: Settings, *, owner: str | None = None) -> RunnerConfig:
    """The runner's configuration from the ``[triggerer]`` section."""
    t = settings.triggerer
    return RunnerConfig(
        capacity=t.capacity,
        backoff_initial=t.backoff_initial,
        backoff_max=t.backoff_max,
        max_failures=t.max_failures,
        stop_grace=t.stop_grace,
        lag_threshold=t.lag_threshold,
        status_interval=t.heartbeat_interval,
        owner=owner or f"{socket.gethostname()}:{os.getpid()}",
    )


class Daemon:
    """Runs the triggers defined under ``[triggerer] watchers_path`` until it is exited.

    ``backend`` lets an embedding pass a backend it opened itself (the daemon then neither
    opens nor closes it); by default the daemon opens the one the settings configure.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        backend: BaseStateBackend | None = None,
        reload_interval: float = DEFAULT_RELOAD_INTERVAL,
    ) -> None:
        if reload_interval <= 0:
            raise ValueError(f"reload_interval must be positive, got {reload_interval}")
        self.settings = settings
        self.watchers_path = Path(settings.triggerer.watchers_path).resolve()
        self.reload_interval = reload_interval
        self._backend = backend
        self._owns_backend = backend is None
        self._runner: TriggerRunner | None = None
        self._loaded: LoadResult | None = None
        self._running: dict[str, WatcherGroup] = {}
        self._snapshot: dict[str, tuple[int, int]] = {}
        self._reload_lock = anyio.Lock()
        self._stack: contextlib.AsyncExitStack | None = None

    def __repr__(self) -> str:
        return (
            f"<Daemon watchers_path={str(self.watchers_path)!r} "
            f"triggers={len(self._running)} open={self._stack is not None}>"
        )

    @property
    def backend(self) -> BaseStateBackend:
        if self._backend is None:
            raise RuntimeError("the daemon is not open")
        return self._backend

    @property
    def runner(self) -> TriggerRunner:
        if self._runner is None:
            raise RuntimeError("the daemon is not open")
        return self._runner

    @property
    def groups(self) -> dict[str, WatcherGroup]:
        """The running triggers by id, as loaded from the watcher files."""
        return dict(self._running)

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RuntimeError("this Daemon is already running")
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            if self._backend is None:
                self._backend = open_state_backend(self.settings)
            if self._owns_backend:
                await stack.enter_async_context(self._backend)
            stack.callback(self._forget)
            self._runner = await stack.enter_async_context(
                TriggerRunner(self._backend, runner_config(self.settings))
            )
            self._snapshot = await anyio.to_thread.run_sync(scan_watchers_path, self.watchers_path)
            report = await self.reload()
            await self._drop_stale_statuses()
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)  # runs first on exit: stop taking work
            tg.start_soon(self._reload_loop)
            if self.settings.triggerer.gc_interval > 0:
                tg.start_soon(self._gc_loop, self.settings.triggerer.gc_interval)
        except BaseException as exc:
            # Each context on the stack bounds its own cleanup (the runner by stop_grace, the
            # backend by a shielded timeout); a scope around them would break their nesting.
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._stack = stack
        loaded = self._loaded
        log.info(
            "daemon_started",
            watchers_path=str(self.watchers_path),
            triggers=len(self._running),
            assets=len(loaded.assets) if loaded else 0,
            refused=report.errors,
            backend=repr(self._backend),
            pid=os.getpid(),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        triggers = len(self._running)
        if stack is not None:
            # First our loops stop (no more reloads or GC), then the runner cancels the
            # triggers within stop_grace and saves their statuses, then the backend closes.
            await stack.__aexit__(exc_type, exc, tb)
        log.info("daemon_stopped", triggers=triggers)
        return None

    def _forget(self) -> None:
        self._runner = None
        self._running = {}
        self._loaded = None
        if self._owns_backend:
            self._backend = None

    # -- reloading -------------------------------------------------------------------------------

    async def reload(self) -> ReloadReport:
        """Load the watchers path again and bring the running triggers in line with it."""
        async with self._reload_lock:
            loader = functools.partial(
                load_watchers,
                self.watchers_path,
                allowed_modules=self.settings.triggerer.allowed_trigger_modules or None,
                previous=self._loaded,
            )
            result = await anyio.to_thread.run_sync(loader)
            report = ReloadReport(errors=len(result.errors))
            backend, runner = self.backend, self.runner
            if result.assets:
                await backend.aregister_assets(list(result.assets))
            wanted = {g.trigger_id: g for g in result.groups}
            # A trigger that gave up ("failed") gets a fresh start from any reload, so an
            # operator retries it by touching its file once the source is fixed.
            failed = {s.trigger_id for s in runner.statuses() if s.state == "failed"}
            for trigger_id, group in list(self._running.items()):
                same = trigger_id in wanted and wanted[trigger_id].key == group.key
                if not same or trigger_id in failed:
                    await runner.stop_trigger(trigger_id)
                    del self._running[trigger_id]
                    report.stopped.append(trigger_id)
            before = {a.name for a in self._loaded.assets} if self._loaded else set()
            for name in sorted(before - {a.name for a in result.assets}):
                if await backend.adeactivate_asset(name):
                    report.deactivated.append(name)
                    log.info("asset_deactivated", asset=name)
            for trigger_id, group in wanted.items():
                if trigger_id in self._running:
                    continue
                try:
                    await runner.start_trigger(_spec(group))
                except (TriggererError, ValueError) as exc:  # over capacity: retried next reload
                    report.not_started.append(trigger_id)
                    log.error("trigger_not_started", trigger_id=trigger_id, reason=str(exc))
                    continue
                self._running[trigger_id] = group
                report.started.append(trigger_id)
            gone = [t for t in report.stopped if t not in self._running]
            if gone:
                await backend.adelete_trigger_status(gone)
            self._loaded = result
        log.info(
            "watchers_reloaded",
            triggers=len(self._running),
            assets=len(result.assets),
            started=report.started,
            stopped=report.stopped,
            deactivated=report.deactivated,
            refused=report.errors,
        )
        return report

    async def _drop_stale_statuses(self) -> None:
        """Forget status rows of triggers that no daemon runs any more.

        A row of a trigger this daemon does not run is stale when it says ``stopped`` (saved by
        a daemon that exited) or has not been refreshed for several heartbeats (its daemon was
        killed). Rows that other live daemons keep refreshing stay.
        """
        heartbeat = self.settings.triggerer.heartbeat_interval
        cutoff = datetime.now(UTC) - timedelta(seconds=3 * heartbeat + 30)
        rows = await self.backend.alist_trigger_status()
        stale = [
            r.trigger_id
            for r in rows
            if r.trigger_id not in self._running
            and (r.state == "stopped" or r.updated_at is None or r.updated_at < cutoff)
        ]
        if stale:
            await self.backend.adelete_trigger_status(stale)
            log.info("trigger_status_pruned", trigger_ids=stale)

    async def _reload_loop(self) -> None:
        while True:
            await anyio.sleep(self.reload_interval)
            try:
                current = await anyio.to_thread.run_sync(scan_watchers_path, self.watchers_path)
                if current == self._snapshot:
                    continue
                await self.reload()
            except Exception as exc:  # noqa: BLE001 - a failed reload is retried next poll
                log.error("watchers_reload_failed", error=f"{type(exc).__name__}: {exc}")
                continue
            self._snapshot = current

    # -- garbage collection ----------------------------------------------------------------------

    async def collect_garbage(self) -> GcReport:
        """One GC pass with the ``[state_store]`` retention and batch size."""
        store = self.settings.state_store
        report = await self.backend.acollect_garbage(
            default_retention_days=store.default_retention_days,
            batch_size=store.state_cleanup_batch_size,
        )
        log.info(
            "gc_done",
            expired=len(report.expired),
            retention=len(report.retention),
            orphaned=len(report.orphaned),
        )
        return report

    async def _gc_loop(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            try:
                await self.collect_garbage()
                await self._drop_stale_statuses()
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                log.error("gc_failed", error=f"{type(exc).__name__}: {exc}")


def _spec(group: WatcherGroup) -> WatchSpec:
    return WatchSpec(
        trigger_id=group.trigger_id,
        trigger=group.trigger,
        assets=group.assets,
        watchers=group.watchers,
    )


async def run_daemon(
    settings: Settings,
    *,
    reload_interval: float = DEFAULT_RELOAD_INTERVAL,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """Run the daemon until one of ``signals`` arrives, then shut down cleanly and return."""
    with anyio.open_signal_receiver(*signals) as received:
        async with Daemon(settings, reload_interval=reload_interval):
            async for signum in received:
                log.info("daemon_stopping", signal=signal.Signals(signum).name)
                break
