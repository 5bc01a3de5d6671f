"""Event consumers and wake-ups for :class:`~watchkeeper.store.SqliteStateBackend`.

An acknowledgement is one operation of the group-commit writer: the cursor move and its state
writes commit together. Other processes commit into the same file, so a worker learns of new
events by polling the last event id (one cheap read of the primary key's last row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .._tasks import StateWrite
from .._types import AssetEvent, Put, Writer
from ..errors import ConsumerCursorError
from . import meta, ops
from .part import SqlitePart

if TYPE_CHECKING:
    from .writer import Tx

__all__ = ["EVENT_COLS", "SqliteConsumers"]

T = TypeVar("T")
Row = tuple[Any, ...]

EVENT_COLS = "ev.id, ev.asset_name, ev.watcher, ev.payload, ev.dedup_key, ev.created_at"


def _consumer_ack(
    tx: Tx, name: str, event_id: int, state: Sequence[StateWrite], expected: int | None,
    writer: Writer | None,
) -> int:  # fmt: skip
    conn = tx.conn
    _, stamp = tx.now()
    row = conn.execute("SELECT cursor FROM event_consumers WHERE name = ?", (name,)).fetchone()
    current = 0 if row is None else row[0]
    if expected is not None and expected != current:
        raise ConsumerCursorError(name, event_id, current, f"expected {expected}")
    if event_id < current:
        raise ConsumerCursorError(name, event_id, current, "a cursor only moves forward")
    who = ops.writer_cols(writer)
    conn.execute(
        "INSERT INTO event_consumers (name, cursor, updated_at, writer_kind, writer_name) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET cursor = excluded.cursor, "
        "updated_at = excluded.updated_at, writer_kind = excluded.writer_kind, "
        "writer_name = excluded.writer_name",
        (name, event_id, stamp, who[0], who[1]),
    )
    for write in state:
        ops.put(tx, Put(write.scope, write.key, write.value_json, writer=writer))
    return event_id


class SqliteConsumers(SqlitePart):
    """The event consumers of the SQLite backend (a part of its tasks driver)."""

    async def _aconsumer_position(self, name: str) -> int:
        rows = await self._read("SELECT cursor FROM event_consumers WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else 0

    async def _aconsumer_fetch(
        self, name: str, assets: list[str] | None, limit: int
    ) -> list[AssetEvent]:
        where, params = "", [name]
        if assets is not None:
            where = f" AND ev.asset_name IN ({', '.join('?' * len(assets))})"
            params.extend(assets)
        rows = await self._read(
            f"SELECT {EVENT_COLS} FROM asset_events ev WHERE ev.id > coalesce("
            f"(SELECT cursor FROM event_consumers WHERE name = ?), 0){where} ORDER BY ev.id "
            "LIMIT ?",
            (*params, limit),
        )
        return meta.events_result(rows)

    async def _aconsumer_ack(
        self,
        name: str,
        event_id: int,
        state: list[StateWrite],
        expected: int | None,
        writer: Writer | None,
    ) -> int:
        return await self._write(
            lambda tx: _consumer_ack(tx, name, event_id, state, expected, writer)
        )
