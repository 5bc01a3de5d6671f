"""The long-lived daemon: load the watchers path, run its triggers, follow its changes.

:class:`Daemon` is an async context manager that owns, in order, the state backend, a
:class:`~watchkeeper.triggerer.runner.TriggerRunner` and a task group for its own loops:

- the **reload loop** polls the watchers path (file mtimes and sizes, in a worker thread) and,
  when something changed, reads the definitions again, registers their assets, starts the new
  triggers, stops the removed or changed ones, and deactivates the assets no file defines any
  more (their state is then swept by garbage collection). Only assets that an earlier load of
  this process defined are deactivated: tasks may use assets no watcher file declares, so a
  starting daemon never deactivates anything. A file that fails to import keeps its last good
  definitions, so a typo being edited neither stops a watcher nor deactivates its asset. The
  files are read in a child process, each within ``[triggerer] import_timeout`` (see
  :mod:`._evaluate`): a file that hangs at import is refused, not waited for;
- the **GC loop** calls ``acollect_garbage`` every ``[triggerer] gc_interval`` seconds (task
  state, the state of inactive assets, and events past ``[events]`` retention) and forgets the
  status rows of triggers that no daemon runs any more;
- the **lease loop** renews, every ``[triggerer] lease_renew_interval`` seconds, the daemon's
  node lease (one row) and claims free leases up to its share of the triggers loaded, or
  sheds those over it (see :mod:`._leases`); sooner when another daemon released leases or
  joined (a NOTIFY on PostgreSQL), or when another node lease is due to expire (it is then
  reaped and its triggers taken over). It never waits for a reload: the **reconcile loop**
  then starts the triggers whose lease was got, with the lease's token as their fence, and
  stops those whose lease this daemon no longer holds (or that stopped themselves because
  the store refused a write of theirs as stale). A node lease lasts ``[triggerer] lease_ttl``
  seconds (three renewals by default), so the triggers of a daemon that died move to the
  others that long after; the **deadline loop** stops every trigger of this daemon when it
  could not renew for ``lease_ttl - lease_margin`` seconds (a thread of its own also
  extends the node lease, so that a busy loop cannot make it late). Several daemons on one
  PostgreSQL database thus share the watchers, each run by one daemon at a time; a single
  daemon (SQLite) holds every lease;
- the **status loop** saves, every heartbeat, the daemon's own row: what ``watchkeeper
  status`` reads to tell a live daemon from a dead one, with the definitions it refused.

A database outage fails nothing: the runner's store health (see :mod:`._health`) holds the
triggers, this daemon's loops skip their work meanwhile and report their errors there instead
of logging each one, and once the store answers the leases are renewed before any trigger
writes again. Every heartbeat also checks that the store is still the one opened
(``backend.averify()``): a SQLite file removed under the daemon (``rm -rf`` of its directory)
is logged as ``database_file_removed`` and the daemon stops with that error (``watchkeeper
triggerer`` exits 1) instead of committing into a file nobody can open again.

A reload also restarts a trigger that is in the ``failed`` state (it exhausted
``max_failures``): touching its file retries it once its source is fixed.

:func:`~._process.run_daemon` adds the signal handling of the ``watchkeeper triggerer``
command: on SIGTERM or SIGINT it stops taking work (no more reloads, GC passes or claims),
lets the runner cancel the triggers within ``stop_grace`` and flush their status, releases
its leases (so another daemon, or this one restarted, takes the triggers over at once),
closes the store and returns. A signal while the daemon is still starting cancels the start-up.

A restarted daemon resumes every watcher from its stored watermark: triggers read it from
their asset state, which the store keeps across restarts and ``kill -9``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
from watchkeeper.store import BaseStateBackend, PostgresStateBackend, open_state_backend
from watchkeeper.store.backend import (
    GcReport,
    StatusTable,
    get_logger,
    require_asset_registry,
    require_garbage_collector,
)

from ._config import SupervisionSettings
from ._daemon_leases import DaemonLeases
from ._daemon_status import DaemonStatusKeeper
from ._describe import describe_error
from ._evaluate import ReadingProcesses, aload_watchers
from ._gctune import raise_gen0_threshold, startup_gc
from ._leases import LeaseKeeper, daemon_identity
from ._loader import LoadResult, WatcherGroup
from ._placement import ReloadReport, TriggerPlacement
from ._reconcile import RunningTrigger
from ._watcher_controls import ControlsTracker
from ._watcher_files import FileStamp, scan_watchers_path
from .runner import RunnerConfig, TriggerRunner
from .settings import DEFAULT_RELOAD_INTERVAL, Settings

__all__ = ["DEFAULT_RELOAD_INTERVAL", "Daemon", "ReloadReport"]

log = get_logger(__name__)

_T = TypeVar("_T")


def runner_config(settings: Settings, *, owner: str | None = None) -> RunnerConfig:
    """The runner's configuration: the supervision keys of ``[triggerer]``, as they are."""
    t = settings.triggerer
    shared = {name: getattr(t, name) for name in SupervisionSettings.model_fields}
    return RunnerConfig(
        **shared,
        status_interval=t.heartbeat_interval,
        owner=owner or daemon_identity(),
    )


class Daemon(DaemonLeases):
    """Runs the triggers defined under ``[triggerer] watchers_path`` until it is exited.

    ``backend`` lets an embedding pass a backend it opened itself (the daemon then neither
    opens nor closes it); by default the daemon opens the one the settings configure.
    ``reload_interval`` overrides ``[triggerer] reload_interval``. ``owner`` names the daemon
    in the lease table and the statuses (default: :func:`~._leases.daemon_identity`,
    ``host:pid:random``). ``tune_gc`` (for the owner of the process, as :func:`~._process.run_daemon`
    is) pauses the cyclic garbage collector while the first load starts the triggers, then
    freezes what is alive and raises the gen-0 threshold (see :mod:`._gctune`); an embedding
    leaves the process's GC settings alone by default.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        backend: BaseStateBackend | None = None,
        reload_interval: float | None = None,
        owner: str | None = None,
        tune_gc: bool = False,
    ) -> None:
        if reload_interval is None:
            reload_interval = settings.triggerer.reload_interval
        if reload_interval <= 0:
            raise ValueError(f"reload_interval must be positive, got {reload_interval}")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ValueError(f"owner must be a non-empty str, got {owner!r}")
        self.settings = settings
        self.owner = owner or daemon_identity()
        self.watchers_path = Path(settings.triggerer.watchers_path).resolve()
        self.reload_interval = reload_interval
        self.tune_gc = tune_gc
        self._backend = backend
        self._owns_backend = backend is None
        self._runner: TriggerRunner | None = None
        self._loaded: LoadResult | None = None
        self._placement: TriggerPlacement | None = None
        self._leases: LeaseKeeper | None = None
        self._status: DaemonStatusKeeper | None = None
        self._snapshot: dict[str, FileStamp] = {}
        # One load at a time (it may take import_timeout per hung file); bringing the runner
        # in line with it holds the placement's lock too.
        self._load_lock = anyio.Lock()
        self._unapplied: tuple[dict[str, FileStamp], LoadResult] | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._wake = anyio.Event()
        self._processes: ReadingProcesses | None = None

    def __repr__(self) -> str:
        placement = self._placement
        running, wanted = (len(placement.running), len(placement.wanted)) if placement else (0, 0)
        return (
            f"<Daemon owner={self.owner!r} watchers_path={str(self.watchers_path)!r} "
            f"triggers={running}/{wanted} open={self._stack is not None}>"
        )

    @property
    def _running(self) -> dict[str, RunningTrigger]:
        return self._placement.running if self._placement is not None else {}

    def lease_renewal_age(self) -> float | None:
        """Seconds since the leases were last claimed or renewed (None before the first)."""
        return self._placement.lease_renewal_age() if self._placement is not None else None

    def unleased(self) -> list[str]:
        """Triggers running here on a lease this daemon no longer holds (``/readyz`` reports
        them until the next heartbeat stops them). Unfenced triggers (a backend without
        leases) never count."""
        return self.placement.unleased()

    @property
    def backend(self) -> BaseStateBackend:
        return _while_open(self._backend)

    @property
    def runner(self) -> TriggerRunner:
        return _while_open(self._runner)

    @property
    def groups(self) -> dict[str, WatcherGroup]:
        """The triggers running here by id, as loaded from the watcher files."""
        return {trigger_id: r.group for trigger_id, r in self._running.items()}

    @property
    def placement(self) -> TriggerPlacement:
        """Which loaded triggers run here (see :mod:`._placement`)."""
        return _while_open(self._placement)

    @property
    def leases(self) -> LeaseKeeper:
        return _while_open(self._leases)

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RuntimeError("this Daemon is already running")
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            if self._backend is None:
                self._backend = open_state_backend(self.settings)
                name_sessions(self._backend, self.owner, self.settings.triggerer.lease_seconds)
            if self._owns_backend:
                await stack.enter_async_context(self._backend)
            stack.callback(self._forget)
            triggerer = self.settings.triggerer
            self._leases = LeaseKeeper(
                self._backend,
                self.owner,
                triggerer.lease_seconds,
                margin=triggerer.lease_margin_seconds,
            )
            # Released once the runner below has stopped every trigger, before the store closes.
            stack.push_async_callback(self._leases.release_all)
            # Renewed from a thread too, until the runner has stopped every trigger: a loop
            # busy starting or cancelling thousands of them cannot make the renewal late.
            await stack.enter_async_context(self._leases.kept_alive(triggerer.lease_renew_interval))
            self._status = DaemonStatusKeeper(
                self._backend,
                self.owner,
                watchers_path=self.watchers_path,
                heartbeat=triggerer.heartbeat_interval,
                # A status row is saved every heartbeat: stale once three of them were missed
                # (or the lease's time to live, when longer).
                lease_ttl=max(triggerer.lease_seconds, 3 * triggerer.heartbeat_interval),
                settings={  # what `watchkeeper status` shows: this daemon's, not the reader's
                    "heartbeat_interval": triggerer.heartbeat_interval,
                    "lease_renew_interval": triggerer.lease_renew_interval,
                    "lease_ttl": triggerer.lease_seconds,
                    "reload_interval": self.reload_interval,
                },
            )
            stack.push_async_callback(self._status.forget)
            self._runner = await stack.enter_async_context(
                TriggerRunner(self._backend, runner_config(self.settings, owner=self.owner))
            )
            self._runner.store_health.add_recovery_hook(self._renew_after_outage)
            # Read before the first load, so a watcher paused before a restart stays paused.
            controls = ControlsTracker(self._backend)
            await controls.refresh()
            self._placement = TriggerPlacement(
                self._runner,
                self._leases,
                self.settings.triggerer.capacity,
                backend=self._backend,
                controls=controls,
            )
            # A process to read the watcher files is started ahead of each load.
            self._processes = await stack.enter_async_context(ReadingProcesses())
            self._snapshot = await anyio.to_thread.run_sync(scan_watchers_path, self.watchers_path)
            # The node lease is renewed while the first load starts thousands of triggers.
            async with anyio.create_task_group() as boot:
                boot.start_soon(self._renew_while_starting, triggerer.lease_renew_interval)
                if self.tune_gc:
                    raise_gen0_threshold()
                    with startup_gc():
                        report = await self.reload()
                else:
                    report = await self.reload()
                boot.cancel_scope.cancel()
            await self._status.prune(self._running, self.placement.wanted)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)  # runs first on exit: stop taking work
            tg.start_soon(self._reload_loop)
            heartbeat = self.settings.triggerer.heartbeat_interval
            claimed, to_apply = anyio.create_memory_object_stream[None](1)
            tg.start_soon(self._lease_loop, triggerer.lease_renew_interval, claimed)
            tg.start_soon(self._reconcile_loop, to_apply)
            if self._leases.supported:
                tg.start_soon(self._release_listener)
                tg.start_soon(self._deadline_loop, triggerer.lease_renew_interval)
            tg.start_soon(self._status_loop, heartbeat)
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
            owner=self.owner,
            lease_ttl=self.settings.triggerer.lease_seconds,
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
            # First our loops stop (no more reloads, GC or claims), then the runner cancels
            # the triggers within stop_grace and saves their statuses, then the leases are
            # released, then the backend closes.
            await stack.__aexit__(exc_type, exc, tb)
        log.info("daemon_stopped", triggers=triggers)
        return None

    def _forget(self) -> None:
        self._runner = None
        self._leases = None
        self._placement = None
        self._status = None
        self._loaded = None
        if self._owns_backend:
            self._backend = None

    # -- reloading -------------------------------------------------------------------------------

    async def reload(self) -> ReloadReport:
        """Load the watchers path again and bring the running triggers in line with it.

        The files are read first, without the lock the lease loop's reconciles take (a file
        may take ``import_timeout`` to be refused); only bringing the runner in line holds it.
        """
        return await self._reload(None)

    async def _reload(self, snapshot: dict[str, FileStamp] | None) -> ReloadReport:
        """:meth:`reload`; with the scan ``snapshot`` the files were read at, a retry after
        a failed apply (the store unreachable, say) reuses what was read if nothing changed."""
        async with self._load_lock:
            refused_before = self._loaded.errors if self._loaded is not None else None
            unapplied = self._unapplied
            if snapshot is not None and unapplied is not None and unapplied[0] == snapshot:
                result = unapplied[1]
            else:
                triggerer = self.settings.triggerer
                result = await aload_watchers(
                    self.watchers_path,
                    allowed_modules=triggerer.allowed_trigger_modules or None,
                    previous=self._loaded,
                    import_timeout=triggerer.import_timeout,
                    processes=self._processes,
                )
            try:
                async with self.placement.lock:
                    report = await self._apply(result)
            except Exception:
                self._unapplied = None if snapshot is None else (snapshot, result)
                raise
            self._unapplied = None
        if result.errors != refused_before:  # else the heartbeat's next save will do
            await self.save_daemon_status()  # what was refused changed
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

    async def _apply(self, result: LoadResult) -> ReloadReport:
        """Register, start, stop and deactivate to match ``result``; call under the lock."""
        report = ReloadReport(errors=len(result.errors))
        backend, placement = self.backend, self.placement
        if result.assets:
            await require_asset_registry(backend).aregister_assets(list(result.assets))
        await placement.apply_load(result.groups, report)
        # After the reconcile stopped the triggers of removed files, their assets go.
        before = {a.name for a in self._loaded.assets} if self._loaded else set()
        for name in sorted(before - {a.name for a in result.assets}):
            if await require_asset_registry(backend).adeactivate_asset(name):
                report.deactivated.append(name)
                log.info("asset_deactivated", asset=name)
        gone = [t for t in report.stopped if t not in placement.wanted]
        if gone and isinstance(backend, StatusTable):
            await backend.adelete_trigger_status(gone)
        self._loaded = result
        return report

    # -- daemon status -----------------------------------------------------------------------------

    async def _status_loop(self, interval: float) -> None:
        """Every heartbeat: save the daemon's heartbeat row (``watchkeeper status`` reads it)."""
        while True:
            await anyio.sleep(interval)
            await self.save_daemon_status()

    async def save_daemon_status(self) -> None:
        """Save this daemon's heartbeat row (owner, heartbeat time, lease time to live, the
        definitions its last load refused). Advisory: bounded, and never raises."""
        if self._status is not None:
            await self._status.save(self._loaded.errors if self._loaded else ())

    async def _reload_loop(self) -> None:
        health = self.runner.store_health
        while True:
            await anyio.sleep(self.reload_interval)
            try:
                current = await anyio.to_thread.run_sync(scan_watchers_path, self.watchers_path)
                if current == self._snapshot or not health.available:
                    continue
                await self._reload(current)
            except Exception as exc:  # noqa: BLE001 - a failed reload is retried next poll
                if health.report(exc) is None:  # an outage is logged once, by the health
                    log.error("watchers_reload_failed", error=describe_error(exc))
                continue
            self._snapshot = current

    # -- garbage collection ----------------------------------------------------------------------

    async def collect_garbage(self) -> GcReport:
        """One GC pass with the ``[state_store]`` and ``[events]`` retentions and batch size."""
        store, events = self.settings.state_store, self.settings.events
        report = await require_garbage_collector(self.backend).acollect_garbage(
            default_retention_days=store.default_retention_days,
            batch_size=store.state_cleanup_batch_size,
            event_retention_days=events.retention_days,
            dedup_retention_days=events.dedup_retention_days,
        )
        log.info(
            "gc_done",
            expired=len(report.expired),
            retention=len(report.retention),
            orphaned=len(report.orphaned),
            events=report.events,
        )
        return report

    async def _gc_loop(self, interval: float) -> None:
        health = self.runner.store_health
        while True:
            await anyio.sleep(interval)
            if not health.available:
                continue
            try:
                await self.collect_garbage()
                if self._status is not None:
                    await self._status.prune(self._running, self.placement.wanted)
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                if health.report(exc) is None:  # an outage is logged once, by the health
                    log.error("gc_failed", error=describe_error(exc))


def name_sessions(backend: BaseStateBackend, owner: str, lease_seconds: float) -> None:
    """Name a PostgreSQL backend's sessions after the daemon (``pg_stat_activity``), and let
    the server end one left idle inside a transaction for the lease's time to live (at least
    5 s): a paused daemon then cannot hold the rows it locked, and with them its fenced
    leases, much past its node lease. Call before it opens."""
    if isinstance(backend, PostgresStateBackend):
        idle = max(lease_seconds, 5.0)
        backend.server_settings.setdefault(
            "application_name", f"watchkeeper triggerer {owner}"[:63]
        )
        backend.server_settings.setdefault(
            "idle_in_transaction_session_timeout", f"{int(idle * 1000)}ms"
        )


def _while_open(part: _T | None) -> _T:
    """A part the daemon holds only while it is open (its backend, runner, leases...)."""
    if part is None:
        raise RuntimeError("the daemon is not open")
    return part
