"""The retention rule for asset events, one definition for every backend.

An event is deleted by garbage collection once it is older than ``[events] retention_days``.
An event that carries a ``dedup_key`` is what suppresses a redelivery of that key (a unique
index on ``(asset, dedup_key)`` of the events), so it is kept until it is also older than
``[events] dedup_retention_days``: a redelivery inside that window is still suppressed, however
short the event retention. ``0`` for either means "forever": ``retention_days = 0`` keeps every
event, ``dedup_retention_days = 0`` keeps every event that has a dedup key. "Older than N days"
is ``created_at < now - N days``, with ``now`` from the backend's clock.

A finished run's logs (``store.logs``) go with the events: a run that succeeded or failed
before the events' cutoff (``created_at < now - retention_days``) loses its logs; a run
still queued or running keeps them, and ``retention_days = 0`` keeps them all.

The memory backend applies :meth:`EventCutoffs.due`; the SQL backends apply the same condition
in SQL (``created_at < $events AND (dedup_key IS NULL OR created_at < $dedup)``, where a NULL
``$dedup`` is never true).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .errors import InvalidArgumentError

__all__ = ["EventCutoffs", "GcPlan", "check_days", "days_before", "event_cutoffs", "gc_plan"]


def check_days(name: str, value: object) -> int:
    """Return ``value`` if it is an ``int >= 0``; raise :class:`InvalidArgumentError` naming
    ``name`` otherwise (a ``ValueError``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(name, value, "must be an int >= 0")
    return value


def days_before(now: datetime, days: int) -> datetime | None:
    """``now`` minus ``days``; None for 0 days (keep forever) or a span reaching past year 1
    (nothing is that old)."""
    if not days:
        return None
    try:
        return now - timedelta(days=days)
    except OverflowError:
        return None


@dataclass(frozen=True, slots=True)
class EventCutoffs:
    """An event created before ``events`` is due, unless it has a dedup key and was not also
    created before ``dedup`` (None: events with a dedup key are never due)."""

    events: datetime
    dedup: datetime | None

    def due(self, created_at: datetime, dedup_key: str | None) -> bool:
        if not created_at < self.events:
            return False
        return dedup_key is None or (self.dedup is not None and created_at < self.dedup)


def event_cutoffs(
    now: datetime, retention_days: int, dedup_retention_days: int
) -> EventCutoffs | None:
    """The cutoffs of one GC pass at ``now``, or None when no event can be due."""
    events = days_before(now, check_days("event_retention_days", retention_days))
    dedup = days_before(now, check_days("dedup_retention_days", dedup_retention_days))
    return None if events is None else EventCutoffs(events, dedup)


@dataclass(frozen=True, slots=True)
class GcPlan:
    """One garbage-collection pass, its arguments checked and its cutoffs computed once.

    ``stale_before``: task state without an expiry and last written before it is stale (None:
    the retention sweep is off); ``events``: the event cutoffs (None: no event is due);
    ``batch_size`` 0 means one statement per kind, else batches of that many rows.
    """

    now: datetime
    dry_run: bool
    batch_size: int
    stale_before: datetime | None
    events: EventCutoffs | None


def gc_plan(
    now: datetime,
    *,
    default_retention_days: object,
    batch_size: object,
    dry_run: bool,
    event_retention_days: int,
    dedup_retention_days: int,
) -> GcPlan:
    """Check the arguments of ``acollect_garbage`` and compute its cutoffs at ``now``."""
    retention = check_days("default_retention_days", default_retention_days)
    batch = check_days("batch_size", batch_size)
    return GcPlan(
        now=now,
        dry_run=bool(dry_run),
        batch_size=batch,
        stale_before=days_before(now, retention),
        events=event_cutoffs(now, event_retention_days, dedup_retention_days),
    )
