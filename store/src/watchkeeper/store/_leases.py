"""Trigger leases: the rules every backend shares (argument checks, the fence check).

A lease says which daemon runs a trigger. ``aclaim_leases(owner, ids, ttl)`` takes each lease
that is free (never claimed, released, or expired) and renews the ones ``owner`` already holds,
all until ``now + ttl``; a lease that changes hands gets ``token = previous token + 1`` (the
first claim gets 1), a renewal keeps its token. ``arelease_leases`` frees the leases ``owner``
holds (the row stays, with no owner, so the next holder's token is still higher).

Fencing: a write that carries a :class:`~watchkeeper.store.backend.Fence` checks, in the transaction
that would write, that the lease row names the fence's owner and token and has not expired at
the write's own timestamp. If not, the write stores nothing and raises
:class:`~watchkeeper.store.errors.LeaseLostError`. Times come from the backend's ``clock``, so
the daemons sharing a database need clocks that agree to well within a lease's ``ttl``; the
token, not the clock, is what keeps a stale daemon's writes out.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from ._types import Fence
from .errors import ArgumentTypeError, InvalidArgumentError, LeaseLostError

__all__ = ["HeldLease", "check_fence", "check_owner", "check_trigger_ids", "check_ttl"]

HeldLease = tuple[str | None, int, datetime]
"""A lease row as the fence check needs it: ``(owner, token, expires_at)``."""


def check_owner(owner: object) -> str:
    if not isinstance(owner, str) or not owner:
        raise InvalidArgumentError("owner", owner, "must be a non-empty str")
    return owner


def check_trigger_ids(trigger_ids: object) -> list[str]:
    """The distinct ids, sorted (the order rows are locked in); each a non-empty str."""
    if isinstance(trigger_ids, str | bytes) or not isinstance(trigger_ids, Iterable):
        raise ArgumentTypeError("trigger_ids", trigger_ids, "a list of str trigger ids")
    ids = list(trigger_ids)
    for trigger_id in ids:
        if not isinstance(trigger_id, str) or not trigger_id:
            raise InvalidArgumentError("trigger id", trigger_id, "must be a non-empty str")
    return sorted(set(ids))


def check_ttl(ttl: object) -> timedelta:
    """A lease's time to live, given as a ``timedelta`` or a number of seconds; must be > 0."""
    if isinstance(ttl, timedelta):
        span = ttl
    elif isinstance(ttl, int | float) and not isinstance(ttl, bool):
        span = timedelta(seconds=ttl)
    else:
        raise ArgumentTypeError("ttl", ttl, "a timedelta or a number of seconds")
    if span <= timedelta(0):
        raise InvalidArgumentError("ttl", ttl, "must be positive")
    return span


def check_fence(fence: Fence, held: HeldLease | None, now: datetime) -> None:
    """Raise :class:`LeaseLostError` unless ``held`` is ``fence``'s live lease at ``now``."""
    if held is None:
        reason = "it was never claimed"
    else:
        owner, token, expires_at = held
        if owner == fence.owner and token == fence.token:
            if expires_at > now:
                return
            reason = f"it expired at {expires_at.isoformat()}"
        elif owner is None:
            reason = f"it was released (token {token})"
        else:
            reason = f"{owner!r} holds it with token {token}"
    raise LeaseLostError(fence.trigger_id, fence.owner, fence.token, reason)
