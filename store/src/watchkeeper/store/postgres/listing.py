"""The oldest pending event of each task cursor for :class:`~watchkeeper.store.PostgresStateBackend`
(the listings of runs are :mod:`watchkeeper.store.sql.runs`')."""

from __future__ import annotations

from datetime import datetime

from .part import PostgresPart

__all__ = ["PostgresRunListing"]


class PostgresRunListing(PostgresPart):
    """A part of :class:`.tasks.PostgresTasks` (see the module docstring)."""

    async def _aoldest_pending(self) -> dict[tuple[str, str], datetime]:
        p = self._prefix
        rows = await self._fetch(
            "reading the oldest pending events",
            f"SELECT c.task, c.asset, (SELECT e.created_at FROM {p}asset_events e "
            "WHERE e.asset_name = c.asset AND e.id > c.cursor ORDER BY e.id LIMIT 1) "
            f"FROM {p}task_cursors c",
        )
        return {(row[0], row[1]): row[2] for row in rows if row[2] is not None}
