"""The lease SQL of :class:`~watchkeeper.store.SqliteStateBackend`: node leases, trigger leases
and the fence's view of them (the rules are :mod:`watchkeeper.store._leases`').

Every function runs in the writer's thread inside a batch transaction, which holds SQLite's
write lock: a renewal, a reaping, a claim and a fenced write are serialised by it, so there is
no row locking to arrange as on PostgreSQL. Times come from the backend's ``clock``: the
daemons sharing a SQLite file share one machine, hence one clock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from .._leases import HeldLease, spread_key
from .._types import Lease, NodeHeartbeat, NodeLease
from ..errors import BackendUnavailableError
from .ops import Row
from .schema import from_db, to_db
from .writer import Tx

__all__ = [
    "HELD_SQL",
    "LEASE_LIST_SQL",
    "SqliteKeepAlive",
    "break_node",
    "claim_leases",
    "held_of",
    "leases_result",
    "release_leases",
    "renew_node",
]

# A trigger lease with the expiry of its holder's node lease, NULL when that one is dead/gone.
HELD_SQL: Final = """
    SELECT l.trigger_id, l.owner, l.token, n.expires_at FROM trigger_leases AS l
    LEFT JOIN trigger_nodes AS n ON n.owner = l.owner AND n.alive = 1
"""
LEASE_LIST_SQL: Final = HELD_SQL + " ORDER BY l.trigger_id"
_NODES_SQL: Final = """
    SELECT n.owner, n.alive, n.expires_at,
           (SELECT count(*) FROM trigger_leases AS l WHERE l.owner = n.owner)
    FROM trigger_nodes AS n ORDER BY n.owner
"""


def held_of(row: Row) -> HeldLease:
    """``(owner, token, node expiry)`` of a row of :data:`HELD_SQL` (from its 2nd column)."""
    return row[1], row[2], None if row[3] is None else from_db(row[3])


_RENEW_SQL: Final = "UPDATE trigger_nodes SET expires_at = ? WHERE owner = ? AND alive = 1"


def renew_node(tx: Tx, owner: str, ttl: timedelta) -> NodeHeartbeat:
    """Renew (or create afresh) ``owner``'s node lease; reap the expired others."""
    now, stamp = tx.now()
    conn = tx.conn
    expires = to_db(now + ttl)
    renewed = conn.execute(_RENEW_SQL, (expires, owner)).rowcount > 0
    if not renewed:  # new, or reaped: whatever it held before is free
        conn.execute("UPDATE trigger_leases SET owner = NULL WHERE owner = ?", (owner,))
        conn.execute(
            "INSERT INTO trigger_nodes (owner, alive, expires_at, joined_at) VALUES (?, 1, ?, ?) "
            "ON CONFLICT (owner) DO UPDATE SET alive = 1, expires_at = excluded.expires_at, "
            "joined_at = excluded.joined_at",
            (owner, expires, stamp),
        )
    reaped = conn.execute(
        "UPDATE trigger_nodes SET alive = 0 WHERE alive = 1 AND owner <> ? AND expires_at <= ? "
        "RETURNING owner",
        (owner, stamp),
    ).fetchall()
    conn.execute(
        "DELETE FROM trigger_nodes WHERE alive = 0 AND NOT EXISTS "
        "(SELECT 1 FROM trigger_leases AS l WHERE l.owner = trigger_nodes.owner)"
    )
    nodes = tuple(
        NodeLease(r[0], bool(r[1]), from_db(r[2]), r[3]) for r in conn.execute(_NODES_SQL)
    )
    return NodeHeartbeat(renewed, nodes, tuple(sorted(r[0] for r in reaped)), now)


def claim_leases(
    tx: Tx, owner: str, trigger_ids: Sequence[str], ttl: timedelta, limit: int | None
) -> dict[str, int]:
    renew_node(tx, owner, ttl)
    conn, stamp = tx.conn, tx.now()[1]
    rows: dict[str, Row] = {}
    for start in range(0, len(trigger_ids), 500):
        part = trigger_ids[start : start + 500]
        marks = ", ".join("?" * len(part))
        for row in conn.execute(f"{HELD_SQL} WHERE l.trigger_id IN ({marks})", part):
            rows[row[0]] = row
    free = [t for t in trigger_ids if t not in rows or rows[t][1] is None or rows[t][3] is None]
    free.sort(key=lambda t: spread_key(owner, t))
    taken = free[:limit]
    conn.executemany(
        "INSERT INTO trigger_leases (trigger_id, owner, token, expires_at) VALUES (?, ?, 1, ?) "
        "ON CONFLICT (trigger_id) DO UPDATE SET owner = excluded.owner, "
        "token = trigger_leases.token + 1, expires_at = excluded.expires_at",
        [(t, owner, stamp) for t in taken],
    )
    held = {t: row[2] for t, row in rows.items() if row[1] == owner and row[3] is not None}
    for t in taken:
        held[t] = rows[t][2] + 1 if t in rows else 1
    return held


def release_leases(tx: Tx, owner: str, trigger_ids: Sequence[str], leave: bool) -> None:
    conn, stamp = tx.conn, tx.now()[1]
    if leave:
        conn.execute(
            "UPDATE trigger_leases SET owner = NULL, expires_at = ? WHERE owner = ?",
            (stamp, owner),
        )
        conn.execute("DELETE FROM trigger_nodes WHERE owner = ?", (owner,))
        return
    conn.executemany(
        "UPDATE trigger_leases SET owner = NULL, expires_at = ? WHERE trigger_id = ? AND owner = ?",
        [(stamp, t, owner) for t in trigger_ids],
    )


def break_node(tx: Tx, owner: str) -> bool:
    cursor = tx.conn.execute(
        "UPDATE trigger_nodes SET alive = 0 WHERE owner = ? AND alive = 1", (owner,)
    )
    return cursor.rowcount > 0


def leases_result(rows: list[Row]) -> list[Lease]:
    return [Lease(row[0], *held_of(row)) for row in rows]


class SqliteKeepAlive:
    """A :class:`~watchkeeper.store.protocols.NodeKeepAliveChannel` on a SQLite file: its own
    connection, used by one thread; the time is the backend's clock, as for every lease."""

    def __init__(
        self, path: str, clock: Callable[[], datetime], owner: str, ttl: timedelta
    ) -> None:
        self._path, self._clock, self._owner, self._ttl = path, clock, owner, ttl
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"<SqliteKeepAlive owner={self._owner!r} path={self._path!r}>"

    def renew(self, timeout: float) -> bool:
        try:
            conn = self._conn
            if conn is None:
                # Read-write, never create: a removed database file stays removed (the
                # daemon's own check reports it) instead of coming back empty.
                uri = f"{Path(self._path).absolute().as_uri()}?mode=rw"
                conn = sqlite3.connect(
                    uri, timeout=timeout, isolation_level=None, check_same_thread=False, uri=True
                )
                self._conn = conn
            conn.execute(f"PRAGMA busy_timeout = {max(1, int(timeout * 1000))}")
            expires = to_db(self._clock() + self._ttl)
            return conn.execute(_RENEW_SQL, (expires, self._owner)).rowcount > 0
        except sqlite3.Error as exc:
            self.close()
            raise BackendUnavailableError(
                f"cannot keep the node lease of {self._owner!r} alive in {self._path!r}: {exc}"
            ) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
