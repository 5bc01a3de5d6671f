"""A settable clock for ``backend.clock``, so a test moves time instead of waiting for it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["T0", "Clock"]

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
"""Where a :class:`Clock` starts unless told otherwise."""


class Clock:
    """A settable clock for ``backend.clock``: ``now`` until :meth:`advance` moves it."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
