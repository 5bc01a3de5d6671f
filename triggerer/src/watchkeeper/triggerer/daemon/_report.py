"""The daemons as their heartbeat rows tell (``status``, ``watchers list`` and the HTTP API).

A status row is what a daemon last saved about a trigger; it is true only while that daemon
lives. Each daemon refreshes its own row every heartbeat: once that is older than the
daemon's lease time to live (its leases have lapsed too), the daemon is "stale" and its
watchers "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from watchkeeper.store import BaseStateBackend

__all__ = ["DaemonReport", "daemon_report"]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True, slots=True)
class DaemonReport:
    """The daemons' heartbeat rows as JSON data, and which of them are alive."""

    rows: list[dict[str, Any]]
    live: set[str]
    known: set[str]
    tracked: bool
    """False for a backend without daemon rows: saved states are then taken as they are."""

    def watcher_state(self, state: str, owner: str | None) -> str:
        """A saved watcher state as it is known now: ``unknown`` when its daemon is not alive."""
        if self.tracked and owner not in self.live and (owner in self.known or state != "stopped"):
            return "unknown"
        return state


async def daemon_report(backend: BaseStateBackend) -> DaemonReport:
    """The daemons with their heartbeat age (``status``, ``watchers list`` and the API)."""
    now = backend.clock()
    # Without daemon rows (a custom backend) the saved states are taken as they are.
    tracked = backend.services.status is not None
    daemons = (
        await backend.status.alist_daemon_status() if backend.services.status is not None else []
    )
    live: set[str] = set()
    daemon_rows = []
    for daemon in daemons:
        age = max((now - daemon.heartbeat_at).total_seconds(), 0.0)
        stale = age > daemon.lease_ttl
        if not stale:
            live.add(daemon.owner)
        daemon_rows.append(
            {
                "owner": daemon.owner,
                "state": "stale" if stale else "running",
                "heartbeat_age_seconds": round(age, 3),
                "heartbeat_at": _iso(daemon.heartbeat_at),
                # The daemon's own node lease (its settings, saved with its heartbeat); a row
                # from before they were saved has only the time after which it is stale.
                "lease_ttl_seconds": daemon.settings.get("lease_ttl", daemon.lease_ttl),
                "stale_after_seconds": daemon.lease_ttl,
                "settings": dict(daemon.settings),
                "started_at": _iso(daemon.started_at),
                "watchers_path": daemon.watchers_path,
                "refused": [
                    {"file": r.file, "watcher": r.watcher, "reason": r.reason}
                    for r in daemon.refused
                ],
            }
        )
    return DaemonReport(daemon_rows, live, {daemon.owner for daemon in daemons}, tracked)
