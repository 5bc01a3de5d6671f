"""Each watcher's events over the last five minutes, for ``GET /api/v1/watchers``.

Served by a daemon, the figures come from its runner's event counters
(:class:`RunnerRates`): a sample every :data:`RATE_STEP` seconds, no read of the event log.
Served by ``watchkeeper api`` (no runner), they are counted in the event log
(:func:`counted_in_event_log`), one count every :data:`RATE_CACHE` seconds at most.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
from watchkeeper.store import BaseStateBackend

if TYPE_CHECKING:
    from ..runtime import TriggerRunner

__all__ = ["RATE_CACHE", "RATE_STEP", "RATE_WINDOW", "RunnerRates", "counted_in_event_log"]

RATE_WINDOW = 300
"""Seconds a watcher's events per minute are averaged over."""
RATE_STEP = 15.0
"""Seconds between two samples of the runner's counters: the window's edge moves in steps."""
RATE_CACHE = 2.0
"""Seconds one count of the event log serves every list of the watchers."""


class RunnerRates:
    """Each watcher's events committed by one runner in the last :data:`RATE_WINDOW` seconds.

    Every :data:`RATE_STEP` seconds :meth:`sample` keeps what each watcher committed since
    the previous sample; a watcher's count is the sum of the samples inside the window plus
    what it committed since the last one. Only watchers that committed are kept per sample.

    :param totals: each watcher's events committed so far (cumulative, never decreasing).
    :param known: the watchers the runner runs or ran: the others have no figure here.
    :param window: seconds the count covers.
    :param clock: monotonic seconds (a test passes its own).
    """

    def __init__(
        self,
        totals: Callable[[], dict[str, int]],
        known: Callable[[], Iterable[str]],
        *,
        window: float = RATE_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._totals, self._known = totals, known
        self._window, self._clock = window, clock
        self._last: dict[str, int] = {}
        self._samples: collections.deque[tuple[float, dict[str, int]]] = collections.deque()
        self._in_samples: dict[str, int] = {}

    @classmethod
    def of_runner(cls, runner: TriggerRunner) -> RunnerRates:
        """The rates of ``runner``'s watchers, from its per-asset event counters."""

        def totals() -> dict[str, int]:
            by_watcher: dict[str, int] = {}
            for (_, watcher), count in runner.metrics.events.items():
                by_watcher[watcher] = by_watcher.get(watcher, 0) + count
            return by_watcher

        def known() -> Iterable[str]:
            for status in runner.statuses():
                yield from status.watchers
            for stopped in runner.metrics.stopped.values():
                yield from stopped.watchers
            for _, watcher in runner.metrics.events:
                yield watcher

        return cls(totals, known)

    def totals(self) -> dict[str, int]:
        """Each watcher's events committed by the runner so far (cumulative)."""
        return self._totals()

    def known(self) -> set[str]:
        """The watchers the runner runs or ran."""
        return set(self._known())

    def sample(self) -> None:
        """Keep what each watcher committed since the previous sample; forget samples that
        left the window."""
        now, totals, last = self._clock(), self._totals(), self._last
        added = {name: n - last.get(name, 0) for name, n in totals.items() if n != last.get(name)}
        self._last = totals
        self._samples.append((now, added))
        self._add(added, 1)
        while self._samples and self._samples[0][0] <= now - self._window:
            self._add(self._samples.popleft()[1], -1)

    def counts(self) -> dict[str, int]:
        """Each known watcher's events in the window (the last sample's step included)."""
        totals, last = self._totals(), self._last
        return {
            name: self._in_samples.get(name, 0) + totals.get(name, 0) - last.get(name, 0)
            for name in set(self._known())
        }

    async def run(self) -> None:
        """Sample every :data:`RATE_STEP` seconds until cancelled."""
        while True:
            self.sample()
            await anyio.sleep(RATE_STEP)

    def _add(self, added: dict[str, int], sign: int) -> None:
        in_samples = self._in_samples
        for name, n in added.items():
            left = in_samples.get(name, 0) + sign * n
            if left:
                in_samples[name] = left
            else:
                in_samples.pop(name, None)


async def counted_in_event_log(
    backend: BaseStateBackend, state: Any, window: float = RATE_WINDOW
) -> dict[str, int] | None:
    """Each watcher's events in the last ``window`` seconds, counted in the event log (right on
    the first read, whichever daemon committed them); None for a store without the count.

    One count serves :data:`RATE_CACHE` seconds, kept on ``state`` (the app's state), so many
    open pages cost one read.
    """
    store = backend.services.events
    if store is None:
        return None
    cached: tuple[float, dict[str, int]] | None = getattr(state, "watcher_rate_counts", None)
    if cached is not None and time.monotonic() - cached[0] < RATE_CACHE:
        return cached[1]
    since = backend.clock() - timedelta(seconds=window)
    counts = await store.acount_events_since(since)
    state.watcher_rate_counts = (time.monotonic(), counts)
    return counts
