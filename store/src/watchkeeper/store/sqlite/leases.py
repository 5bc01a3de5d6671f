"""Leases on SQLite: the fence's view of them (the lease jobs themselves are
:mod:`watchkeeper.store.sql.leases`', run in the writer's batches) and the keep-alive
thread's connection.

A batch transaction holds SQLite's write lock: a renewal, a reaping, a claim and a fenced
write are serialised by it, so there is no row locking to arrange as on PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from .._leases import HeldLease
from ..errors import BackendUnavailableError
from ..sql.dialects import SQLITE
from ..sql.leases import LeaseStatements
from .ops import Row
from .schema import from_db, to_db

__all__ = ["HELD_SQL", "SqliteKeepAlive", "held_of"]

# A trigger lease with the expiry of its holder's node lease, NULL when that one is dead/gone.
HELD_SQL: Final = """
    SELECT l.trigger_id, l.owner, l.token, n.expires_at FROM trigger_leases AS l
    LEFT JOIN trigger_nodes AS n ON n.owner = l.owner AND n.alive = 1
"""


def held_of(row: Row) -> HeldLease:
    """``(owner, token, node expiry)`` of a row of :data:`HELD_SQL` (from its 2nd column)."""
    return row[1], row[2], None if row[3] is None else from_db(row[3])


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
            now = self._clock()
            renew = LeaseStatements(SQLITE, "").renew
            args = renew.bind(
                {"owner": self._owner, "ttl": self._ttl.total_seconds()},
                to_db(now),
                lambda ttl: to_db(now + timedelta(seconds=ttl)),
            )
            return conn.execute(renew.sql, args).rowcount > 0
        except sqlite3.Error as exc:
            self.close()
            raise BackendUnavailableError(
                f"cannot keep the node lease of {self._owner!r} alive in {self._path!r}: {exc}"
            ) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
