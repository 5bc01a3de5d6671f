"""The daemon's side of leases: its identity, its node lease, and its watchers' leases.

Several daemons may share one database. Each trigger runs only on the daemon that holds its
lease (see :class:`watchkeeper.store.protocols.LeaseTable`). A daemon renews one *node lease*
every ``lease_renew_interval`` (one row, however many triggers it runs); its trigger leases live
as long as that, each with a token (the trigger's epoch) that changes only when the trigger
changes daemon. Its writes are fenced on that token, so a daemon that was paused past its node
lease's time to live and wakes up finds its writes refused by the store.

:class:`LeaseKeeper` keeps a *deadline* on the monotonic clock: the time the last successful
renewal was sent, plus the time to live, minus a margin (the latest of them: renewals may
answer out of order). Past it without a renewal, the daemon must stop its own triggers (it
cannot know whether its node lease still lives), which :meth:`LeaseKeeper.lapsed` tells.

The renewals that join, reap and claim run on the daemon's event loop. A loop busy for
seconds (starting or cancelling thousands of triggers on a loaded machine) would make them
late, and the daemon would stop its own triggers at its deadline and then take them back:
churn. So, when the backend offers it (:class:`~watchkeeper.store.protocols.NodeKeepAlive`),
:meth:`LeaseKeeper.kept_alive` also extends the node lease from a thread of its own, with a
connection of its own, whenever the last renewal is more than 1.25 intervals old (so it
writes nothing while the loop is on time). It only extends a node lease that is still alive
(never rejoins one that was reaped: the loop does that, and drops the leases it held first),
and moves the deadline only after a renewal it saw succeed. A process that cannot
renew at all (stopped, cut off from the database) still reaches its deadline and stops its
triggers, and its writes are fenced by the store whatever the deadline says. A loop that has
not renewed for ``KEEPALIVE_LIMIT`` lease lifetimes (30 s at the defaults) is taken as hung
(a trigger blocking it, a deadlock), not busy: the thread stops extending, so the node lease
lapses and the other daemons take its watchers, as they would without the thread.

Balance: with N live daemons and W triggers wanted, each daemon's share is ``W // N``, one
more for the ``W % N`` daemons that hold the most now (so that shares move as little as
possible), at most ``capacity``. A daemon under its share claims free leases; one over it
releases the excess, which the others (woken by the release) claim.

A backend without lease support (a custom one) makes the daemon run every trigger unfenced,
as a single daemon would; :class:`LeaseKeeper` then answers ``None`` and logs that once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterable

import anyio
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import (
    NodeHeartbeat,
    NodeKeepAliveChannel,
    get_logger,
)

from .._core import describe_error

__all__ = ["LeaseKeeper", "daemon_identity", "is_dead_local_owner"]

log = get_logger(__name__)

_RELEASE_TIMEOUT = 5.0
_LOGGED = 20
KEEPALIVE_LIMIT = 10
"""Lease lifetimes without a renewal from the loop after which the keep-alive thread stops."""
"""Leases logged one by one per claim (or loss); past that, one line with the count."""
_CLAIM_CHUNK = 500
"""Free leases taken per claim transaction."""


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
    """Renews one daemon's node lease, claims and releases its trigger leases, and remembers
    which ones it holds."""

    def __init__(
        self,
        backend: BaseStateBackend,
        owner: str,
        ttl: float,
        *,
        margin: float = 0.0,
        keepalive_limit: float | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        if not 0 <= margin < ttl:
            raise ValueError(f"margin must be in [0, ttl), got {margin}")
        self.backend = backend
        self.owner = owner
        self.ttl = ttl
        self.margin = margin
        self.keepalive_limit = KEEPALIVE_LIMIT * ttl if keepalive_limit is None else keepalive_limit
        """Seconds since the loop's last renewal after which the keep-alive thread stops."""
        self._loop_sent = time.monotonic()
        self._table = backend.services.leases
        self.supported = self._table is not None
        """False for a backend without leases: every trigger then runs here, unfenced."""
        if self._table is None:
            log.info("leases_unsupported", backend=type(backend).__name__)
        self._held: dict[str, int] = {}
        self._joined = False
        self.deadline: float | None = None
        """Monotonic time past which this daemon's node lease may have expired (None before
        the first renewal). Moved by the loop's renewals and the keep-alive thread's, under
        ``_deadline_lock``, only ever later."""
        self._deadline_lock = threading.Lock()
        self.last_beat: NodeHeartbeat | None = None
        self.keepalives = 0
        """Renewals by the keep-alive thread that extended the node lease."""
        self._renewal = anyio.Event()

    def __repr__(self) -> str:
        return f"<LeaseKeeper owner={self.owner!r} held={len(self._held)} ttl={self.ttl}>"

    @property
    def held(self) -> dict[str, int]:
        """Token by trigger id of the leases held (as of the last renewal, claim or release)."""
        return dict(self._held)

    async def wait_renewal(self) -> None:
        """Return at the next successful renewal (or claim) of the node lease."""
        await self._renewal.wait()

    def lapsed(self) -> bool:
        """True when the deadline passed without a renewal: this daemon's triggers must stop."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _renewed(self, sent: float, renewed: bool) -> None:
        if not renewed and self._joined and self._held:
            # Reaped while we could not renew: every lease we held may run elsewhere now.
            for trigger_id, token in sorted(self._held.items())[:_LOGGED]:
                log.warning("lease_moved", trigger_id=trigger_id, token=token)
            log.warning("node_lease_reaped", owner=self.owner, leases=len(self._held))
            self._held = {}
        self._joined = True
        self._loop_sent = sent
        self._extend(sent)
        self._renewal.set()
        self._renewal = anyio.Event()

    def _extend(self, sent: float) -> None:
        """A renewal sent at ``sent`` succeeded: the node lease lives until at least
        ``sent + ttl`` on the store's clock. Never moves the deadline earlier: a renewal sent
        before another may be answered after it (the loop's, delayed by a busy loop)."""
        deadline = sent + self.ttl - self.margin
        with self._deadline_lock:
            if self.deadline is None or deadline > self.deadline:
                self.deadline = deadline

    @contextlib.asynccontextmanager
    async def kept_alive(self, interval: float) -> AsyncIterator[None]:
        """Extend the node lease from a thread of its own while inside, whenever the loop's
        renewals (every ``interval`` seconds) are late (see the module docstring and
        :meth:`_keep_alive`); nothing when the backend offers no keep-alive.
        On exit the thread stops (within the ttl, shielded) and closes its connection."""
        keepalive = None if self._table is None else self._table.keepalive
        if keepalive is None:
            yield
            return
        channel = keepalive.open_node_keepalive(self.owner, self.ttl)
        stop = threading.Event()
        thread = threading.Thread(
            target=self._keep_alive,
            args=(channel, interval, stop),
            name=f"watchkeeper-keepalive-{self.owner}",
            daemon=True,  # never holds the process up: the join below is bounded
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join, self.ttl)

    def _keep_alive(
        self, channel: NodeKeepAliveChannel, interval: float, stop: threading.Event
    ) -> None:
        """The keep-alive thread: once the loop joined, renew whenever the last successful
        renewal is more than 1.25 intervals old (the loop is late: busy, or stalled), looking
        every half interval; while the loop renews on time it writes nothing. A renewal slower
        than ``ttl - margin`` could not move the deadline, so that is its time limit."""
        limit = self.ttl - self.margin
        late = 1.25 * interval
        failing = given_up = False
        try:
            while not stop.wait(interval / 2):
                deadline = self.deadline
                if deadline is None:
                    continue  # not joined yet: the loop's first renewal joins
                sent = time.monotonic()
                if sent - (deadline - limit) < late:
                    continue  # the loop renewed lately
                silent = sent - self._loop_sent
                if silent > self.keepalive_limit:  # hung, not busy: let the lease lapse
                    if not given_up:
                        log.warning(
                            "node_keepalive_stopped",
                            owner=self.owner,
                            loop_silent_seconds=round(silent, 1),
                        )
                    given_up = True
                    continue
                given_up = False
                try:
                    alive = channel.renew(limit)
                except Exception as exc:  # noqa: BLE001 - the next look tries again
                    if not failing:  # once per outage; the loop's renewals report theirs
                        log.warning(
                            "node_keepalive_failed", owner=self.owner, error=describe_error(exc)
                        )
                    failing = True
                    continue
                failing = False
                if alive:
                    self._extend(sent)
                    self.keepalives += 1
        finally:
            channel.close()

    async def renew(self) -> NodeHeartbeat | None:
        """Renew the node lease (O(1)); reap, now, the node lease of a daemon of this host
        whose process is gone. None without lease support."""
        if self._table is None:
            return None
        sent = time.monotonic()
        beat = await self._table.arenew_node(self.owner, self.ttl)
        self._renewed(sent, beat.renewed)
        for node in beat.live():
            if is_dead_local_owner(node.owner) and await self._table.abreak_node(node.owner):
                # A daemon of this host killed with -9: its watchers move now rather than
                # after their time to live, so a restarted daemon resumes at once.
                log.info("dead_owner_leases_released", owner=node.owner)
                beat = await self._table.arenew_node(self.owner, self.ttl)
                self._renewed(sent, beat.renewed)
        self.last_beat = beat
        return beat

    def share(self, wanted: int, capacity: int) -> int:
        """How many of ``wanted`` triggers this daemon should run (see the module docstring)."""
        beat = self.last_beat
        live = [] if beat is None else beat.live()
        if self.owner not in {n.owner for n in live}:
            return min(wanted, capacity)
        live.sort(key=lambda n: (-n.held, n.owner))
        base, extra = divmod(wanted, len(live))
        rank = next(i for i, n in enumerate(live) if n.owner == self.owner)
        return min(base + (1 if rank < extra else 0), capacity)

    def free_hint(self, wanted: int, mine: int) -> bool:
        """Whether some of ``wanted`` triggers (``mine`` of them held here) may have no live
        holder, as of the last renewal: the other live node leases' counts and ours do not
        cover them."""
        beat = self.last_beat
        if beat is None:
            return True
        others = sum(n.held for n in beat.live() if n.owner != self.owner)
        return others + mine < wanted

    async def claim(self, trigger_ids: Iterable[str], limit: int | None = None) -> dict[str, int]:
        """Take up to ``limit`` free leases among ``trigger_ids`` (renewing the node lease);
        return the tokens of those held among them."""
        if self._table is None:
            return {}
        ids = sorted(set(trigger_ids))
        tokens: dict[str, int] = {}
        while True:  # in chunks: each renews the node lease, and none holds rows for long
            step = _CLAIM_CHUNK if limit is None else min(_CLAIM_CHUNK, limit - len(tokens))
            sent = time.monotonic()
            got = await self._table.aclaim_leases(self.owner, ids, self.ttl, limit=step)
            self._renewed(sent, True)
            fresh = {t: n for t, n in got.items() if t not in tokens and t not in self._held}
            tokens.update(got)
            if len(fresh) < step or (limit is not None and len(tokens) >= limit):
                break
            ids = [t for t in ids if t not in got]
        new = sorted((t, n) for t, n in tokens.items() if self._held.get(t) != n)
        for trigger_id, token in new[:_LOGGED]:
            log.info("lease_acquired", trigger_id=trigger_id, token=token)
        if len(new) > _LOGGED:
            log.info("leases_acquired", count=len(new))
        self._held.update(tokens)
        return tokens

    async def release(self, trigger_ids: Iterable[str]) -> None:
        """Free these leases (those held) so another daemon can take them at once."""
        ids = sorted(set(trigger_ids) & set(self._held))
        if not ids or self._table is None:
            return
        await self._table.arelease_leases(self.owner, ids)
        for trigger_id in ids:
            del self._held[trigger_id]
        log.info("leases_released", count=len(ids), trigger_ids=ids[:20])

    async def release_all(self) -> None:
        """Release every held lease and end the node lease, at shutdown: bounded, shielded,
        and never raising. The other daemons are woken to take the triggers over at once."""
        if self._table is None or not self._joined:
            return
        with anyio.move_on_after(_RELEASE_TIMEOUT, shield=True) as scope:
            try:
                await self._table.arelease_leases(self.owner, [], leave=True)
                if self._held:
                    log.info("leases_released", count=len(self._held), leave=True)
                self._held = {}
            except Exception as exc:  # noqa: BLE001 - they expire on their own after the ttl
                log.warning("lease_release_failed", error=describe_error(exc))
        if scope.cancelled_caught:
            log.warning("lease_release_failed", error="timed out", timeout=_RELEASE_TIMEOUT)

    async def await_release(self) -> None:
        """Return once a daemon released leases (never, without lease support)."""
        if self._table is None:
            await anyio.sleep_forever()
        else:
            await self._table.await_lease_release()
