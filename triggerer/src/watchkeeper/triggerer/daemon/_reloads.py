"""Following the watcher files: :class:`Reloads`, the daemon's part that loads the watchers path
and brings the running triggers in line with it.

A load reads the files in a child process, each within ``import_timeout`` (see
:mod:`._evaluate`), registers their assets, starts the new triggers, stops the removed or
changed ones (and restarts ``failed`` ones: touching a file retries its trigger), and
deactivates the assets no file defines any more; only assets an earlier load of this process
defined, since tasks may use assets no file declares. A file that fails to import keeps its
last good definitions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.to_thread
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import get_logger

from .._core import describe_error
from ..runtime import StoreHealth
from ..settings import TriggererSettings
from ._evaluate import ReadingProcesses, aload_watchers
from ._loader import LoadResult
from ._placement import ReloadReport, TriggerPlacement
from ._watcher_files import FileStamp, scan_watchers_path

__all__ = ["Reloads"]

log = get_logger(__name__)


class Reloads:
    """Loads of one daemon's watchers path: what was loaded last, and the loop that follows
    the files.

    :param watchers_path: the definitions directory.
    :param settings: ``[triggerer]`` (``import_timeout``, ``allowed_trigger_modules``).
    :param backend: the open store (assets are registered and deactivated in it).
    :param placement: the daemon's placement, which starts and stops the triggers.
    :param processes: the child processes the files are read in.
    :param loaded_changed: called after a load whose refusals changed (the daemon saves its
        status row, which lists them).
    """

    def __init__(
        self,
        watchers_path: Path,
        settings: TriggererSettings,
        *,
        backend: BaseStateBackend,
        placement: TriggerPlacement,
        processes: ReadingProcesses,
        loaded_changed: Callable[[], Awaitable[None]],
    ) -> None:
        self.watchers_path = watchers_path
        self.settings = settings
        self.backend = backend
        self.placement = placement
        self.processes = processes
        self.loaded_changed = loaded_changed
        self.loaded: LoadResult | None = None
        """What the last applied load found (None before the first)."""
        self.snapshot: dict[str, FileStamp] = {}
        # One load at a time (it may take import_timeout per hung file); bringing the runner
        # in line with it holds the placement's lock too.
        self._lock = anyio.Lock()
        self._unapplied: tuple[dict[str, FileStamp], LoadResult] | None = None

    async def first(self) -> ReloadReport:
        """The first load: scan the files, then load them."""
        self.snapshot = await anyio.to_thread.run_sync(scan_watchers_path, self.watchers_path)
        return await self.reload()

    async def reload(self) -> ReloadReport:
        """Load the watchers path again and bring the running triggers in line with it.

        The files are read first, without the lock the lease loop's reconciles take (a file
        may take ``import_timeout`` to be refused); only bringing the runner in line holds it.
        """
        return await self._reload(None)

    async def _reload(self, snapshot: dict[str, FileStamp] | None) -> ReloadReport:
        """:meth:`reload`; with the scan ``snapshot`` the files were read at, a retry after
        a failed apply (the store unreachable, say) reuses what was read if nothing changed."""
        async with self._lock:
            refused_before = self.loaded.errors if self.loaded is not None else None
            unapplied = self._unapplied
            if snapshot is not None and unapplied is not None and unapplied[0] == snapshot:
                result = unapplied[1]
            else:
                result = await aload_watchers(
                    self.watchers_path,
                    allowed_modules=self.settings.allowed_trigger_modules or None,
                    previous=self.loaded,
                    import_timeout=self.settings.import_timeout,
                    processes=self.processes,
                )
            try:
                async with self.placement.lock:
                    report = await self._apply(result)
            except Exception:
                self._unapplied = None if snapshot is None else (snapshot, result)
                raise
            self._unapplied = None
        if result.errors != refused_before:  # else the heartbeat's next save will do
            await self.loaded_changed()
        log.info(
            "watchers_reloaded",
            triggers=len(self.placement.running),
            assets=len(result.assets),
            started=report.started,
            stopped=report.stopped,
            deactivated=report.deactivated,
            refused=report.errors,
        )
        return report

    async def _apply(self, result: LoadResult) -> ReloadReport:
        """Register, start, stop and deactivate to match ``result``; call under the lock."""
        report = ReloadReport(errors=len(result.errors))
        backend, placement = self.backend, self.placement
        if result.assets:
            await backend.events.aregister_assets(list(result.assets))
        await placement.apply_load(result.groups, report)
        # After the reconcile stopped the triggers of removed files, their assets go.
        before = {a.name for a in self.loaded.assets} if self.loaded else set()
        for name in sorted(before - {a.name for a in result.assets}):
            if await backend.events.adeactivate_asset(name):
                report.deactivated.append(name)
                log.info("asset_deactivated", asset=name)
        gone = [t for t in report.stopped if t not in placement.wanted]
        if gone and backend.services.status is not None:
            await backend.status.adelete_trigger_status(gone)
        self.loaded = result
        return report

    async def follow(self, interval: float, health: StoreHealth) -> None:
        """Every ``interval``: scan the watchers path (mtimes and sizes, in a worker thread)
        and reload when something changed. While the store is unavailable the loop skips its
        work (``health`` logs the outage once)."""
        while True:
            await anyio.sleep(interval)
            try:
                current = await anyio.to_thread.run_sync(scan_watchers_path, self.watchers_path)
                if current == self.snapshot or not health.available:
                    continue
                await self._reload(current)
            except Exception as exc:  # noqa: BLE001 - a failed reload is retried next poll
                if health.report(exc) is None:  # an outage is logged once, by the health
                    log.error("watchers_reload_failed", error=describe_error(exc))
                continue
            self.snapshot = current
