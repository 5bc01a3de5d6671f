"""The daemon: :class:`Daemon`, its lifecycle, composing the parts that do its work.

A :class:`Daemon` opens the store, its leases, its status row and a
:class:`~watchkeeper.triggerer.runtime.TriggerRunner`, loads the watchers path once, then runs
its loops until it is closed: reload (follow the files: :mod:`._reloads`), leases and
reconcile (which triggers run here: :mod:`._lease_loops`), status (the heartbeat row:
:mod:`._status`) and GC (:mod:`._collect`). Closing stops the loops, then the triggers,
releases the leases and closes the store. :func:`~._process.run_daemon` is the same daemon as
a process, with signals.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
from watchkeeper.store import BaseStateBackend, open_state_backend
from watchkeeper.store.protocols import (
    GcReport,
    get_logger,
)

from .._core import AsyncService
from ..runtime import RunnerConfig, SupervisionSettings, TriggerRunner
from ..settings import DEFAULT_RELOAD_INTERVAL, Settings
from ._collect import collect_garbage, collect_garbage_every
from ._controls import ControlsTracker
from ._evaluate import ReadingProcesses
from ._gctune import raise_gen0_threshold, startup_gc
from ._lease_loops import DaemonLeases
from ._leases import LeaseKeeper, daemon_identity
from ._loader import LoadResult, WatcherGroup
from ._placement import ReloadReport, TriggerPlacement
from ._reconcile import RunningTrigger
from ._reloads import Reloads
from ._status import DaemonStatusKeeper

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


class Daemon(DaemonLeases, AsyncService):
    """Runs the triggers defined under ``[triggerer] watchers_path`` until it is exited
    (``async with Daemon(settings) as daemon: ...``).

    :param settings: the whole configuration (store, ``[triggerer]``, logging).
    :param backend: a backend the embedding opened itself (the daemon then neither opens nor
        closes it); by default the daemon opens the one the settings configure.
    :param reload_interval: seconds between two looks at the watcher files (default:
        ``[triggerer] reload_interval``).
    :param owner: the daemon's name in the lease table and the statuses (default:
        ``host:pid:random``).
    :param tune_gc: for the owner of the process, as :func:`~._process.run_daemon` is: pause
        the cyclic garbage collector while the first load starts the triggers, then freeze
        what is alive and raise the gen-0 threshold (see :mod:`._gctune`); an embedding
        leaves the process's GC settings alone by default.
    :raises ValueError: a reload interval that is not positive, or an empty owner.
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
        self._placement: TriggerPlacement | None = None
        self._leases: LeaseKeeper | None = None
        self._status: DaemonStatusKeeper | None = None
        self._reloads: Reloads | None = None
        self._boot_report: ReloadReport | None = None
        self._wake = anyio.Event()

    def __repr__(self) -> str:
        placement = self._placement
        running, wanted = (len(placement.running), len(placement.wanted)) if placement else (0, 0)
        return (
            f"<Daemon owner={self.owner!r} watchers_path={str(self.watchers_path)!r} "
            f"triggers={running}/{wanted} open={self.is_running}>"
        )

    @property
    def _loaded(self) -> LoadResult | None:
        """What the last applied load found (None before the first, or once closed)."""
        return self._reloads.loaded if self._reloads is not None else None

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

    async def _aopen(self, resources: contextlib.AsyncExitStack) -> None:
        """Open, in order: the store, the leases, the status row, the runner, the placement;
        then load the watchers path once. Each part pushes its release on ``resources``, so
        closing releases them in reverse: the runner stops the triggers, then the leases are
        released, then the store closes."""
        backend = await self._open_backend(resources)
        resources.callback(self._forget)
        self._leases = await self._hold_leases(backend, resources)
        self._status = self._status_keeper(backend)
        resources.push_async_callback(self._status.forget)
        self._runner = await resources.enter_async_context(
            TriggerRunner(backend, runner_config(self.settings, owner=self.owner))
        )
        self._runner.store_health.add_recovery_hook(self._renew_after_outage)
        # Read before the first load, so a watcher paused before a restart stays paused.
        controls = ControlsTracker(backend)
        await controls.refresh()
        self._placement = TriggerPlacement(
            self._runner,
            self._leases,
            self.settings.triggerer.capacity,
            backend=backend,
            controls=controls,
        )
        self._reloads = Reloads(
            self.watchers_path,
            self.settings.triggerer,
            backend=backend,
            placement=self._placement,
            # A process to read the watcher files is started ahead of each load.
            processes=await resources.enter_async_context(ReadingProcesses()),
            loaded_changed=self.save_daemon_status,
        )
        self._boot_report = await self._first_load()
        await self._status.prune(self._running, self.placement.wanted)

    async def _astart(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start the loops (see the module docstring), then log that the daemon serves."""
        triggerer = self.settings.triggerer
        task_group.start_soon(
            _while_open(self._reloads).follow, self.reload_interval, self.runner.store_health
        )
        claimed, to_apply = anyio.create_memory_object_stream[None](1)
        task_group.start_soon(self._lease_loop, triggerer.lease_renew_interval, claimed)
        task_group.start_soon(self._reconcile_loop, to_apply)
        if self.leases.supported:
            task_group.start_soon(self._release_listener)
            task_group.start_soon(self._deadline_loop, triggerer.lease_renew_interval)
        task_group.start_soon(self._status_loop, triggerer.heartbeat_interval)
        if triggerer.gc_interval > 0:
            task_group.start_soon(
                functools.partial(
                    collect_garbage_every,
                    triggerer.gc_interval,
                    self.backend,
                    self.settings,
                    health=self.runner.store_health,
                    status=_while_open(self._status),
                    placement=self.placement,
                )
            )
        loaded = self._loaded
        log.info(
            "daemon_started",
            watchers_path=str(self.watchers_path),
            triggers=len(self._running),
            assets=len(loaded.assets) if loaded else 0,
            refused=self._boot_report.errors if self._boot_report else 0,
            backend=repr(self._backend),
            pid=os.getpid(),
            owner=self.owner,
            lease_ttl=triggerer.lease_seconds,
        )

    async def aclose(self) -> None:
        """Stop: first the loops (no more reloads, GC or claims), then the runner cancels the
        triggers within ``stop_grace`` and saves their statuses, then the leases are
        released, then the store closes."""
        was_running, triggers = self.is_running, len(self._running)
        await super().aclose()
        if was_running:
            log.info("daemon_stopped", triggers=triggers)

    async def _open_backend(self, resources: contextlib.AsyncExitStack) -> BaseStateBackend:
        """The store given to the daemon, or the one the settings configure (opened here)."""
        if self._backend is None:
            self._backend = open_state_backend(self.settings)
            self._backend.configure_sessions(
                f"watchkeeper triggerer {self.owner}", self.settings.triggerer.lease_seconds
            )
        if self._owns_backend:
            await resources.enter_async_context(self._backend)
        return self._backend

    async def _hold_leases(
        self, backend: BaseStateBackend, resources: contextlib.AsyncExitStack
    ) -> LeaseKeeper:
        """The daemon's leases, released once the runner has stopped every trigger."""
        triggerer = self.settings.triggerer
        leases = LeaseKeeper(
            backend, self.owner, triggerer.lease_seconds, margin=triggerer.lease_margin_seconds
        )
        resources.push_async_callback(leases.release_all)
        # Renewed from a thread too, until the runner has stopped every trigger: a loop busy
        # starting or cancelling thousands of them cannot make the renewal late.
        await resources.enter_async_context(leases.kept_alive(triggerer.lease_renew_interval))
        return leases

    def _status_keeper(self, backend: BaseStateBackend) -> DaemonStatusKeeper:
        """The keeper of this daemon's heartbeat row."""
        triggerer = self.settings.triggerer
        return DaemonStatusKeeper(
            backend,
            self.owner,
            watchers_path=self.watchers_path,
            heartbeat=triggerer.heartbeat_interval,
            # A status row is saved every heartbeat: stale once three of them were missed (or
            # the lease's time to live, when longer).
            lease_ttl=max(triggerer.lease_seconds, 3 * triggerer.heartbeat_interval),
            settings={  # what `watchkeeper status` shows: this daemon's, not the reader's
                "heartbeat_interval": triggerer.heartbeat_interval,
                "lease_renew_interval": triggerer.lease_renew_interval,
                "lease_ttl": triggerer.lease_seconds,
                "reload_interval": self.reload_interval,
            },
        )

    async def _first_load(self) -> ReloadReport:
        """Load the watchers path and start its triggers, renewing the node lease meanwhile
        (starting thousands of triggers takes a while), under the start-up GC tuning when
        asked."""
        reloads = _while_open(self._reloads)
        async with anyio.create_task_group() as boot:
            boot.start_soon(
                self._renew_while_starting, self.settings.triggerer.lease_renew_interval
            )
            if self.tune_gc:
                raise_gen0_threshold()
                with startup_gc():
                    report = await reloads.first()
            else:
                report = await reloads.first()
            boot.cancel_scope.cancel()
        return report

    def _forget(self) -> None:
        self._runner = None
        self._leases = None
        self._placement = None
        self._status = None
        self._reloads = None
        if self._owns_backend:
            self._backend = None

    # -- the loops' work, for embeddings and tests ------------------------------------------

    async def reload(self) -> ReloadReport:
        """Load the watchers path again and bring the running triggers in line with it (see
        :class:`~._reloads.Reloads`)."""
        return await _while_open(self._reloads).reload()

    async def save_daemon_status(self) -> None:
        """Save this daemon's heartbeat row (owner, heartbeat time, lease time to live, the
        definitions its last load refused). Advisory: bounded, and never raises."""
        if self._status is not None:
            await self._status.save(self._loaded.errors if self._loaded else ())

    async def collect_garbage(self) -> GcReport:
        """One GC pass with the ``[state_store]`` and ``[events]`` retentions and batch size."""
        return await collect_garbage(self.backend, self.settings)

    async def _status_loop(self, interval: float) -> None:
        """Every heartbeat: save the daemon's heartbeat row (``watchkeeper status`` reads it)."""
        while True:
            await anyio.sleep(interval)
            await self.save_daemon_status()


def _while_open(part: _T | None) -> _T:
    """A part the daemon holds only while it is open (its backend, runner, leases...)."""
    if part is None:
        raise RuntimeError("the daemon is not open")
    return part
