"""The daemon's side of trigger leases: its identity, and claiming and releasing its leases.

Several daemons may share one database. Each trigger runs only on the daemon that holds its
lease (a row in the store, see :class:`watchkeeper.store.backend.LeaseTable`). Every heartbeat a daemon
claims the leases of all the triggers it loaded: it renews those it holds and takes those that
are free (never claimed, released, or expired because their holder died). It runs a trigger
only under the lease's token, and its writes are fenced on it, so a daemon that was paused
past the lease's time to live and wakes up finds its writes refused by the store.

A backend without lease support (a custom one) makes the daemon run every trigger unfenced,
as a single daemon would; :class:`LeaseKeeper` then answers ``None`` and logs that once.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable

import anyio
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.backend import LeaseTable, get_logger

from ._supervisor import describe_error

__all__ = ["LeaseKeeper", "daemon_identity", "is_dead_local_owner"]

log = get_logger(__name__)

_RELEASE_TIMEOUT = 5.0


def daemon_identity() -> str:
    """``host:pid:random``: unique per daemon process, readable in the lease table and logs.

    The random part keeps two incarnations with a recycled pid (a container restarted with
    the same pid 1) from taking each other for the same daemon.
    """
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def is_dead_local_owner(owner: str) -> bool:
    """True when ``owner`` names a daemon process of this host that no longer exists.

    Its leases can be freed at once instead of after their time to live: a process that is
    gone writes nothing. A pid reused by another process reads as alive (we then wait for the
    expiry, as for a remote daemon); a live daemon misjudged dead (another pid namespace under
    the same host name) only loses its lease, and fencing keeps its writes out.
    """
    host, sep, rest = owner.partition(":")
    pid_text, sep2, _ = rest.partition(":")
    if not sep or not sep2 or host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


class LeaseKeeper:
    """Claims and releases one daemon's leases and remembers which ones it holds."""

    def __init__(self, backend: BaseStateBackend, owner: str, ttl: float) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        self.backend = backend
        self.owner = owner
        self.ttl = ttl
        self._table = backend if isinstance(backend, LeaseTable) else None
        self.supported = self._table is not None
        """False for a backend without leases: every trigger then runs here, unfenced."""
        if self._table is None:
            log.info("leases_unsupported", backend=type(backend).__name__)
        self._held: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<LeaseKeeper owner={self.owner!r} held={len(self._held)} ttl={self.ttl}>"

    @property
    def held(self) -> dict[str, int]:
        """Token by trigger id of the leases the last claim returned (minus those released)."""
        return dict(self._held)

    async def claim(self, trigger_ids: Iterable[str]) -> dict[str, int] | None:
        """Renew or take the leases of ``trigger_ids``; the tokens now held, or ``None`` when
        the backend has no leases (then every trigger runs here, unfenced)."""
        if self._table is None:
            return None
        ids = sorted(set(trigger_ids))
        tokens = await self._table.aclaim_leases(self.owner, ids, self.ttl)
        for trigger_id in ids:
            if trigger_id in tokens:
                if self._held.get(trigger_id) != tokens[trigger_id]:
                    log.info("lease_acquired", trigger_id=trigger_id, token=tokens[trigger_id])
            elif trigger_id in self._held:
                log.warning("lease_moved", trigger_id=trigger_id, token=self._held[trigger_id])
        self._held = {k: v for k, v in self._held.items() if k not in ids} | tokens
        return tokens

    async def free_among(self, trigger_ids: Iterable[str]) -> list[str]:
        """``trigger_ids`` without those whose lease another daemon holds (and has not let
        expire), in the given order: the ones a claim could take or renew."""
        ids = list(trigger_ids)
        if self._table is None:
            return ids
        leases = await self._table.alist_leases()
        now = self.backend.clock()
        busy: set[str] = set()
        dead: dict[str, list[str]] = {}
        for lease in leases:
            if lease.owner in (None, self.owner) or lease.expires_at <= now:
                continue
            if is_dead_local_owner(lease.owner):
                dead.setdefault(lease.owner, []).append(lease.trigger_id)
            else:
                busy.add(lease.trigger_id)
        for owner, held in dead.items():
            # A daemon of this host killed with -9: free its leases now rather than after
            # their time to live, so a restarted daemon resumes at once.
            await self._table.arelease_leases(owner, held)
            log.info("dead_owner_leases_released", owner=owner, trigger_ids=held)
        return [t for t in ids if t not in busy]

    async def release(self, trigger_ids: Iterable[str]) -> None:
        """Free these leases (those held) so another daemon can take them at once."""
        ids = sorted(set(trigger_ids) & set(self._held))
        if not ids or self._table is None:
            return
        await self._table.arelease_leases(self.owner, ids)
        for trigger_id in ids:
            del self._held[trigger_id]
        log.info("leases_released", trigger_ids=ids)

    async def release_all(self) -> None:
        """Release every held lease, at shutdown: bounded, shielded, and never raising."""
        with anyio.move_on_after(_RELEASE_TIMEOUT, shield=True) as scope:
            try:
                await self.release(list(self._held))
            except Exception as exc:  # noqa: BLE001 - they expire on their own after the ttl
                log.warning("lease_release_failed", error=describe_error(exc))
        if scope.cancelled_caught:
            log.warning("lease_release_failed", error="timed out", timeout=_RELEASE_TIMEOUT)
