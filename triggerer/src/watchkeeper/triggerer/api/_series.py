"""The watchers' recent history, kept in memory by the API server: what the page's watcher
view draws.

Every ``[api] watcher_sample_seconds`` :class:`WatcherSeries` reads the watchers once (the
status rows the daemons save and the operators' control rows) and each watcher's events since
the previous sample (from the serving daemon's runner counters, or, for `watchkeeper api`, a
count of the event log), and keeps, for the last hour:

- one point per sample and watcher: its events in the interval (as events per minute) and the
  age of its last committed event at that moment (how far it lags behind a source that keeps
  producing; a quiet source shows a growing age too);
- each change of its state (running, backing off, failed, paused, ...) with when it was seen
  and why (the error for a failure, who paused it).

The points of every watcher share one row of sample times and live in ``array("f")`` rows
(NaN for a sample a watcher was not in), and its changes in a short list, so ten thousand
watchers cost a few MB. Nothing is
written to the store: a restarted server starts a new hour.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import anyio
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import get_logger

from .._core import describe_error
from ..daemon import WatcherRow, controls_of, watcher_rows
from ._rates import RunnerRates

__all__ = ["StateChange", "WatcherSeries"]

log = get_logger(__name__)

WINDOW: Final = 3600.0
"""Seconds of history kept."""
MAX_POINTS: Final = 720
"""Most samples kept (a short sample interval keeps less than the window)."""
MAX_CHANGES: Final = 50
"""State changes kept per watcher."""
_NAN: Final = float("nan")


@dataclass(frozen=True, slots=True)
class StateChange:
    """A watcher seen in a new state: when, which, and why (an error's text, who paused)."""

    at: datetime
    state: str
    detail: str | None


def _why(row: WatcherRow, paused_by: dict[str, str | None]) -> str | None:
    if row.state in ("failed", "backing_off"):
        return row.last_error
    if row.state in ("paused", "pausing"):
        by = paused_by.get(row.watcher)
        return f"paused by {by}" if by else "paused"
    return None


class WatcherSeries:
    """The last hour of each watcher's event rate, last-event age and state changes."""

    def __init__(
        self,
        backend: BaseStateBackend,
        *,
        interval: float = 60.0,
        rates: RunnerRates | None = None,
    ) -> None:
        self.backend = backend
        # With a runner (a daemon's API) the rate comes from its counters, not from a count
        # of the event log; the watchers it does not run then have no rate (NaN).
        self.rates = rates
        self._totals: dict[str, int] = {} if rates is None else rates.totals()
        self.interval = interval
        self.points = max(2, min(MAX_POINTS, math.ceil(WINDOW / interval)))
        self.times: deque[datetime] = deque(maxlen=self.points)
        self._rate: dict[str, array[float]] = {}
        self._age: dict[str, array[float]] = {}
        self._changes: dict[str, list[StateChange]] = {}
        self._last_state: dict[str, str] = {}
        self._since: datetime | None = None

    def __repr__(self) -> str:
        return (
            f"<WatcherSeries interval={self.interval} samples={len(self.times)} "
            f"watchers={len(self._rate)}>"
        )

    async def run(self) -> None:
        """Sample now and then every ``interval`` until cancelled; a failed read is logged
        and the next sample tries again."""
        while True:
            try:
                await self.sample()
            except Exception as exc:  # noqa: BLE001 - a store outage must not end the series
                log.warning("watcher_series_sample_failed", error=describe_error(exc))
            await anyio.sleep(self.interval)

    async def sample(self) -> None:
        """Read the watchers and the events since the last sample; add one point each."""
        backend = self.backend
        now = backend.clock()
        since = self._since or now - timedelta(seconds=self.interval)
        rows = await watcher_rows(backend)
        store = controls_of(backend)
        counts: dict[str, int] = {}
        paused_by: dict[str, str | None] = {}
        if self.rates is not None:
            totals, before = self.rates.totals(), self._totals
            counts = {n: totals.get(n, 0) - before.get(n, 0) for n in self.rates.known()}
            self._totals = totals
        if store is not None:
            events = backend.services.events
            if self.rates is None and events is not None:
                counts = await events.acount_events_since(since)
            paused_by = {c.watcher: c.updated_by for c in await store.alist_watcher_controls()}
        minutes = max((now - since).total_seconds(), 1e-9) / 60
        self._since = now
        full = len(self.times) == self.points
        self.times.append(now)
        seen = set()
        for row in rows:
            name = row.watcher
            seen.add(name)
            rate, age = self._rows(name, full)
            if self.rates is not None and name not in counts:
                rate.append(_NAN)
            else:
                rate.append(counts.get(name, 0) / minutes)
            last = row.last_event_age(now)
            age.append(_NAN if last is None else last)
            if self._last_state.get(name) != row.state:
                self._last_state[name] = row.state
                changes = self._changes.setdefault(name, [])
                changes.append(StateChange(now, row.state, _why(row, paused_by)))
                if len(changes) > MAX_CHANGES:
                    del changes[0]
        # A writer of events not (yet) in the status rows: its rate counts from the first
        # sample (a daemon saves its watchers' statuses a heartbeat after starting them).
        for name in counts.keys() - seen:
            seen.add(name)
            rate, age = self._rows(name, full)
            rate.append(counts[name] / minutes)
            age.append(_NAN)
        for name in self._rate.keys() - seen:
            rate, age = self._rows(name, full)
            rate.append(_NAN)
            age.append(_NAN)

    def _rows(self, name: str, full: bool) -> tuple[array[float], array[float]]:
        """The two rows of ``name``, aligned with :attr:`times` before this sample's point."""
        rate = self._rate.get(name)
        age = self._age.get(name)
        if rate is None or age is None:
            before = len(self.times) - 1
            rate = self._rate[name] = array("f", [_NAN] * before)
            age = self._age[name] = array("f", [_NAN] * before)
        elif full:
            del rate[0]
            del age[0]
        return rate, age

    def knows(self, watcher: str) -> bool:
        return watcher in self._rate

    def view(self, watcher: str) -> dict[str, Any]:
        """The watcher's points and state changes as JSON data (null where not sampled)."""
        rate = self._rate.get(watcher, array("f"))
        age = self._age.get(watcher, array("f"))
        points = [
            {
                "at": at.isoformat(),
                "events_per_minute": None if math.isnan(r) else round(r, 3),
                "last_event_age_seconds": None if math.isnan(a) else round(a, 3),
            }
            for at, r, a in zip(self.times, rate, age, strict=False)
        ]
        changes = [
            {"at": c.at.isoformat(), "state": c.state, "detail": c.detail}
            for c in self._changes.get(watcher, ())
        ]
        return {
            "interval_seconds": self.interval,
            "window_seconds": WINDOW,
            "points": points,
            "changes": changes,
        }
