"""The event feed of :class:`~watchkeeper.store.SqliteStateBackend`: a live tail's reads
(event JSON, the poll for new events), through its reader connection. Watcher controls and
API tokens are :mod:`watchkeeper.store.sql.controls`'.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

import anyio

from .part import SqlitePart
from .schema import to_db

T = TypeVar("T")

__all__ = ["SqliteControls"]


class SqliteControls(SqlitePart):
    """The event feed of the SQLite backend (a live tail's reads)
    (:class:`~watchkeeper.store.protocols.EventFeedDriver`)."""

    async def _alast_event_id(self, asset: str | None) -> int:
        if asset is None:
            rows = await self._read("SELECT max(id) FROM asset_events")
        else:
            sql = "SELECT max(id) FROM asset_events WHERE asset_name = ?"
            rows = await self._read(sql, (asset,))
        return int(rows[0][0] or 0)

    async def _acount_events_since(self, since: datetime) -> dict[str, int]:
        sql = "SELECT watcher, count(*) FROM asset_events WHERE created_at >= ? GROUP BY watcher"
        rows = await self._read(sql, (to_db(since),))
        return {str(row[0]): int(row[1]) for row in rows}

    async def _await_events(self, after_id: int, wait: float) -> int:
        """Poll the newest event id (a cheap read: the primary key's last row) until it is past
        ``after_id`` or ``wait`` seconds have passed: other processes commit into the file.

        The poll adapts: every 2 ms at first, doubling up to 20 ms while nothing comes, so a
        busy log is seen at once and an idle one costs a read per 20 ms."""
        last = 0
        pause = 0.002
        with anyio.move_on_after(wait):
            while True:
                rows = await self._read("SELECT coalesce(max(id), 0) FROM asset_events")
                last = int(rows[0][0])
                if last > after_id:
                    return last
                await anyio.sleep(min(pause, wait))
                pause = min(pause * 2, 0.02)
        return last
