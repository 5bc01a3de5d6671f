"""Trigger leases: the rules every backend shares (argument checks, the fence check).

A lease says which daemon runs a trigger. It is two things:

- a **node lease** per daemon (``owner``): one row, renewed every second or so by
  ``arenew_node(owner, ttl)`` until ``now + ttl`` on the store's clock (the database's, on
  PostgreSQL). One that expired is *reaped* by the next daemon that renews or claims: marked
  dead by an update that serialises with its owner's renewal, so either the renewal wins and
  the node lives on, or the reaping wins and the renewal learns it (``renewed=False``: the
  node starts afresh and every trigger lease it held is gone);
- a **trigger lease** per trigger: its holder and its *token* (the trigger's epoch). It has no
  expiry of its own and is never renewed: it lives as long as its holder's node lease. It is
  free when released (owner NULL), never claimed, or held by a node lease that is dead or gone.
  ``aclaim_leases`` takes free ones (each gets ``token + 1``, the first claim 1) and never
  touches another live node's; ``arelease_leases`` frees the holder's own (the row stays, so
  the next holder's token is still higher).

Fencing: a write that carries a :class:`~watchkeeper.store.protocols.Fence` checks, in the
transaction that would write, that the trigger lease names the fence's owner and token and
that the owner's node lease is alive and not expired at the write's time. If not, the write
stores nothing and raises :class:`~watchkeeper.store.errors.LeaseLostError`. The token, not
the clock, is what keeps a stale daemon's writes out: another daemon can only take the lease
(token + 1) once the old node lease was reaped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime, timedelta

from ._types import Fence
from .errors import ArgumentTypeError, InvalidArgumentError, LeaseLostError

__all__ = [
    "HeldLease",
    "check_fence",
    "check_owner",
    "check_trigger_ids",
    "check_ttl",
    "spread_key",
]

HeldLease = tuple[str | None, int, datetime | None]
"""A lease row as the fence check needs it: ``(owner, token, expires_at)``, the expiry being
the holder's node lease's (``None`` when that node lease is dead or gone)."""


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
            if expires_at is None:
                reason = "the node lease of its daemon lapsed and was reaped"
            elif expires_at > now:
                return
            else:
                reason = f"it expired at {expires_at.isoformat()}"
        elif owner is None:
            reason = f"it was released (token {token})"
        else:
            reason = f"{owner!r} holds it with token {token}"
    raise LeaseLostError(fence.trigger_id, fence.owner, fence.token, reason)


def spread_key(owner: str, trigger_id: str) -> str:
    """The order ``owner`` claims free leases in: a different one for each daemon, so daemons
    claiming at once mostly take different leases (PostgreSQL: ``md5(trigger_id || owner)``)."""
    return hashlib.md5((trigger_id + owner).encode(), usedforsecurity=False).hexdigest()
