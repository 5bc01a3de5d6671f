"""The daemon's own status row, and pruning the rows nobody refreshes any more.

Every heartbeat the daemon saves its row (owner, start and heartbeat times, lease time to
live, the definitions its last load refused): what ``watchkeeper status`` reads to tell a
live daemon from a dead one. A clean exit removes the row. Saving is advisory: bounded in
time, and a failure is logged, never raised. A backend without a daemon table
(:class:`~watchkeeper.store.protocols.DaemonTable`) keeps no row, and one without a status
table (:class:`~watchkeeper.store.protocols.StatusTable`) has no trigger rows to prune.

:meth:`DaemonStatusKeeper.prune` forgets the rows of daemons that stopped refreshing theirs,
and the status rows of triggers no daemon runs any more.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import (
    DaemonStatus,
    RefusedDefinition,
    get_logger,
)

from .._core import describe_error
from ._loader import WatcherError

__all__ = ["DaemonStatusKeeper"]

log = get_logger(__name__)

_STATUS_SAVE_TIMEOUT = 5.0


class DaemonStatusKeeper:
    """Saves, forgets and prunes status rows for the daemon ``owner`` on ``backend``."""

    def __init__(
        self,
        backend: BaseStateBackend,
        owner: str,
        *,
        watchers_path: Path,
        heartbeat: float,
        lease_ttl: float,
        settings: Mapping[str, float] | None = None,
    ) -> None:
        self.backend = backend
        self.owner = owner
        self.watchers_path = watchers_path
        self.heartbeat = heartbeat
        self.lease_ttl = lease_ttl
        self.settings = dict(settings or {})
        self.started_at = backend.clock()

    async def save(self, refused: Sequence[WatcherError]) -> None:
        """Save this daemon's heartbeat row. Advisory: bounded, and never raises."""
        table = self.backend.services.status
        if table is None:
            return
        status = DaemonStatus(
            owner=self.owner,
            started_at=self.started_at,
            heartbeat_at=self.backend.clock(),
            lease_ttl=self.lease_ttl,
            watchers_path=str(self.watchers_path).encode(errors="replace").decode(),
            refused=tuple(RefusedDefinition(e.file, e.watcher, e.reason) for e in refused),
            settings=self.settings,
        )
        with anyio.move_on_after(_STATUS_SAVE_TIMEOUT) as scope:
            try:
                await table.asave_daemon_status(status)
            except Exception as exc:  # noqa: BLE001 - a status is advisory; never fatal
                log.warning("daemon_status_save_failed", error=describe_error(exc))
        if scope.cancelled_caught:
            log.warning("daemon_status_save_failed", error="timed out")

    async def forget(self) -> None:
        """At a clean exit: remove this daemon's row (its triggers' rows say ``stopped``)."""
        table = self.backend.services.status
        if table is None:
            return
        with anyio.move_on_after(_STATUS_SAVE_TIMEOUT, shield=True):
            try:
                await table.adelete_daemon_status([self.owner])
            except Exception as exc:  # noqa: BLE001 - advisory; pruned by others later
                log.warning("daemon_status_save_failed", error=describe_error(exc))

    async def prune(self, running: Collection[str], wanted: Collection[str] = ()) -> None:
        """Forget the rows of dead daemons and of triggers that no daemon runs any more.

        A row of a trigger this daemon does not run (``running``) is stale when it says
        ``stopped`` (saved by a daemon that exited) or has not been refreshed for several
        heartbeats (its daemon was killed). Rows that other live daemons keep refreshing stay,
        and so do the ``paused`` rows of triggers still loaded (``wanted``).
        """
        silence = timedelta(seconds=3 * self.heartbeat + 30)
        cutoff = datetime.now(UTC) - silence
        backend = self.backend
        if backend.services.status is not None:
            daemons = await backend.status.alist_daemon_status()
            silent = backend.clock() - silence  # stamped with the backend's clock
            dead = [
                d.owner
                for d in daemons
                if d.owner != self.owner
                and d.heartbeat_at + timedelta(seconds=d.lease_ttl) < silent
            ]
            if dead:
                await backend.status.adelete_daemon_status(dead)
                log.info("daemon_status_pruned", owners=dead)
        if backend.services.status is None:
            return
        rows = await backend.status.alist_trigger_status()
        stale = [
            r.trigger_id
            for r in rows
            if r.trigger_id not in running
            and (r.state == "stopped" or r.updated_at is None or r.updated_at < cutoff)
            and not (r.state == "paused" and r.trigger_id in wanted)
        ]
        if stale:
            await backend.status.adelete_trigger_status(stale)
            log.info("trigger_status_pruned", trigger_ids=stale)
