"""The database side of :class:`SqlTableWatcher`: one driver per database, behind one interface.

A :class:`Driver` says which DSNs are its own, how it quotes an identifier, how it writes a
parameter's placeholder and a "key not among these" condition, and how to open a connection: a
:class:`Source`, whose query failures all surface as :class:`SqlSourceError`. The watcher writes
its queries once, through a :class:`Query`, for every driver.

Three drivers: SQLite through aiosqlite (``sqlite:///relative.db``, ``sqlite:////abs/path.db``,
opened read-only so a mistyped path never creates a database), PostgreSQL through asyncpg
(``postgresql://`` or ``postgres://``) and MySQL/MariaDB through aiomysql (``mysql://`` or
``mariadb://``, the ``mysql`` extra). Another database is one more :class:`Driver` subclass
(and its :class:`Source`) listed in :data:`DRIVERS`. Values always travel as parameters;
identifiers are checked against a strict pattern and quoted, never formatted raw.
"""

from __future__ import annotations

import abc
import contextlib
import json
import math
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar
from urllib.parse import quote, unquote, urlsplit

import anyio
import anyio.to_thread
from watchkeeper.store.protocols import redact_dsn
from watchkeeper.triggerer import TriggererError

from ._common import import_off_loop
from ._sql_values import check_identifier, check_table, json_row, to_json_value

__all__ = [
    "DRIVERS",
    "Driver",
    "MysqlDriver",
    "PostgresDriver",
    "Query",
    "Source",
    "SqlSourceError",
    "SqliteDriver",
    "check_identifier",
    "check_table",
    "driver_for",
    "json_row",
    "redact_dsn",
    "to_json_value",
]

_CLOSE_TIMEOUT = 5.0


class SqlSourceError(TriggererError, RuntimeError):
    """Raised when the watched database cannot be opened or a watcher query fails.

    The driver's own exception is chained as ``__cause__``; callers need not import aiosqlite
    or asyncpg to catch it. ``transient`` is true when the server could not be reached or the
    connection was lost or went silent (a new connection may work), false when the database
    refused what was asked (a missing table, bad credentials).
    """

    def __init__(
        self, table: str, action: str, cause: BaseException, *, transient: bool = False
    ) -> None:
        super().__init__(f"table {table!r}: {action} failed: {type(cause).__name__}: {cause}")
        self.table = table
        self.transient = transient


# -- what every driver shares ---------------------------------------------------------------------


class Query:
    """The parameters of one statement being written, each placed by the driver's syntax."""

    __slots__ = ("driver", "params")

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.params: list[Any] = []

    def param(self, value: Any) -> str:
        """Add ``value`` as the next parameter and return its placeholder."""
        self.params.append(value)
        return self.driver.placeholder(len(self.params))

    def not_among(self, column: str, keys: Sequence[Any]) -> str:
        """A condition: ``column`` (quoted) is none of ``keys``, which become parameters."""
        return self.driver.not_among(self, column, keys)


class Source(abc.ABC):
    """An open connection to the watched database; query failures become SqlSourceError.

    ``errors`` are the driver's exception types for database-side failures. Each query must
    answer within ``timeout`` seconds: a server that went silent (a dropped network path keeps
    a connection open without a byte ever coming back) fails the query with
    :class:`SqlSourceError` instead of holding the watcher forever, and the connection, which
    may still deliver the abandoned answer, is dropped rather than closed politely.
    """

    def __init__(
        self,
        connection: Any,
        table: str,
        errors: tuple[type[BaseException], ...],
        *,
        timeout: float = math.inf,
        where: str = "",
    ) -> None:
        self._connection = connection
        self._table = table
        self._errors = errors
        self._timeout = timeout
        self._where = where
        self._closed = False
        self._broken = False

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Run one SELECT and return its rows as dicts of column name to driver value."""
        action = f"reading rows from {self._where}" if self._where else "reading rows"
        try:
            with anyio.fail_after(self._timeout):
                return await self._fetch(sql, params)
        except TimeoutError as exc:
            self._broken = True
            silent = TimeoutError(f"no answer within {self._timeout:g} s")
            raise SqlSourceError(self._table, action, silent, transient=True) from exc
        except self._errors as exc:
            lost = self._lost(exc)
            self._broken = self._broken or lost
            raise SqlSourceError(self._table, action, exc, transient=lost) from exc

    def _lost(self, exc: BaseException) -> bool:
        """True when ``exc`` says the connection is gone (not that the query was refused)."""
        return isinstance(exc, OSError)

    async def aclose(self) -> None:
        """Close the connection (drop it, after a query that timed out); a second call does
        nothing."""
        if self._closed:
            return
        self._closed = True
        if self._broken:
            self._abort()
        else:
            await self._close()

    async def _close(self) -> None:
        await self._connection.close()

    def _abort(self) -> None:
        """Drop the connection at once, without a word to the server."""
        self._connection.close()

    @abc.abstractmethod
    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]: ...


class Driver(abc.ABC):
    """One kind of database: its DSNs, its SQL spelling, and how to connect."""

    name: ClassVar[str]
    prefixes: ClassVar[tuple[str, ...]]
    """How its DSNs start, as shown in the error for a DSN no driver takes."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    @abc.abstractmethod
    def target(self, owner: str, dsn: str) -> str | None:
        """What to connect to, if ``dsn`` is this driver's (a bad one raises); else None."""

    def quote(self, identifier: str) -> str:
        """Quote an identifier already checked by :func:`check_identifier`."""
        return f'"{identifier}"'

    @abc.abstractmethod
    def placeholder(self, index: int) -> str:
        """The placeholder of the ``index``-th parameter (1-based)."""

    @abc.abstractmethod
    def not_among(self, query: Query, column: str, keys: Sequence[Any]) -> str:
        """See :meth:`Query.not_among`."""

    @abc.abstractmethod
    def open(
        self, target: str, table: str, bound: float = math.inf
    ) -> contextlib.AbstractAsyncContextManager[Source]:
        """Open the database for the duration of the block; closed however it ends.

        Connecting, and then each query, must finish within ``bound`` seconds, else
        :class:`SqlSourceError`.
        """


# -- SQLite ---------------------------------------------------------------------------------------


class _SqliteSource(Source):
    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        async with self._connection.execute(sql, tuple(params)) as cursor:
            rows = await cursor.fetchall()
            names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in rows]

    def _abort(self) -> None:
        """aiosqlite has no abrupt close: ask its thread to close after the query it runs."""
        self._connection.stop()


class SqliteDriver(Driver):
    """SQLite files through aiosqlite, opened read-only."""

    name = "sqlite"
    prefixes = ("sqlite:///",)

    def target(self, owner: str, dsn: str) -> str | None:
        if not dsn.startswith("sqlite:///"):
            return None
        path = dsn[len("sqlite:///") :]
        if not path or path == "/":
            raise ValueError(f"{owner}: dsn {dsn!r} names no database file")
        if path == ":memory:":
            raise ValueError(f"{owner}: dsn {dsn!r} is an in-memory database nobody else writes")
        return path

    def placeholder(self, index: int) -> str:
        return "?"

    def not_among(self, query: Query, column: str, keys: Sequence[Any]) -> str:
        return (
            f"{column} NOT IN (SELECT value FROM json_each({query.param(json.dumps(list(keys)))}))"
        )

    @contextlib.asynccontextmanager
    async def open(self, target: str, table: str, bound: float = math.inf) -> AsyncIterator[Source]:
        await import_off_loop("aiosqlite")
        import aiosqlite

        action = f"opening SQLite database {target!r}"
        if not await anyio.Path(target).is_file():
            missing = FileNotFoundError(f"no database file at {target!r}")
            raise SqlSourceError(table, action, missing) from missing
        uri = f"file:{quote(target, safe='/')}?mode=ro"
        pending = aiosqlite.connect(uri, uri=True)
        try:
            connection = await pending
        except sqlite3.Error as exc:
            # aiosqlite stops its worker thread after a failed connect but does not wait for
            # it; a thread still finishing when the loop closes dies with "Event loop is closed".
            worker = getattr(pending, "_thread", None)
            if worker is not None:
                with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                    await anyio.to_thread.run_sync(worker.join)
            raise SqlSourceError(table, action, exc) from exc
        source = _SqliteSource(connection, table, (sqlite3.Error,), timeout=bound)
        async with _closing(source):
            yield source


# -- PostgreSQL -----------------------------------------------------------------------------------


class _PostgresSource(Source):
    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        records = await self._connection.fetch(sql, *params)
        return [dict(record) for record in records]

    def _abort(self) -> None:
        self._connection.terminate()

    def _lost(self, exc: BaseException) -> bool:
        return _postgres_lost(exc)


def _postgres_lost(exc: BaseException) -> bool:
    import asyncpg.exceptions as pg

    lost = (
        OSError,
        pg.InterfaceError,  # the connection is closed
        pg.PostgresConnectionError,
        pg.CannotConnectNowError,
        pg.TooManyConnectionsError,
        pg.AdminShutdownError,
        pg.CrashShutdownError,
    )
    return isinstance(exc, lost)


class PostgresDriver(Driver):
    """PostgreSQL through asyncpg."""

    name = "postgres"
    prefixes = ("postgresql://",)

    def target(self, owner: str, dsn: str) -> str | None:
        scheme = dsn.partition(":")[0].lower()
        if scheme not in {"postgresql", "postgres"} or not dsn[len(scheme) :].startswith("://"):
            return None
        if len(dsn) == len(scheme) + 3:
            raise ValueError(f"{owner}: dsn {redact_dsn(dsn)!r} names no server")
        return dsn

    def placeholder(self, index: int) -> str:
        return f"${index}"

    def not_among(self, query: Query, column: str, keys: Sequence[Any]) -> str:
        return f"{column} <> ALL({query.param(list(keys))})"

    @contextlib.asynccontextmanager
    async def open(self, target: str, table: str, bound: float = math.inf) -> AsyncIterator[Source]:
        await import_off_loop("asyncpg")
        import asyncpg

        where = repr(redact_dsn(target))
        try:
            with anyio.fail_after(bound):
                connection = await asyncpg.connect(
                    target, timeout=min(bound, 60.0), command_timeout=None
                )
        except TimeoutError as exc:
            silent = TimeoutError(f"no answer within {bound:g} s")
            raise SqlSourceError(table, f"connecting to {where}", silent, transient=True) from exc
        except (OSError, asyncpg.PostgresError) as exc:
            lost = _postgres_lost(exc)
            raise SqlSourceError(table, f"connecting to {where}", exc, transient=lost) from exc
        errors = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)
        source = _PostgresSource(connection, table, errors, timeout=bound, where=where)
        async with _closing(source):
            yield source


# -- MySQL / MariaDB ------------------------------------------------------------------------------


class _MysqlSource(Source):
    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        async with self._connection.cursor() as cursor:
            await cursor.execute(sql, tuple(params))
            rows = await cursor.fetchall()
            names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in rows]

    def _lost(self, exc: BaseException) -> bool:
        return _mysql_lost(exc)

    async def _close(self) -> None:
        """Say goodbye to the server (COM_QUIT); a connection that cannot is just dropped."""
        try:
            await self._connection.ensure_closed()
        except self._errors:  # the driver's errors and OSError
            self._connection.close()


class MysqlDriver(Driver):
    """MySQL and MariaDB through aiomysql, in autocommit mode.

    Autocommit matters: InnoDB's default isolation (REPEATABLE READ) would otherwise keep the
    first poll's snapshot for the life of the connection, and no later row would ever show.
    """

    name = "mysql"
    prefixes = ("mysql://", "mariadb://")

    def target(self, owner: str, dsn: str) -> str | None:
        scheme = dsn.partition(":")[0].lower()
        if scheme not in {"mysql", "mariadb"} or not dsn[len(scheme) :].startswith("://"):
            return None
        try:
            parts = urlsplit(dsn)
            parts.port  # noqa: B018 - parsing it is the check
        except ValueError as exc:
            raise ValueError(
                f"{owner}: dsn {redact_dsn(dsn)!r} is not a valid URL: {exc}"
            ) from None
        if not parts.hostname:
            raise ValueError(f"{owner}: dsn {redact_dsn(dsn)!r} names no server")
        return dsn

    def quote(self, identifier: str) -> str:
        return f"`{identifier}`"

    def placeholder(self, index: int) -> str:
        return "%s"

    def not_among(self, query: Query, column: str, keys: Sequence[Any]) -> str:
        return f"{column} NOT IN ({', '.join(query.param(key) for key in keys)})"

    @contextlib.asynccontextmanager
    async def open(self, target: str, table: str, bound: float = math.inf) -> AsyncIterator[Source]:
        await import_off_loop("aiomysql", "pymysql")
        import aiomysql  # type: ignore[import-untyped] # no stubs published
        import pymysql  # type: ignore[import-untyped] # no stubs installed

        parts = urlsplit(target)
        errors = (pymysql.err.MySQLError, OSError)
        where = repr(redact_dsn(target))
        try:
            with anyio.fail_after(bound):
                connection = await aiomysql.connect(
                    host=parts.hostname or "localhost",
                    port=parts.port or 3306,
                    user=unquote(parts.username) if parts.username else None,
                    password=unquote(parts.password) if parts.password else "",
                    db=unquote(parts.path.lstrip("/")) or None,
                    charset="utf8mb4",
                    autocommit=True,
                    connect_timeout=min(bound, 60.0),
                )
        except TimeoutError as exc:
            silent = TimeoutError(f"no answer within {bound:g} s")
            raise SqlSourceError(table, f"connecting to {where}", silent, transient=True) from exc
        except errors as exc:
            lost = _mysql_lost(exc)
            raise SqlSourceError(table, f"connecting to {where}", exc, transient=lost) from exc
        source = _MysqlSource(connection, table, errors, timeout=bound, where=where)
        async with _closing(source):
            yield source


_MYSQL_LOST = frozenset({1040, 1053, 2003, 2006, 2013, 2055})
"""Too many connections, server shutdown, cannot connect, server gone, connection lost."""


def _mysql_lost(exc: BaseException) -> bool:
    import pymysql

    if isinstance(exc, OSError | pymysql.err.InterfaceError):
        return True
    code = exc.args[0] if isinstance(exc, pymysql.err.OperationalError) and exc.args else None
    return code in _MYSQL_LOST


# -- choosing one ---------------------------------------------------------------------------------

DRIVERS: tuple[Driver, ...] = (SqliteDriver(), PostgresDriver(), MysqlDriver())
"""Every driver, asked in this order whether a DSN is its own."""


def driver_for(owner: str, dsn: object) -> tuple[Driver, str]:
    """Return ``(driver, target)`` for ``dsn``; a DSN no driver takes is a clear ``ValueError``."""
    if not isinstance(dsn, str):
        raise TypeError(f"{owner}: dsn must be a str, got {type(dsn).__name__}")
    for driver in DRIVERS:
        target = driver.target(owner, dsn)
        if target is not None:
            return driver, target
    prefixes = " or ".join(repr(prefix) for driver in DRIVERS for prefix in driver.prefixes)
    raise ValueError(f"{owner}: dsn must start with {prefixes}, got {redact_dsn(dsn)!r}")


@contextlib.asynccontextmanager
async def _closing(source: Source) -> AsyncIterator[Source]:
    try:
        yield source
    finally:
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await source.aclose()
