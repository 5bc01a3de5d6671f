"""The database side of :class:`SqlTableWatcher`: DSNs, identifiers, connections, JSON values.

Two dialects: SQLite through aiosqlite (``sqlite:///relative.db``, ``sqlite:////abs/path.db``,
opened read-only so a mistyped path never creates a database) and PostgreSQL through asyncpg
(``postgresql://`` or ``postgres://``). Values always travel as parameters (``?`` or ``$n``);
identifiers are checked against a strict pattern and double-quoted, never formatted raw.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import json
import math
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, Protocol
from urllib.parse import quote

import anyio
import anyio.to_thread
from watchkeeper.store import redact_dsn
from watchkeeper.triggerer import TriggererError

__all__ = [
    "Dialect",
    "Source",
    "SqlSourceError",
    "driver_errors",
    "open_source",
    "parse_dsn",
    "quote_identifier",
    "quote_table",
    "redact_dsn",
    "to_json_value",
]

Dialect = Literal["sqlite", "postgres"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_CLOSE_TIMEOUT = 5.0


class SqlSourceError(TriggererError, RuntimeError):
    """Raised when the watched database cannot be opened or a watcher query fails.

    The driver's own exception is chained as ``__cause__``; callers need not import aiosqlite
    or asyncpg to catch it.
    """

    def __init__(self, table: str, action: str, cause: BaseException) -> None:
        super().__init__(f"table {table!r}: {action} failed: {type(cause).__name__}: {cause}")
        self.table = table


def parse_dsn(owner: str, dsn: object) -> tuple[Dialect, str]:
    """Return ``(dialect, target)``: the SQLite file path, or the PostgreSQL DSN itself."""
    if not isinstance(dsn, str):
        raise TypeError(f"{owner}: dsn must be a str, got {type(dsn).__name__}")
    if dsn.startswith("sqlite:///"):
        path = dsn[len("sqlite:///") :]
        if not path or path == "/":
            raise ValueError(f"{owner}: dsn {dsn!r} names no database file")
        if path == ":memory:":
            raise ValueError(f"{owner}: dsn {dsn!r} is an in-memory database nobody else writes")
        return "sqlite", path
    scheme = dsn.partition(":")[0].lower()
    if scheme in {"postgresql", "postgres"} and dsn[len(scheme) :].startswith("://"):
        if len(dsn) == len(scheme) + 3:
            raise ValueError(f"{owner}: dsn {redact_dsn(dsn)!r} names no server")
        return "postgres", dsn
    raise ValueError(
        f"{owner}: dsn must start with 'sqlite:///' or 'postgresql://', got {redact_dsn(dsn)!r}"
    )


def quote_identifier(owner: str, name: str, value: object) -> str:
    """Check a column name against ``[A-Za-z_][A-Za-z0-9_]*`` (63 at most) and quote it.

    Quoting keeps reserved words usable and makes the match exact: PostgreSQL folds unquoted
    names to lower case when a table is created, so ``Events`` must be given as ``events``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{owner}: {name} must be a str, got {type(value).__name__}")
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(
            f"{owner}: {name} {value!r} is not a plain SQL identifier (letters, digits and "
            "underscores, not starting with a digit, at most 63 characters)"
        )
    return f'"{value}"'


def quote_table(owner: str, value: object) -> str:
    """Check and quote a table name, optionally qualified by one schema: ``schema.table``."""
    if not isinstance(value, str):
        raise TypeError(f"{owner}: table must be a str, got {type(value).__name__}")
    parts = value.split(".")
    if len(parts) > 2:
        raise ValueError(f"{owner}: table {value!r} has more than one '.' (use schema.table)")
    return ".".join(quote_identifier(owner, "table", part) for part in parts)


def to_json_value(value: Any) -> Any:
    """Turn one database value into JSON: timestamps as ISO 8601, bytes as base64, and so on.

    Decimals become strings (no precision is lost), non-finite floats become the strings
    ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, intervals become seconds.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(item) for item in value]
    return str(value)


class Source(Protocol):
    """An open connection to the watched database, in one dialect."""

    dialect: Dialect

    def param(self, index: int) -> str:
        """The placeholder of the ``index``-th parameter (1-based)."""

    def not_among(self, column: str, index: int) -> str:
        """A condition: ``column`` is not in the list passed as parameter ``index``."""

    def keys_param(self, keys: Sequence[Any]) -> Any:
        """The list of keys as that parameter's value."""

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Run one SELECT and return its rows as dicts of column name to driver value."""

    async def aclose(self) -> None:
        """Close the connection; a second call does nothing."""


class _SqliteSource:
    dialect: Dialect = "sqlite"

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._closed = False

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._connection.close()

    def param(self, index: int) -> str:
        return "?"

    def not_among(self, column: str, index: int) -> str:
        return f"{column} NOT IN (SELECT value FROM json_each(?))"

    def keys_param(self, keys: Sequence[Any]) -> Any:
        return json.dumps(list(keys))

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        async with self._connection.execute(sql, tuple(params)) as cursor:
            rows = await cursor.fetchall()
            names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in rows]


class _PostgresSource:
    dialect: Dialect = "postgres"

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._closed = False

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._connection.close()

    def param(self, index: int) -> str:
        return f"${index}"

    def not_among(self, column: str, index: int) -> str:
        return f"{column} <> ALL(${index})"

    def keys_param(self, keys: Sequence[Any]) -> Any:
        return list(keys)

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        records = await self._connection.fetch(sql, *params)
        return [dict(record) for record in records]


@contextlib.asynccontextmanager
async def open_source(dialect: Dialect, target: str, table: str) -> AsyncIterator[Source]:
    """Open the watched database for the duration of the block; closed however it ends."""
    if dialect == "sqlite":
        async with _open_sqlite(target, table) as source:
            yield source
    else:
        async with _open_postgres(target, table) as source:
            yield source


@contextlib.asynccontextmanager
async def _open_sqlite(path: str, table: str) -> AsyncIterator[Source]:
    import aiosqlite

    action = f"opening SQLite database {path!r}"
    if not await anyio.Path(path).is_file():
        missing = FileNotFoundError(f"no database file at {path!r}")
        raise SqlSourceError(table, action, missing) from missing
    uri = f"file:{quote(path, safe='/')}?mode=ro"
    pending = aiosqlite.connect(uri, uri=True)
    try:
        connection = await pending
    except sqlite3.Error as exc:
        # aiosqlite stops its worker thread after a failed connect but does not wait for it;
        # a thread still finishing when the loop closes dies with "Event loop is closed".
        worker = getattr(pending, "_thread", None)
        if worker is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await anyio.to_thread.run_sync(worker.join)
        raise SqlSourceError(table, action, exc) from exc
    source = _SqliteSource(connection)
    try:
        yield source
    finally:
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await source.aclose()


@contextlib.asynccontextmanager
async def _open_postgres(dsn: str, table: str) -> AsyncIterator[Source]:
    import asyncpg

    try:
        connection = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError) as exc:
        raise SqlSourceError(table, f"connecting to {redact_dsn(dsn)!r}", exc) from exc
    source = _PostgresSource(connection)
    try:
        yield source
    finally:
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await source.aclose()


def driver_errors(dialect: Dialect) -> tuple[type[BaseException], ...]:
    """The exception types a query of this dialect raises for database-side failures."""
    if dialect == "sqlite":
        return (sqlite3.Error,)
    import asyncpg

    return (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)
