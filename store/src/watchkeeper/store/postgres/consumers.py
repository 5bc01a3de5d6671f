"""The events lock and the event commits' NOTIFY of :class:`~watchkeeper.store.PostgresStateBackend`
(the consumers themselves are :mod:`watchkeeper.store.sql.tasks`').

Every transaction inserting events holds the commit-order lock shared and sends one NOTIFY per
batch (:func:`events_prelude`, sent with the group writer's ``BEGIN``; :func:`events_hook`, the
same run by a finish with outlets); a reader past a cursor takes it exclusively first
(:func:`events_lock`): see :mod:`.tasks` for why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._types import AssetEvent
from .._values import decode_value
from .part import PostgresPart

__all__ = [
    "EVENT_COLS",
    "PostgresConsumers",
    "event_row",
    "events_channel",
    "events_hook",
    "events_lock",
    "events_prelude",
]

T = TypeVar("T")

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


def _events_key(schema: str | None) -> str:
    """The events lock's key with the schema written in: a plain identifier
    (:func:`~.schema.check_schema_name`), so nothing in it needs escaping."""
    where = "current_schema()" if schema is None else f"'{schema}'"
    return f"hashtextextended('watchkeeper.events:' || {where}, 0)"


def events_prelude(schema: str | None) -> str:
    """:func:`events_hook`'s statement with its values written in (no parameters), so the
    group writer can send it in one message with its ``BEGIN``. The channel is a plain
    identifier too."""
    key = _events_key(schema)
    return f"SELECT pg_advisory_xact_lock_shared({key}), pg_notify('{events_channel(schema)}', '')"


def events_lock(schema: str | None) -> str:
    """The statement that takes the events lock exclusively until the transaction ends: it
    waits for every transaction inserting events (each holds it shared) to end, so every
    event below the newest id read after it has committed or rolled back."""
    return f"SELECT pg_advisory_xact_lock({_events_key(schema)})"


def event_row(r: Any) -> AssetEvent:
    return AssetEvent(r[0], r[1], r[2], decode_value(r[3]), r[4], r[5])


class PostgresConsumers(PostgresPart):
    """The events lock, taken exclusively (a part of the runs driver)."""

    async def _lock_events(self, conn: Any) -> None:
        await conn.execute(f"SELECT pg_advisory_xact_lock({LOCK_KEY})", self.schema)
