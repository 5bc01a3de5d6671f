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
- the **lease loop** claims, every ``[triggerer] heartbeat_interval`` seconds, the leases of
  every trigger loaded (see :mod:`._leases`). It never waits for a reload: the **reconcile
  loop** then starts the triggers whose lease was got, with the lease's token as their fence,
  and stops those whose lease another daemon holds now (or that stopped themselves because
  the store refused a write of theirs as stale). Leases last ``[triggerer] lease_ttl``
  seconds (three heartbeats by default), so the triggers of a daemon that died move to
  another one that long after. Several daemons on one PostgreSQL database thus share the
  watchers, each run by one daemon at a time; a single daemon (SQLite) holds every lease;
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

:func:`run_daemon` adds the signal handling of the ``watchkeeper triggerer`` command: on
SIGTERM or SIGINT it stops taking work (no more reloads, GC passes or claims), lets the runner
cancel the triggers within ``stop_grace`` and flush their status, releases its leases (so
another daemon, or this one restarted, takes the triggers over at once), closes the store and
returns. A signal while the daemon is still starting cancels the start-up.

A restarted daemon resumes every watcher from its stored watermark: triggers read it from
their asset state, which the store keeps across restarts and ``kill -9``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio
import anyio.abc
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from watchkeeper.store import BaseStateBackend, DatabaseFileRemovedError, open_state_backend
from watchkeeper.store.backend import (
    DaemonStatus,
    DaemonTable,
    GcReport,
    RefusedDefinition,
    StatusTable,
    get_logger,
    require_asset_registry,
    require_garbage_collector,
)

from ._config import SupervisionSettings
from ._evaluate import aload_watchers
from ._gctune import raise_gen0_threshold, startup_gc
from ._leases import LeaseKeeper, daemon_identity
from ._loader import LoadResult, WatcherGroup, scan_watchers_path
from ._supervisor import describe_error
from ._watcher_controls import ControlsTracker
from .errors import TriggererError
from .runner import RunnerConfig, TriggerRunner, WatchSpec
from .settings import DEFAULT_RELOAD_INTERVAL, Settings

__all__ = ["DEFAULT_RELOAD_INTERVAL", "Daemon", "ReloadReport", "run_daemon"]

log = get_logger(__name__)

_STATUS_SAVE_TIMEOUT = 5.0

_Claim = tuple[int, list[str], dict[str, int] | None]
"""One claim of leases: its sequence number, the ids asked for, the tokens got."""


@dataclass(slots=True)
class ReloadReport:
    """What one reload changed (trigger ids and asset names)."""

    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    deactivated: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)
    errors: int = 0


def runner_config(settings: Settings, *, owner: str | None = None) -> RunnerConfig:
    """The runner's configuration: the supervision keys of ``[triggerer]``, as they are."""
    t = settings.triggerer
    shared = {name: getattr(t, name) for name in SupervisionSettings.model_fields}
    return RunnerConfig(
        **shared,
        status_interval=t.heartbeat_interval,
        owner=owner or daemon_identity(),
    )


class Daemon:
    """Runs the triggers defined under ``[triggerer] watchers_path`` until it is exited.

    ``backend`` lets an embedding pass a backend it opened itself (the daemon then neither
    opens nor closes it); by default the daemon opens the one the settings configure.
    ``reload_interval`` overrides ``[triggerer] reload_interval``. ``owner`` names the daemon
    in the lease table and the statuses (default: :func:`~._leases.daemon_identity`,
    ``host:pid:random``). ``tune_gc`` (for the owner of the process, as :func:`run_daemon`
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
        self._wanted: dict[str, WatcherGroup] = {}
        self._running: dict[str, WatcherGroup] = {}
        self._tokens: dict[str, int | None] = {}
        self._leases: LeaseKeeper | None = None
        self._controls: ControlsTracker | None = None
        self._renewed_at: float | None = None
        self._retried: set[str] = set()
        self._snapshot: dict[str, tuple[int, int]] = {}
        # _load_lock: one load at a time (it may take import_timeout per hung file);
        # _reload_lock: bringing the runner in line with a load or a claim (short).
        self._load_lock = anyio.Lock()
        self._reload_lock = anyio.Lock()
        self._unapplied: tuple[dict[str, tuple[int, int]], LoadResult] | None = None
        self._claims = 0
        self._last_claim: _Claim | None = None
        self._applied_claim = 0
        self._started_at = datetime.now(UTC)
        self._stack: contextlib.AsyncExitStack | None = None

    def __repr__(self) -> str:
        return (
            f"<Daemon owner={self.owner!r} watchers_path={str(self.watchers_path)!r} "
            f"triggers={len(self._running)}/{len(self._wanted)} open={self._stack is not None}>"
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
        """The triggers running here by id, as loaded from the watcher files."""
        return dict(self._running)

    def lease_renewal_age(self) -> float | None:
        """Seconds since the leases were last claimed or renewed (None before the first)."""
        return None if self._renewed_at is None else time.monotonic() - self._renewed_at

    def unleased(self) -> list[str]:
        """Triggers running here on a lease this daemon no longer holds (``/readyz`` reports
        them until the next heartbeat stops them). Unfenced triggers (a backend without
        leases) never count."""
        held = self.leases.held
        return sorted(t for t, token in self._tokens.items() if token is not None and t not in held)

    @property
    def leases(self) -> LeaseKeeper:
        if self._leases is None:
            raise RuntimeError("the daemon is not open")
        return self._leases

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
            self._leases = LeaseKeeper(
                self._backend, self.owner, self.settings.triggerer.lease_seconds
            )
            # Released once the runner below has stopped every trigger, before the store closes.
            stack.push_async_callback(self._leases.release_all)
            stack.push_async_callback(self._forget_daemon_status)
            self._started_at = self._backend.clock()
            self._runner = await stack.enter_async_context(
                TriggerRunner(self._backend, runner_config(self.settings, owner=self.owner))
            )
            self._runner.store_health.add_recovery_hook(self._renew_after_outage)
            # Read before the first load, so a watcher paused before a restart stays paused.
            self._controls = ControlsTracker(self._backend)
            await self._controls.refresh()
            self._snapshot = await anyio.to_thread.run_sync(scan_watchers_path, self.watchers_path)
            if self.tune_gc:
                raise_gen0_threshold()
                with startup_gc():
                    report = await self.reload()
            else:
                report = await self.reload()
            await self._drop_stale_statuses()
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)  # runs first on exit: stop taking work
            tg.start_soon(self._reload_loop)
            heartbeat = self.settings.triggerer.heartbeat_interval
            claimed, to_apply = anyio.create_memory_object_stream[None](1)
            tg.start_soon(self._lease_loop, heartbeat, claimed)
            tg.start_soon(self._reconcile_loop, to_apply)
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
        self._controls = None
        self._wanted = {}
        self._running = {}
        self._tokens = {}
        self._loaded = None
        self._last_claim = None
        if self._owns_backend:
            self._backend = None

    # -- reloading -------------------------------------------------------------------------------

    async def reload(self) -> ReloadReport:
        """Load the watchers path again and bring the running triggers in line with it.

        The files are read first, without the lock the lease loop's reconciles take (a file
        may take ``import_timeout`` to be refused); only bringing the runner in line holds it.
        """
        return await self._reload(None)

    async def _reload(self, snapshot: dict[str, tuple[int, int]] | None) -> ReloadReport:
        """:meth:`reload`; with the scan ``snapshot`` the files were read at, a retry after
        a failed apply (the store unreachable, say) reuses what was read if nothing changed."""
        async with self._load_lock:
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
                )
            try:
                async with self._reload_lock:
                    report = await self._apply(result)
            except Exception:
                self._unapplied = None if snapshot is None else (snapshot, result)
                raise
            self._unapplied = None
        await self.save_daemon_status()  # what was refused may have changed
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
        backend, runner = self.backend, self.runner
        if result.assets:
            await require_asset_registry(backend).aregister_assets(list(result.assets))
        self._wanted = {g.trigger_id: g for g in result.groups}
        # A trigger that gave up ("failed") gets a fresh start from any reload, so an
        # operator retries it by touching its file once the source is fixed.
        failed = {s.trigger_id for s in runner.statuses() if s.state == "failed"}
        seq, claimed, tokens = await self._claim()
        self._applied_claim = seq
        self._retried.clear()  # every failed trigger restarts anyway
        await self._reconcile(report, claimed, tokens, failed)
        # After the reconcile stopped the triggers of removed files, their assets go.
        before = {a.name for a in self._loaded.assets} if self._loaded else set()
        for name in sorted(before - {a.name for a in result.assets}):
            if await require_asset_registry(backend).adeactivate_asset(name):
                report.deactivated.append(name)
                log.info("asset_deactivated", asset=name)
        gone = [t for t in report.stopped if t not in self._wanted]
        if gone and isinstance(backend, StatusTable):
            await backend.adelete_trigger_status(gone)
        self._loaded = result
        return report

    async def _to_claim(self) -> list[str]:
        """The loaded triggers to claim: those running here unchanged, then as many others
        as ``capacity`` leaves room for (a lease taken beyond it would only keep the trigger
        from a daemon that has room), skipping those another live daemon holds."""
        keep = sorted(
            t
            for t, group in self._running.items()
            if t in self._wanted and self._wanted[t].key == group.key and not self._paused(group)
        )
        room = max(self.settings.triggerer.capacity - len(keep), 0)
        others = [
            t
            for t in sorted(self._wanted)
            if t not in self._running and not self._paused(self._wanted[t])
        ]
        if others:
            # Skips leases another live daemon holds; frees those of a dead local daemon.
            others = await self.leases.free_among(others)
        return keep + others[:room]

    async def _reconcile(
        self,
        report: ReloadReport,
        claimed: list[str],
        tokens: dict[str, int] | None,
        restart: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Bring the runner in line with the loaded triggers and the leases of ``claimed``.

        ``tokens`` is what claiming ``claimed`` returned (``None``: no leases, run everything).
        A trigger runs here while it is loaded unchanged and, if it was claimed, its lease is
        held with the token it was started with; otherwise it is stopped, and started again
        (with the new token) when it is loaded and its lease is held. Triggers in ``restart``
        (failed ones, on a reload) and those that stopped on a refused write start afresh.
        Leases held for triggers that do not run here are released. Call under the lock.
        """
        runner = self.runner
        asked = set(claimed)
        dead = {s.trigger_id for s in runner.statuses() if s.state == "stopped"}

        def token_of(trigger_id: str) -> tuple[bool, int | None]:
            """(may run here, fence token) by the claim; unclaimed ids keep what they run with."""
            if tokens is None:
                return True, None
            if trigger_id not in asked:
                return trigger_id in self._running, self._tokens.get(trigger_id)
            return trigger_id in tokens, tokens.get(trigger_id)

        for trigger_id, group in list(self._running.items()):
            held, token = token_of(trigger_id)
            wanted = self._wanted.get(trigger_id)
            if (
                held
                and wanted is not None
                and wanted.key == group.key
                and token == self._tokens.get(trigger_id)
                and trigger_id not in restart
                and trigger_id not in dead
                and not self._paused(group)
            ):
                continue
            if held and self._paused(group):
                await self._pause_trigger(trigger_id)
            else:
                # A trigger another daemon holds now is theirs, status row included.
                await runner.stop_trigger(trigger_id, save_status=held)
            del self._running[trigger_id]
            self._tokens.pop(trigger_id, None)
            report.stopped.append(trigger_id)
        for trigger_id, group in self._wanted.items():
            held, token = token_of(trigger_id)
            if trigger_id in self._running or not held or self._paused(group):
                continue
            try:
                await runner.start_trigger(_spec(group, token))
            except (TriggererError, ValueError) as exc:  # over capacity: retried next claim
                report.not_started.append(trigger_id)
                log.error("trigger_not_started", trigger_id=trigger_id, reason=str(exc))
                continue
            self._running[trigger_id] = group
            self._tokens[trigger_id] = token
            report.started.append(trigger_id)
        idle = [t for t in self.leases.held if t not in self._running]
        if idle:  # removed from the files, or not startable here: let another daemon have it
            await self.leases.release(idle)

    async def renew_leases(self) -> ReloadReport:
        """One heartbeat's work: renew and take leases, then start and stop triggers to match.

        It is public so that an embedding (or a test) can run a heartbeat at a moment of its
        choosing. The lease loop does the same in two tasks, so that renewing never waits for
        a reload or for triggers being stopped.
        """
        await self._claim()
        return await self._apply_last_claim()

    async def _claim(self) -> _Claim:
        """Renew and take the leases of the triggers to run here (never takes a lock).

        The watcher controls are read first: paused watchers are not claimed, and retries
        asked since the last read are kept for the next apply.
        """
        self._retried |= await self._refresh_controls()
        claimed = await self._to_claim()
        tokens = await self.leases.claim(claimed)
        self._renewed_at = time.monotonic()
        self._claims += 1
        self._last_claim = (self._claims, claimed, tokens)
        return self._last_claim

    async def _apply_last_claim(self) -> ReloadReport:
        """Start and stop triggers to match the latest claim, unless a reload applied a newer
        one meanwhile."""
        report = ReloadReport()
        async with self._reload_lock:
            claim = self._last_claim
            if claim is None or claim[0] <= self._applied_claim:
                return report
            seq, claimed, tokens = claim
            self._applied_claim = seq
            await self._reconcile(report, claimed, tokens, self._take_retries())
        if report.started or report.stopped or report.not_started:
            log.info(
                "leases_changed",
                triggers=len(self._running),
                started=report.started,
                stopped=report.stopped,
                not_started=report.not_started,
            )
        return report

    # -- watcher controls (pause, resume, retry: rows in the store) ---------------------------------

    def _paused(self, group: WatcherGroup) -> bool:
        controls = self._controls
        return controls is not None and controls.is_paused(group.watchers or (group.trigger_id,))

    def _take_retries(self) -> set[str]:
        """The failed triggers whose watcher an operator retried since the last apply."""
        retried, self._retried = self._retried, set()
        if not retried:
            return set()
        return {
            s.trigger_id
            for s in self.runner.statuses()
            if s.state == "failed" and any(w in retried for w in s.watchers or (s.trigger_id,))
        }

    async def _refresh_controls(self) -> set[str]:
        """Read the control rows; return the watcher names retried since the last read."""
        if self._controls is None:
            return set()
        return await self._controls.refresh()

    async def _pause_trigger(self, trigger_id: str) -> None:
        """Stop a trigger whose watcher an operator paused; its status row says ``paused``."""
        runner = self.runner
        before = next((s for s in runner.statuses() if s.trigger_id == trigger_id), None)
        await runner.stop_trigger(trigger_id, save_status=False)
        log.info("watcher_paused", trigger_id=trigger_id)
        if before is not None and isinstance(self.backend, StatusTable):
            paused = dataclasses.replace(before, state="paused", updated_at=datetime.now(UTC))
            try:
                await self.backend.asave_trigger_status([paused])
            except Exception as exc:  # noqa: BLE001 - a status is advisory
                log.warning("trigger_status_save_failed", error=f"{type(exc).__name__}: {exc}")

    async def _lease_loop(self, interval: float, claimed: MemoryObjectSendStream[None]) -> None:
        """Every heartbeat: check the store is the one opened, claim leases and hand the claim
        to the reconcile loop. Waits on nothing else, so leases are renewed on time however
        long a reload, a trigger's stop or a status save takes."""
        health = self.runner.store_health
        with claimed:
            while True:
                await anyio.sleep(interval)
                await self.verify_store()
                if not health.available:
                    continue  # renewed by the recovery hook, once the store answers again
                try:
                    await self._claim()
                except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
                    if health.report(exc) is None:  # an outage is logged once, by the health
                        log.error("lease_renewal_failed", error=describe_error(exc))
                else:
                    with contextlib.suppress(anyio.WouldBlock):
                        claimed.send_nowait(None)  # one pending is enough: it takes the latest

    async def verify_store(self) -> None:
        """Check, as every heartbeat does, that the store is still the one opened.

        Raises :class:`~watchkeeper.store.DatabaseFileRemovedError` (logged once as
        ``database_file_removed``) when the SQLite file was removed or replaced: the daemon
        then stops with that error instead of committing into a file nobody can read back.
        """
        try:
            await self.backend.averify()
        except Exception as exc:
            if isinstance(self.runner.store_health.report(exc), DatabaseFileRemovedError):
                raise
            log.error("store_verify_failed", error=describe_error(exc))

    async def _renew_after_outage(self) -> None:
        """The store answers again: renew the leases (they may have lapsed meanwhile) before
        the triggers write again, so none of them meets a lapsed fence."""
        await self.renew_leases()

    async def _reconcile_loop(self, to_apply: MemoryObjectReceiveStream[None]) -> None:
        health = self.runner.store_health
        with to_apply:
            async for _ in to_apply:
                try:
                    await self._apply_last_claim()
                except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
                    if health.report(exc) is None:
                        log.error("lease_reconcile_failed", error=describe_error(exc))

    # -- daemon status -----------------------------------------------------------------------------

    async def _status_loop(self, interval: float) -> None:
        """Every heartbeat: save the daemon's heartbeat row (``watchkeeper status`` reads it)."""
        while True:
            await anyio.sleep(interval)
            await self.save_daemon_status()

    async def save_daemon_status(self) -> None:
        """Save this daemon's heartbeat row (owner, heartbeat time, lease time to live, the
        definitions its last load refused). Advisory: bounded, and never raises."""
        table = self._backend
        if table is None or not isinstance(table, DaemonTable):
            return
        loaded = self._loaded
        refused = tuple(
            RefusedDefinition(e.file, e.watcher, e.reason)
            for e in (loaded.errors if loaded else ())
        )
        status = DaemonStatus(
            owner=self.owner,
            started_at=self._started_at,
            heartbeat_at=table.clock(),
            lease_ttl=self.settings.triggerer.lease_seconds,
            watchers_path=str(self.watchers_path).encode(errors="replace").decode(),
            refused=refused,
        )
        with anyio.move_on_after(_STATUS_SAVE_TIMEOUT) as scope:
            try:
                await table.asave_daemon_status(status)
            except Exception as exc:  # noqa: BLE001 - a status is advisory; never fatal
                log.warning("daemon_status_save_failed", error=describe_error(exc))
        if scope.cancelled_caught:
            log.warning("daemon_status_save_failed", error="timed out")

    async def _forget_daemon_status(self) -> None:
        """At a clean exit: remove this daemon's row (its triggers' rows say ``stopped``)."""
        table = self._backend
        if table is None or not isinstance(table, DaemonTable):
            return
        with anyio.move_on_after(_STATUS_SAVE_TIMEOUT, shield=True):
            try:
                await table.adelete_daemon_status([self.owner])
            except Exception as exc:  # noqa: BLE001 - advisory; pruned by others later
                log.warning("daemon_status_save_failed", error=describe_error(exc))

    async def _drop_stale_statuses(self) -> None:
        """Forget status rows of triggers that no daemon runs any more.

        A row of a trigger this daemon does not run is stale when it says ``stopped`` (saved by
        a daemon that exited) or has not been refreshed for several heartbeats (its daemon was
        killed). Rows that other live daemons keep refreshing stay.
        """
        heartbeat = self.settings.triggerer.heartbeat_interval
        cutoff = datetime.now(UTC) - timedelta(seconds=3 * heartbeat + 30)
        backend = self.backend
        if isinstance(backend, DaemonTable):
            daemons = await backend.alist_daemon_status()
            # Stamped with the backend's clock, so compared with it.
            silent = backend.clock() - timedelta(seconds=3 * heartbeat + 30)
            dead = [
                d.owner
                for d in daemons
                if d.owner != self.owner
                and d.heartbeat_at + timedelta(seconds=d.lease_ttl) < silent
            ]
            if dead:
                await backend.adelete_daemon_status(dead)
                log.info("daemon_status_pruned", owners=dead)
        if not isinstance(backend, StatusTable):
            return
        rows = await backend.alist_trigger_status()
        stale = [
            r.trigger_id
            for r in rows
            if r.trigger_id not in self._running
            and not (r.state == "paused" and r.trigger_id in self._wanted)
            and (r.state == "stopped" or r.updated_at is None or r.updated_at < cutoff)
        ]
        if stale:
            await backend.adelete_trigger_status(stale)
            log.info("trigger_status_pruned", trigger_ids=stale)

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
                await self._drop_stale_statuses()
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                if health.report(exc) is None:  # an outage is logged once, by the health
                    log.error("gc_failed", error=describe_error(exc))


def _spec(group: WatcherGroup, fence_token: int | None) -> WatchSpec:
    return WatchSpec(
        trigger_id=group.trigger_id,
        trigger=group.trigger,
        assets=group.assets,
        watchers=group.watchers,
        fence_token=fence_token,
    )


async def run_daemon(
    settings: Settings,
    *,
    reload_interval: float | None = None,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """Run the daemon until one of ``signals`` arrives, then shut down cleanly and return.

    A signal that arrives while the daemon is still starting (reading the watcher files,
    opening the store) cancels the start-up, which undoes what it had done.

    Shutting down is bounded: a trigger that swallows every cancellation would otherwise keep
    the process alive forever, so a watchdog thread armed at the signal ends the process
    (exit status 70, log ``daemon_shutdown_stuck``) once ``stop_grace`` and a margin for
    flushing have passed. Whatever had committed stays committed; leases expire on their own.
    """
    watchdog: list[threading.Timer] = []
    started = anyio.Event()
    stop = anyio.Event()
    starting = anyio.CancelScope()

    async def on_signal(received: AsyncIterator[int]) -> None:
        async for signum in received:
            log.info(
                "daemon_stopping", signal=signal.Signals(signum).name, starting=not started.is_set()
            )
            watchdog.append(_arm_shutdown_watchdog(settings.triggerer.stop_grace * 2 + 5))
            if not started.is_set():
                starting.cancel()
            stop.set()
            return

    if settings.api.enabled:
        # The web stack is imported now, before any trigger runs: imported once the daemon
        # runs, it would hold the loop long enough to let short leases lapse.
        importlib.import_module("watchkeeper.triggerer.api")
    error: Exception | None = None
    try:
        with anyio.open_signal_receiver(*signals) as received:
            async with anyio.create_task_group() as tg:
                tg.start_soon(on_signal, received)
                try:
                    with starting:
                        async with (
                            Daemon(settings, reload_interval=reload_interval, tune_gc=True) as d,
                            anyio.create_task_group() as api_tg,
                        ):
                            if settings.api.enabled:
                                await _start_api(api_tg, d)
                            started.set()
                            await stop.wait()
                            api_tg.cancel_scope.cancel()  # the API stops first, then the daemon
                except Exception as exc:  # noqa: BLE001 - re-raised below, outside the group
                    error = exc
                finally:
                    tg.cancel_scope.cancel()
    finally:
        for timer in watchdog:
            timer.cancel()
    if error is not None:
        raise error


async def _start_api(tg: anyio.abc.TaskGroup, daemon: Daemon) -> None:
    """Serve the HTTP API in the daemon's task group; a busy port is logged, and the watchers
    run without it (they matter more than the API)."""
    from .api import ApiListenError, serve_api  # the web stack loads only when it serves

    try:
        await tg.start(
            functools.partial(serve_api, daemon.backend, daemon.settings.api, daemon=daemon)
        )
    except ApiListenError as exc:
        log.error("api_not_started", error=str(exc))


SHUTDOWN_STUCK_EXIT = 70  # EX_SOFTWARE


def _arm_shutdown_watchdog(timeout: float) -> threading.Timer:
    def stuck() -> None:
        log.error("daemon_shutdown_stuck", timeout=timeout, exit_status=SHUTDOWN_STUCK_EXIT)
        os._exit(SHUTDOWN_STUCK_EXIT)

    timer = threading.Timer(timeout, stuck)
    timer.daemon = True
    timer.start()
    return timer
