"""Watcher controls as the daemon and the operators see them.

The rows live in the store (:class:`~watchkeeper.store.WatcherControl`): ``watchkeeper
watchers pause|resume|retry`` and the HTTP API write them, and every daemon reads them once per
heartbeat (:class:`ControlsTracker`), so a paused watcher is stopped by whichever daemon runs
it within one heartbeat, is not started by any daemon while paused (also after a restart),
and a ``retry`` restarts a ``failed`` watcher.

:func:`watcher_rows` merges the rows with the saved trigger statuses: what ``watchkeeper
watchers list`` prints and ``GET /api/v1/watchers`` answers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import OperatorControls, WatcherControl

from ._report import daemon_report

__all__ = ["ControlsTracker", "WatcherRow", "controls_of", "unknown_watcher", "watcher_rows"]


def controls_of(backend: BaseStateBackend) -> OperatorControls | None:
    """``backend`` as a controls store, or None when it does not keep controls."""
    return backend.services.controls


class ControlsTracker:
    """The controls one daemon acts on: the paused watcher names, and new retry requests."""

    def __init__(self, backend: BaseStateBackend) -> None:
        self._store = controls_of(backend)
        self.paused: frozenset[str] = frozenset()
        self._seen: dict[str, int] | None = None

    def is_paused(self, watchers: tuple[str, ...]) -> bool:
        return bool(self.paused) and any(name in self.paused for name in watchers)

    async def refresh(self) -> set[str]:
        """Read the rows; return the watcher names retried since the last read.

        The first read only records the counters: a retry asked before this daemon started
        is history (a starting daemon starts every trigger afresh anyway).
        """
        if self._store is None:
            return set()
        rows = await self._store.alist_watcher_controls()
        self.paused = frozenset(row.watcher for row in rows if row.paused)
        counters = {row.watcher: row.retry_seq for row in rows}
        seen, self._seen = self._seen, counters
        if seen is None:
            return set()
        return {name for name, seq in counters.items() if seq > seen.get(name, 0)}


@dataclass(frozen=True, slots=True)
class WatcherRow:
    """One watcher as an operator sees it: its status merged with its control row."""

    watcher: str
    trigger_id: str | None
    assets: tuple[str, ...]
    state: str
    daemon: str | None
    events: int
    failures: int
    last_event_at: datetime | None
    last_error: str | None
    paused: bool
    updated_at: datetime | None

    def last_event_age(self, now: datetime) -> float | None:
        if self.last_event_at is None:
            return None
        return max((now - self.last_event_at).total_seconds(), 0.0)

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        now = now or datetime.now(UTC)
        age = self.last_event_age(now)
        return {
            "watcher": self.watcher,
            "trigger_id": self.trigger_id,
            "assets": list(self.assets),
            "state": self.state,
            "daemon": self.daemon,
            "events": self.events,
            "failures": self.failures,
            "last_event_at": None if self.last_event_at is None else self.last_event_at.isoformat(),
            "last_event_age_seconds": None if age is None else round(age, 3),
            "last_error": self.last_error,
            "paused": self.paused,
        }


def _state(status_state: str | None, paused: bool) -> str:
    if not paused:
        return status_state or "unknown"
    if status_state in ("running", "backing_off"):
        return "pausing"  # asked; the daemon stops it at its next heartbeat
    return "paused"


async def watcher_rows(backend: BaseStateBackend) -> list[WatcherRow]:
    """Every watcher a daemon reported or an operator controlled, ordered by name; the state
    of a watcher whose daemon is no longer alive is ``unknown``."""
    daemons = await daemon_report(backend)
    statuses = (
        await backend.status.alist_trigger_status() if backend.services.status is not None else []
    )
    store = controls_of(backend)
    controls: dict[str, WatcherControl] = {}
    if store is not None:
        controls = {row.watcher: row for row in await store.alist_watcher_controls()}
    rows: dict[str, WatcherRow] = {}
    for status in statuses:
        name = status.watchers[0] if status.watchers else status.trigger_id
        control = controls.get(name)
        paused = control is not None and control.paused
        rows[name] = WatcherRow(
            watcher=name,
            trigger_id=status.trigger_id,
            assets=tuple(status.assets),
            state=_state(daemons.watcher_state(status.state, status.owner), paused),
            daemon=status.owner,
            events=status.events,
            failures=status.failures,
            last_event_at=status.last_event_at,
            last_error=status.last_error,
            paused=paused,
            updated_at=status.updated_at,
        )
    for name, control in controls.items():
        if name not in rows and control.paused:
            rows[name] = WatcherRow(
                name, None, (), "paused", None, 0, 0, None, None, True, control.updated_at
            )
    return [rows[name] for name in sorted(rows)]


def unknown_watcher(name: str, known: Iterable[str]) -> str:
    """The message for a control naming no known watcher: the closest known name, if any.

    A watcher is known once a daemon reported it or it has a control row (see
    :func:`watcher_rows`); a control of any other name is refused, so a typo records nothing.
    """
    names = sorted(set(known))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        return f"no watcher named {name!r}; did you mean {close[0]!r}?"
    if names:
        return f"no watcher named {name!r} (known: {', '.join(names[:10])})"
    return f"no watcher named {name!r}: no daemon has reported one"
