"""Node and trigger leases, written once for both SQL databases (the rules are
:mod:`watchkeeper.store._leases`').

- **Renewal** updates one row, ``WHERE owner = :owner AND alive``, in a statement that commits
  alone on PostgreSQL (the row's lock is never held while the daemon's loop is busy).
  **Reaping** another node is ``UPDATE ... SET alive = false WHERE expires_at <= now``: both
  take the row's lock (SQLite: the file's write lock), so they serialise and each re-reads
  the row the other committed: either the renewal wins and the reaper finds the row
  unexpired, or the reaping wins and the renewal finds it dead and starts the node afresh,
  freeing what it held.
- **Claims** take the free trigger leases (released, or held by a node lease that is dead or
  gone) in an order of each daemon's own (``md5(trigger_id || owner)``), ``FOR UPDATE SKIP
  LOCKED`` on PostgreSQL, so daemons claiming at once take different rows and none waits; a
  row a fenced commit holds ``FOR SHARE`` is skipped now and taken by a later claim, after
  that commit, so the new holder reads what the old one wrote. New rows are inserted in one
  order for all: two daemons inserting the same new rows wait for each other, never in a
  cycle.
- **Releases** lock the rows in ``trigger_id`` order first, as the writer's fence check
  does (no deadlock), and wake the daemons waiting for a release (``notify``: PostgreSQL's
  ``NOTIFY``; in one process the service wakes its own).

Times are the store's clock (``{now}``): on PostgreSQL the database's ``now()`` unless the
backend was given a clock, on SQLite the batch's time (the daemons sharing a file share a
machine, hence a clock). :class:`SqlLeases` is the leases driver over a
:class:`~.runner.Runner`.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Final

from .._types import Lease, NodeHeartbeat, NodeLease
from .engine import BEGIN, Dialect, Job, count, notify, rows, run
from .runner import Runner

__all__ = ["LEASES_TOPIC", "LeaseStatements", "SqlLeases"]

LEASES_TOPIC: Final = "leases"
"""The topic of a release or a node joining (PostgreSQL: ``<schema>_watchkeeper_leases``)."""

_NO_LIMIT: Final = 2**62


class LeaseStatements:
    """The lease statements in one dialect, for one table prefix."""

    def __init__(self, dialect: Dialect, prefix: str) -> None:
        self.dialect = dialect
        sql = partial(dialect.compile, prefix=prefix)
        self.renew = sql(
            "UPDATE {p}trigger_nodes SET expires_at = {expires} WHERE owner = :owner AND alive"
        )
        self.free_own = sql(
            "UPDATE {p}trigger_leases SET owner = NULL, expires_at = {now} WHERE owner = :owner"
        )
        self.join = sql(
            "INSERT INTO {p}trigger_nodes (owner, alive, expires_at, joined_at) "
            "VALUES (:owner, true, {expires}, {now}) "
            "ON CONFLICT (owner) DO UPDATE SET alive = true, expires_at = excluded.expires_at, "
            "joined_at = excluded.joined_at"
        )
        self.reap = sql(
            "UPDATE {p}trigger_nodes SET alive = false "
            "WHERE alive AND owner <> :owner AND expires_at <= {now} RETURNING owner"
        )
        self.forget_dead = sql(
            "DELETE FROM {p}trigger_nodes WHERE NOT alive AND NOT EXISTS "
            "(SELECT 1 FROM {p}trigger_leases AS l WHERE l.owner = {p}trigger_nodes.owner)"
        )
        self.nodes = sql(
            "SELECT n.owner, n.alive, n.expires_at, "
            "(SELECT count(*) FROM {p}trigger_leases AS l WHERE l.owner = n.owner), {now} "
            "FROM {p}trigger_nodes AS n ORDER BY n.owner"
        )
        self.now = sql("SELECT {now}")
        # Free: released, or held by a node lease that is dead or gone. SKIP LOCKED passes
        # over rows another claim, a release or a fenced commit holds right now.
        self.take = sql("""
            WITH free AS (
                SELECT l.trigger_id AS id FROM {p}trigger_leases AS l
                WHERE l.trigger_id {in:ids} AND (l.owner IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {p}trigger_nodes AS n WHERE n.owner = l.owner AND n.alive))
                ORDER BY md5(l.trigger_id || :owner) LIMIT :limit
                {for_update_of:l} {skip_locked}
            )
            UPDATE {p}trigger_leases AS l SET owner = :owner, token = l.token + 1,
                expires_at = {now}
            FROM free WHERE l.trigger_id = free.id
            RETURNING trigger_id
        """)
        # Chosen in this daemon's spread order, inserted in one order for all.
        self.insert = sql("""
            INSERT INTO {p}trigger_leases (trigger_id, owner, token, expires_at)
            SELECT mine.value, :owner, 1, {now} FROM (
                SELECT e.value AS value FROM {each:ids:e}
                WHERE NOT EXISTS (SELECT 1 FROM {p}trigger_leases AS l WHERE l.trigger_id = e.value)
                ORDER BY md5(e.value || :owner) LIMIT :limit
            ) AS mine WHERE true ORDER BY mine.value
            ON CONFLICT (trigger_id) DO NOTHING
        """)
        self.held = sql(
            "SELECT trigger_id, token FROM {p}trigger_leases "
            "WHERE trigger_id {in:ids} AND owner = :owner"
        )
        self.lock = sql(
            "SELECT trigger_id FROM {p}trigger_leases "
            "WHERE trigger_id {in:ids} AND owner = :owner ORDER BY trigger_id {for_update}"
        )
        self.lock_all = sql(
            "SELECT trigger_id FROM {p}trigger_leases "
            "WHERE owner = :owner ORDER BY trigger_id {for_update}"
        )
        self.release = sql(
            "UPDATE {p}trigger_leases SET owner = NULL, expires_at = {now} "
            "WHERE trigger_id {in:ids} AND owner = :owner"
        )
        self.release_all = sql(
            "UPDATE {p}trigger_leases SET owner = NULL, expires_at = {now} WHERE owner = :owner"
        )
        self.leave = sql("DELETE FROM {p}trigger_nodes WHERE owner = :owner")
        self.break_node = sql(
            "UPDATE {p}trigger_nodes SET alive = false WHERE owner = :owner AND alive "
            "RETURNING owner"
        )
        self.list = sql(
            "SELECT l.trigger_id, l.owner, l.token, n.expires_at "
            "FROM {p}trigger_leases AS l LEFT JOIN {p}trigger_nodes AS n "
            "ON n.owner = l.owner AND n.alive ORDER BY l.trigger_id"
        )


# -- the jobs --------------------------------------------------------------------------------


def renew_node(s: LeaseStatements, owner: str, ttl: float) -> Job[NodeHeartbeat]:
    """Renew (or create afresh) ``owner``'s node lease; reap the expired others; list them."""
    renewed = (yield count(s.renew, owner=owner, ttl=ttl)) > 0
    yield BEGIN  # the renewal committed alone: the node row is not held while the rest runs
    if not renewed:  # new, or reaped: whatever it held before is free
        yield run(s.free_own, owner=owner)
        yield run(s.join, owner=owner, ttl=ttl)
        yield notify(LEASES_TOPIC, owner)
    reaped = [r[0] for r in (yield rows(s.reap, owner=owner))]
    yield run(s.forget_dead)
    found = yield rows(s.nodes)
    now = found[0][4] if found else (yield rows(s.now))[0][0]
    ts = s.dialect.timestamp
    nodes = tuple(NodeLease(r[0], bool(r[1]), ts(r[2]), r[3]) for r in found)
    return NodeHeartbeat(renewed, nodes, tuple(sorted(reaped)), ts(now))


def claim_leases(
    s: LeaseStatements, owner: str, ids: list[str], limit: int | None
) -> Job[dict[str, int]]:
    """Take up to ``limit`` free leases among ``ids``; ``{trigger_id: token}`` of those held."""
    yield BEGIN
    if ids and limit != 0:
        most = _NO_LIMIT if limit is None else limit
        taken = len((yield rows(s.take, owner=owner, ids=ids, limit=most)))
        if taken < most:
            yield run(s.insert, owner=owner, ids=ids, limit=most - taken)
    return {r[0]: r[1] for r in (yield rows(s.held, owner=owner, ids=ids))}


def renew_and_claim(
    s: LeaseStatements, owner: str, ttl: float, ids: list[str], limit: int | None
) -> Job[dict[str, int]]:
    """:func:`renew_node` then :func:`claim_leases`, in one transaction."""
    yield from renew_node(s, owner, ttl)
    return (yield from claim_leases(s, owner, ids, limit))


def release_leases(s: LeaseStatements, owner: str, ids: list[str], leave: bool) -> Job[None]:
    """Free ``owner``'s leases among ``ids`` (all of them and its node lease, if ``leave``)."""
    yield BEGIN
    # Locked in trigger_id order, as the writer's fence check locks them: no deadlock.
    if leave:
        yield rows(s.lock_all, owner=owner)
        yield run(s.release_all, owner=owner)
        yield run(s.leave, owner=owner)
    else:
        yield rows(s.lock, owner=owner, ids=ids)
        yield run(s.release, owner=owner, ids=ids)
    yield notify(LEASES_TOPIC, owner)


def break_node(s: LeaseStatements, owner: str) -> Job[bool]:
    yield BEGIN
    return bool((yield rows(s.break_node, owner=owner)))


def list_leases(s: LeaseStatements) -> Job[list[Lease]]:
    ts = s.dialect.timestamp
    found = yield rows(s.list)
    return [Lease(r[0], r[1], r[2], None if r[3] is None else ts(r[3])) for r in found]


# -- the driver ------------------------------------------------------------------------------


class SqlLeases:
    """The leases driver (:class:`~watchkeeper.store.protocols.LeasesDriver`) of a SQL store."""

    __slots__ = ("_runner", "_statements")

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._statements: LeaseStatements | None = None

    def __repr__(self) -> str:
        return f"<SqlLeases over {self._runner!r}>"

    @property
    def statements(self) -> LeaseStatements:
        """The statements (built on first use: a store knows its schema once it is set up)."""
        s = self._statements
        if s is None:
            s = self._statements = LeaseStatements(self._runner.dialect, self._runner.prefix)
        return s

    async def _arenew_node(self, owner: str, ttl: timedelta) -> NodeHeartbeat:
        secs = ttl.total_seconds()
        # Each statement has half the lease's time to live at most (a second at least): one
        # that hangs (a dead network) fails in time for the next try to renew the lease.
        return await self._runner.write(
            partial(renew_node, self.statements, owner, secs),
            what="renewing a node lease",
            lane="renewals",
            bound=max(secs / 2, 1.0),
        )

    async def _aclaim_leases(
        self, owner: str, ids: list[str], ttl: timedelta, limit: int | None
    ) -> dict[str, int]:
        s = self.statements
        if s.dialect.row_locks:
            # The node lease is renewed in a transaction of its own first: a claim of
            # thousands of rows must not hold the node row (a reaper would wait for it, and
            # find it expired).
            await self._arenew_node(owner, ttl)
            job = partial(claim_leases, s, owner, ids, limit)
        else:  # one write holds the database: the renewal and the claim commit together,
            # so no other daemon rejoins and claims between them
            job = partial(renew_and_claim, s, owner, ttl.total_seconds(), ids, limit)
        return await self._runner.write(job, what="claiming leases", lane="claims")

    async def _arelease_leases(self, owner: str, ids: list[str], leave: bool) -> None:
        await self._runner.write(
            partial(release_leases, self.statements, owner, ids, leave),
            what="releasing leases",
            lane="claims",
        )

    async def _abreak_node(self, owner: str) -> bool:
        return await self._runner.write(
            partial(break_node, self.statements, owner), what="reaping a node lease", lane="claims"
        )

    async def _alist_leases(self) -> list[Lease]:
        return await self._runner.read(partial(list_leases, self.statements), what="listing leases")
