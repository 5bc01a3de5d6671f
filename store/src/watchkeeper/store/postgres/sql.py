"""The SQL of :class:`~watchkeeper.store.PostgresStateBackend`, and its driver-error mapping.

Every statement is built once per backend from the (validated, quoted) schema prefix; values
always travel as ``$n`` parameters. The writes are set-based: a batch of upserts is one
``INSERT … SELECT FROM unnest($1::text[], …) ON CONFLICT … DO UPDATE`` whatever its size,
because on asyncpg the round trips, not the rows, are what a batch costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from .._backend import _utcnow
from .._types import RawEntry, Writer
from ..errors import InvalidValueError, StateStoreError, StoreUnavailableError

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "ASSET_TABLE",
    "TASK_TABLE",
    "Statements",
    "TableSpec",
    "columns",
    "database_clock",
    "is_connection_error",
    "is_unavailable",
    "map_error",
    "raw_entry",
    "resolve_sql",
    "rowcount",
    "writer_fields",
]

_Columns = tuple[tuple[str, str], ...]


def database_clock(clock: Callable[[], datetime]) -> datetime | None:
    """The time to pass to lease statements: ``None`` (they use the database's ``now()``, the
    one clock every process shares) unless the backend was given a clock of its own (tests)."""
    return None if clock is _utcnow else clock()


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A state table: its key columns and data columns (name, element type), ``version`` aside."""

    table: str
    keys: _Columns
    data: _Columns


TASK_TABLE: Final = TableSpec(
    "task_state",
    (("dag_id", "text"), ("run_id", "text"), ("task_id", "text"), ("map_index", "int4"),
     ("key", "text")),
    (("value", "text"), ("updated_at", "timestamptz"), ("writer_kind", "text"),
     ("writer_name", "text"), ("writer_try", "int4"), ("expires_at", "timestamptz"),
     ("never_expire", "bool")),
)  # fmt: skip

ASSET_TABLE: Final = TableSpec(
    "asset_state",
    (("asset_id", "int8"), ("key", "text")),
    (("value", "text"), ("updated_at", "timestamptz"), ("writer_kind", "text"),
     ("writer_name", "text"), ("writer_try", "int4")),
)  # fmt: skip

_ENTRY_COLUMNS: Final = "key, value, version, updated_at, writer_kind, writer_name, writer_try"


def _names(cols: _Columns, alias: str = "") -> str:
    dot = f"{alias}." if alias else ""
    return ", ".join(f"{dot}{name}" for name, _ in cols)


def _unnest(cols: _Columns) -> str:
    args = ", ".join(f"${n}::{kind}[]" for n, (_, kind) in enumerate(cols, 1))
    return f"unnest({args}) AS i({_names(cols)})"


def _join(cols: _Columns) -> str:
    return " AND ".join(f"t.{name} = i.{name}" for name, _ in cols)


def resolve_sql(asset_id: str, name: str, uri: str, p: str) -> str:
    """The id of the active asset a scope names, as the memory backend picks it.

    Memory takes the first active row (in id order) whose id, or name, or (only when the scope
    has no name) URI matches: the least of the three matches. Each term uses an index.
    """
    return (
        f"LEAST((SELECT a.id FROM {p}assets a WHERE a.active AND a.id = {asset_id}), "
        f"(SELECT a.id FROM {p}assets a WHERE a.active AND a.name = {name}), "
        f"(SELECT min(a.id) FROM {p}assets a "
        f"WHERE a.active AND {name} IS NULL AND a.uri = {uri}))"
    )


class StateStatements:
    """The set-based writes of one state table (``i`` is the unnested input, ``t`` the table)."""

    def __init__(self, spec: TableSpec, p: str) -> None:
        t = f"{p}{spec.table}"
        keys, data, both = spec.keys, spec.data, spec.keys + spec.data
        sets = ", ".join(f"{name} = EXCLUDED.{name}" for name, _ in data)
        self.spec = spec
        self.upsert = (
            f"INSERT INTO {t} AS t ({_names(both)}, version) "
            f"SELECT {_names(both, 'i')}, 1 FROM {_unnest(both)} "
            f"ON CONFLICT ({_names(keys)}) DO UPDATE SET {sets}, version = t.version + 1 "
            f"RETURNING {_names(keys, 't')}, t.version"
        )
        self.insert_new = (
            f"INSERT INTO {t} AS t ({_names(both)}, version) "
            f"SELECT {_names(both, 'i')}, 1 FROM {_unnest(both)} "
            f"ON CONFLICT ({_names(keys)}) DO NOTHING "
            f"RETURNING {_names(keys, 't')}, t.version"
        )
        expected = (*both, ("expected", "int8"))
        self.update_if = (
            f"UPDATE {t} AS t SET "
            + ", ".join(f"{name} = i.{name}" for name, _ in data)
            + f", version = t.version + 1 FROM {_unnest(expected)} "
            f"WHERE {_join(keys)} AND t.version = i.expected "
            f"RETURNING {_names(keys, 't')}, t.version"
        )
        self.versions = (
            f"SELECT {_names(keys, 't')}, t.version FROM {t} AS t "
            f"JOIN {_unnest(keys)} ON {_join(keys)}"
        )
        self.delete = (
            f"DELETE FROM {t} AS t USING {_unnest(keys)} WHERE {_join(keys)} "
            f"RETURNING {_names(keys, 't')}"
        )


class Statements:
    """Every statement of the backend, for one schema prefix (``'"wk".'`` or ``''``)."""

    def __init__(self, p: str) -> None:
        self.prefix = p
        self.task = StateStatements(TASK_TABLE, p)
        self.asset = StateStatements(ASSET_TABLE, p)
        task_keys = "dag_id = $1 AND run_id = $2 AND task_id = $3 AND map_index = $4"
        self.task_get = (
            f"SELECT {_ENTRY_COLUMNS}, expires_at, never_expire FROM {p}task_state "
            f"WHERE {task_keys} AND key = $5"
        )
        self.task_list = (
            f"SELECT {_ENTRY_COLUMNS}, expires_at, never_expire FROM {p}task_state "
            f"WHERE {task_keys} ORDER BY key"
        )
        self.task_clear = (
            f"DELETE FROM {p}task_state WHERE dag_id = $1 AND run_id = $2 AND task_id = $3 "
            "AND ($4::bool OR map_index = $5)"
        )
        entry = ", ".join(f"s.{c.strip()}" for c in _ENTRY_COLUMNS.split(","))
        scope = resolve_sql("$1::int8", "$2::text", "$3::text", p)
        self.asset_get = (
            f"SELECT r.id, {entry} FROM (SELECT {scope} AS id) r "
            f"LEFT JOIN {p}asset_state s ON s.asset_id = r.id AND s.key = $4"
        )
        self.asset_list = (
            f"SELECT r.id, {entry} FROM (SELECT {scope} AS id) r "
            f"LEFT JOIN {p}asset_state s ON s.asset_id = r.id ORDER BY s.key"
        )
        self.asset_clear = f"DELETE FROM {p}asset_state WHERE asset_id = $1"
        self.resolve = (
            f"SELECT {resolve_sql('i.asset_id', 'i.name', 'i.uri', p)} "
            "FROM unnest($1::int8[], $2::text[], $3::text[]) WITH ORDINALITY "
            "AS i(asset_id, name, uri, ord) ORDER BY i.ord"
        )
        self.list_events = (
            "SELECT id, asset_name, watcher, payload, dedup_key, created_at "
            f"FROM {p}asset_events WHERE id > $1 AND ($2::text IS NULL OR asset_name = $2) "
            "AND ($4::bigint IS NULL OR id < $4) ORDER BY id LIMIT $3"
        )
        self.list_events_desc = self.list_events.replace("ORDER BY id", "ORDER BY id DESC")
        # Update the known names first, so an insert consumes an identity value only for a
        # new asset (ids stay dense, as in memory); ON CONFLICT covers another daemon's race.
        self.register_assets = f"""
            WITH i AS (
                SELECT name, uri, ord
                FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS i(name, uri, ord)
            ), upd AS (
                UPDATE {p}assets AS a SET uri = i.uri, active = true, updated_at = $3
                FROM i WHERE a.name = i.name RETURNING a.name
            )
            INSERT INTO {p}assets AS a (name, uri, active, created_at, updated_at)
            SELECT i.name, i.uri, true, $3, $3 FROM i
            WHERE i.name NOT IN (SELECT name FROM upd) ORDER BY i.ord
            ON CONFLICT (name) DO UPDATE SET
                uri = EXCLUDED.uri, active = true, updated_at = EXCLUDED.updated_at
        """
        self.deactivate_asset = (
            f"UPDATE {p}assets SET active = false, updated_at = $2 "
            "WHERE name = $1 AND active RETURNING id"
        )
        self.list_assets = (
            f"SELECT id, name, uri, active, updated_at FROM {p}assets "
            "WHERE active OR NOT $1::bool ORDER BY name"
        )
        # Leases. Every statement that locks lease rows locks them in trigger_id order (the
        # writer's fence check, a claim, a release), so two daemons never deadlock on them.
        # The fence check takes FOR SHARE: a claim by another daemon (FOR UPDATE) waits until
        # the fenced batch has committed, so the new holder reads what the old one wrote.
        # The expiry is the holder's node lease's (NULL once reaped), compared with now().
        self.lock_leases_shared = (
            "SELECT l.trigger_id, l.owner, l.token, n.expires_at, now() "
            f"FROM {p}trigger_leases l LEFT JOIN {p}trigger_nodes n "
            "ON n.owner = l.owner AND n.alive "
            "WHERE l.trigger_id = ANY($1::text[]) ORDER BY l.trigger_id FOR SHARE OF l"
        )
        self.clock_param: Callable[[], datetime | None] = lambda: None
        """The lease clock: None for the database's ``now()`` (set by the backend)."""


def writer_fields(writer: Writer | None) -> tuple[str | None, str | None, int | None]:
    if writer is None:
        return None, None, None
    return writer.kind, writer.name, writer.try_number


def _writer(kind: str | None, name: str | None, try_number: int | None) -> Writer | None:
    if kind is None or name is None:
        return None
    return Writer(kind, name, try_number)  # type: ignore[arg-type]


def raw_entry(row: asyncpg.Record, offset: int = 0, *, task: bool) -> RawEntry:
    """A :class:`RawEntry` from a row holding the entry columns from ``offset`` on."""
    r = tuple(row)[offset:]
    updated_at: datetime = r[3]
    return RawEntry(
        key=r[0],
        value_json=r[1],
        version=r[2],
        updated_at=updated_at,
        writer=_writer(r[4], r[5], r[6]),
        expires_at=r[7] if task else None,
        never_expire=r[8] if task else False,
    )


def rowcount(status: str) -> int:
    """The row count of a command status such as ``'DELETE 3'``."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the server or the connection is gone, not a bad statement."""
    import asyncpg

    # InternalClientError: asyncpg's protocol state after the server dropped the session
    # (seen as "cannot switch to state 12; another operation (2) is in progress").
    return isinstance(
        exc,
        OSError
        | TimeoutError
        | asyncpg.PostgresConnectionError
        | asyncpg.InterfaceError
        | asyncpg.InternalClientError
        | asyncpg.exceptions.OperatorInterventionError
        | asyncpg.exceptions.InsufficientResourcesError
        | asyncpg.exceptions.CannotConnectNowError
        | asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
    )


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the server cannot serve us now, whatever the statement's data.

    The lost connections of :func:`is_connection_error`, and two refusals of a live server:
    a database that does not accept connections (``ALLOW_CONNECTIONS false``, SQLSTATE 55000
    exactly: its subclasses are about locks and objects) and a read-only transaction (25006:
    a standby, or a primary demoted by a failover).
    """
    import asyncpg

    return (
        isinstance(exc, StoreUnavailableError)  # raised by our own checks (a ping)
        or is_connection_error(exc)
        or isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError)
        or type(exc) is asyncpg.exceptions.ObjectNotInPrerequisiteStateError
    )


def map_error(exc: BaseException, what: str) -> StateStoreError:
    """Our error for a driver error met while doing ``what``; the caller chains ``exc``.

    A server that cannot serve us now (:func:`is_unavailable`) becomes
    :class:`StoreUnavailableError`, data PostgreSQL refuses :class:`InvalidValueError` (the
    store's own checks refuse NUL characters and lone surrogates first, the same way on every
    backend), anything else a plain :class:`StateStoreError`. Callers never see an asyncpg type.
    """
    import asyncpg

    if isinstance(exc, StateStoreError):
        return exc
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if is_unavailable(exc):
        error: StateStoreError = StoreUnavailableError(f"PostgreSQL unavailable ({what}): {detail}")
    elif isinstance(exc, asyncpg.DataError | UnicodeError):
        error = InvalidValueError(f"PostgreSQL rejected the data ({what}): {detail}")
    else:
        error = StateStoreError(f"PostgreSQL error ({what}): {detail}")
    error.__cause__ = exc
    return error


def columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Transpose rows into ``width`` column lists (the arrays ``unnest`` takes)."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(col) for col in zip(*rows, strict=True)]
