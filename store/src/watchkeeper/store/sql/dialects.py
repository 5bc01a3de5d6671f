"""The two dialects: where SQLite's and PostgreSQL's SQL must differ, and nowhere else.

==================  ==========================================  =================================
fragment            SQLite                                      PostgreSQL
==================  ==========================================  =================================
parameter *n*       ``?n``                                      ``$n``
``{now}``           the batch's time (text, bound)              ``coalesce(clock, now())``
``{expires}``       the batch's time + ``ttl`` s (text, bound)  ``{now} + ttl * interval '1 s'``
``{in:x}``          ``IN (SELECT value FROM json_each(x))``     ``= ANY(x::text[])``
``{each:x:e}``      ``json_each(x) AS e``                       ``unnest(x::text[]) AS e(value)``
``{list:x}``        JSON text                                   an array
``{ts:x}``          fixed-width UTC ISO text                    ``timestamptz``
``{iso:x}``         ISO text with its own offset                ``timestamptz``
``{order}``         ``rowid`` (insertion order)                 ``NULL`` (reports sort by key)
row locks           nothing (the writer holds the write lock)   ``FOR UPDATE``, ``SKIP LOCKED``...
timestamps          fixed-width UTC ISO text                    ``timestamptz``
==================  ==========================================  =================================

A list parameter is JSON text on SQLite, a list on PostgreSQL; an optional element type
(``{in:x:bigint}``) is PostgreSQL's array type. SQLite's connections have ``md5`` (as
PostgreSQL's), registered when they open, so an order by ``md5(...)`` is the same on both.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

from .engine import Dialect

__all__ = ["POSTGRES", "SQLITE", "sqlite_text"]


def sqlite_text(value: datetime) -> str:
    """A datetime as SQLite's columns keep it: fixed-width UTC ISO text (naive is UTC)."""
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.isoformat(timespec="microseconds")


def _sqlite_stamp(value: datetime | None) -> str | None:
    return None if value is None else sqlite_text(value)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()  # its own offset kept: reads back equal


def _json(values: Any) -> str:
    return json.dumps(list(values))


def _postgres_timestamp(value: Any) -> datetime:
    result: datetime = value
    return result


SQLITE: Final = Dialect(
    "sqlite",
    param=lambda n: f"?{n}",
    fragments={
        "now": ":now",
        "expires": ":expires",
        "in": lambda name, kind="text": f"IN (SELECT value FROM json_each(:{name}))",
        "each": lambda name, alias, kind="text": f"json_each(:{name}) AS {alias}",
        "for_update": "",
        "for_update_of": lambda alias: "",
        "skip_locked": "",
        "for_share": "",
        "for_share_of": lambda alias: "",
        "ts": lambda name: f":{name}",
        "iso": lambda name: f":{name}",
        "list": lambda name: f":{name}",
        "order": lambda alias="": f"{alias}.rowid" if alias else "rowid",
    },
    encoders={"in": _json, "each": _json, "list": _json, "ts": _sqlite_stamp, "iso": _iso},
    timestamp=datetime.fromisoformat,  # the stored text is ISO (no wrapper: a hot path)
    json_list=json.loads,
    row_locks=False,
)

_PG_NOW: Final = "coalesce(:now::timestamptz, now())"

POSTGRES: Final = Dialect(
    "postgresql",
    param=lambda n: f"${n}",
    fragments={
        "now": _PG_NOW,
        "expires": f"({_PG_NOW} + :ttl * interval '1 second')",
        "in": lambda name, kind="text": f"= ANY(:{name}::{kind}[])",
        "each": lambda name, alias, kind="text": f"unnest(:{name}::{kind}[]) AS {alias}(value)",
        "for_update": "FOR UPDATE",
        "for_update_of": lambda alias: f"FOR UPDATE OF {alias}",
        "skip_locked": "SKIP LOCKED",
        "for_share": "FOR SHARE",
        "for_share_of": lambda alias: f"FOR SHARE OF {alias}",
        "ts": lambda name: f":{name}",
        "iso": lambda name: f":{name}",
        "list": lambda name: f":{name}",
        "order": lambda alias="": "NULL",
    },
    encoders={"in": list, "each": list, "list": list},
    timestamp=_postgres_timestamp,
    json_list=list,
    row_locks=True,
)
