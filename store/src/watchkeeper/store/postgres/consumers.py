"""Event consumers and wake-ups for :class:`~watchkeeper.store.PostgresStateBackend`.

The commit-order lock and the one NOTIFY per batch of event commits are here too
(:func:`events_prelude`, sent with the group writer's ``BEGIN``; :func:`events_hook`, the same
run by a finish with outlets): see :mod:`.tasks` for why a cursor reader takes that lock
exclusively.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._tasks import StateWrite
from .._types import AssetEvent, AssetScope, TaskScope, Writer
from .._values import decode_value
from ..errors import AssetNotFoundError, ConsumerCursorError
from .part import PostgresPart
from .sql import writer_fields

__all__ = [
    "EVENT_COLS",
    "PostgresConsumers",
    "event_row",
    "events_channel",
    "events_hook",
    "events_prelude",
]

T = TypeVar("T")

_LISTENER_CHECK = 30.0
"""Seconds after which the LISTEN connection is checked again (one ``SELECT 1``)."""

EVENT_COLS = "ev.id, ev.asset_name, ev.watcher, ev.payload, ev.dedup_key, ev.created_at"
LOCK_KEY = "hashtextextended('watchkeeper.events:' || coalesce($1::text, current_schema()), 0)"


def events_channel(schema: str | None) -> str:
    """The NOTIFY channel of a schema's event commits (an identifier: the schema is one)."""
    return "watchkeeper_events" if schema is None else f"watchkeeper_events_{schema}"[:63]


def events_hook(schema: str | None) -> Callable[[Any], Awaitable[None]]:
    """What a transaction that inserts events runs first: the shared commit-order lock, and
    the batch's one notification (delivered at commit, dropped on rollback)."""
    sql = f"SELECT pg_advisory_xact_lock_shared({LOCK_KEY}), pg_notify($2, '')"
    channel = events_channel(schema)

    async def hook(conn: Any) -> None:
        await conn.execute(sql, schema, channel)

    return hook


def events_prelude(schema: str | None) -> str:
    """:func:`events_hook`'s statement with its values written in (no parameters), so the
    group writer can send it in one message with its ``BEGIN``. The schema and the channel are
    plain identifiers (:func:`~.schema.check_schema_name`): nothing in them needs escaping."""
    where = "current_schema()" if schema is None else f"'{schema}'"
    key = f"hashtextextended('watchkeeper.events:' || {where}, 0)"
    return f"SELECT pg_advisory_xact_lock_shared({key}), pg_notify('{events_channel(schema)}', '')"


def event_row(r: Any) -> AssetEvent:
    return AssetEvent(r[0], r[1], r[2], decode_value(r[3]), r[4], r[5])


class PostgresConsumers(PostgresPart):
    """The event consumers of PostgreSQL and the events lock (a part of its tasks driver)."""

    async def _lock_events(self, conn: Any) -> None:
        await conn.execute(f"SELECT pg_advisory_xact_lock({LOCK_KEY})", self.schema)

    # -- consumers ---------------------------------------------------------------------------

    async def _aconsumer_position(self, name: str) -> int:
        rows = await self._fetch(
            "reading a consumer",
            f"SELECT cursor FROM {self._prefix}event_consumers WHERE name = $1",
            name,
        )
        return int(rows[0][0]) if rows else 0

    async def _aconsumer_fetch(
        self, name: str, assets: list[str] | None, limit: int
    ) -> list[AssetEvent]:
        wanted, p = assets, self._prefix

        async def fetch(conn: Any) -> list[AssetEvent]:
            await self._lock_events(conn)
            rows = await conn.fetch(
                f"SELECT {EVENT_COLS} FROM {p}asset_events ev WHERE ev.id > coalesce("
                f"(SELECT cursor FROM {p}event_consumers WHERE name = $1), 0) "
                "AND ($2::text[] IS NULL OR ev.asset_name = ANY($2::text[])) ORDER BY ev.id "
                "LIMIT $3",
                name,
                wanted,
                limit,
            )
            return [event_row(r) for r in rows]

        return await self._transact("fetching consumer events", fetch)

    async def _aconsumer_ack(
        self,
        name: str,
        event_id: int,
        state: list[StateWrite],
        expected: int | None,
        writer: Writer | None,
    ) -> int:
        writes, p, now = state, self._prefix, self.clock()
        kind, who, try_number = writer_fields(writer)

        async def ack(conn: Any) -> int:
            await conn.execute(
                f"INSERT INTO {p}event_consumers (name, cursor, updated_at) VALUES ($1, 0, $2) "
                "ON CONFLICT (name) DO NOTHING",
                name,
                now,
            )
            current = await conn.fetchval(
                f"SELECT cursor FROM {p}event_consumers WHERE name = $1 FOR UPDATE", name
            )
            if expected is not None and expected != current:
                raise ConsumerCursorError(name, event_id, current, f"expected {expected}")
            if event_id < current:
                raise ConsumerCursorError(name, event_id, current, "a cursor only moves forward")
            await conn.execute(
                f"UPDATE {p}event_consumers SET cursor = $2, updated_at = $3, writer_kind = $4, "
                "writer_name = $5 WHERE name = $1",
                name, event_id, now, kind, who,
            )  # fmt: skip
            for write in writes:
                await self._put_state(conn, write, now, (kind, who, try_number))
            return event_id

        return await self._transact("acknowledging events", ack)

    async def _put_state(
        self, conn: Any, write: StateWrite, now: Any, who: tuple[Any, ...]
    ) -> None:
        key = write.key
        scope = write.scope
        if isinstance(scope, TaskScope):
            st = self._sql.task
            cols = [[scope.dag_id], [scope.run_id], [scope.task_id], [scope.map_index], [key],
                    [write.value_json], [now], [who[0]], [who[1]], [who[2]], [None], [False]]  # fmt: skip
        else:
            assert isinstance(scope, AssetScope)
            asset_id = await conn.fetchval(
                self._sql.resolve, [scope.asset_id], [scope.name], [scope.uri]
            )
            if asset_id is None:
                raise AssetNotFoundError(str(scope))
            st = self._sql.asset
            cols = [[asset_id], [key], [write.value_json], [now], [who[0]], [who[1]], [who[2]]]
        await conn.fetch(st.upsert, *cols)
