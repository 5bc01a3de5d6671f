"""The server side of :class:`~watchkeeper.watchers.PostgresChangesWatcher`: one connection to
the watched database, every statement on it bounded and its failures translated, and the set-up
a first start does (logical decoding on, the publication and the slot made when missing).

A failure is a :class:`PostgresChangesError`, ``transient`` when a new connection may cure it
(the server unreachable, the connection lost or silent, the slot held by another session for
a moment): the watcher then retries with backoff. The DSN's password is masked in every message.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggererError

from ._broker import scrub, url_secrets
from ._sql import check_table, redact_dsn

__all__ = ["PostgresChangesError", "SlotSession"]

log = get_logger(__name__)

T = TypeVar("T")

_CLOSE_TIMEOUT = 5.0


class PostgresChangesError(TriggererError, RuntimeError):
    """Raised when :class:`PostgresChangesWatcher` cannot reach the database, or the database
    refuses what the watcher needs (logical decoding, its slot, its publication).

    ``transient`` is true when the server could not be reached, the connection was lost or
    went silent, or the slot is busy (a new attempt may work: the watcher retries by itself);
    false when the server refused (``run()`` raises it). The driver's exception is chained as
    ``__cause__``; the DSN's password never appears in the message.
    """

    def __init__(
        self, owner: str, action: str, cause: BaseException | str, *, transient: bool = False
    ) -> None:
        reason = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"{owner}: {action} failed: {reason}")
        self.transient = transient


class SlotSession:
    """One watcher's connection to the watched database (at most one open at a time).

    :param owner: how messages name the watcher.
    :param dsn: the database, its password never shown.
    :param slot: the logical replication slot.
    :param publication: the publication read (made of ``tables`` when given and missing).
    :param tables: the tables to publish, or ``None`` for an existing publication.
    :param timeout: seconds connecting and each statement may take.
    """

    def __init__(
        self,
        owner: str,
        dsn: str,
        slot: str,
        publication: str,
        tables: list[str] | None,
        timeout: float,
    ) -> None:
        self.owner = owner
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.tables = tables
        self.timeout = timeout
        self.secrets = url_secrets(dsn)
        self.connection: Any = None
        """The open asyncpg connection, or None."""
        self.broken = False
        """Whether the connection must be dropped rather than closed."""

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[Any]:
        import asyncpg

        where = f"connecting to {redact_dsn(self.dsn)!r}"
        self.broken = False
        timeout = self.timeout
        try:
            with anyio.fail_after(timeout):
                connection = await asyncpg.connect(
                    self.dsn,
                    timeout=min(timeout, 60.0),
                    command_timeout=None,
                    server_settings={
                        "application_name": "watchkeeper-changes",
                        # The server gives up a statement when we do, so a peek abandoned for
                        # its slowness does not keep the slot held after we left.
                        "statement_timeout": str(max(1, round(timeout * 1000))),
                    },
                )
        except TimeoutError as exc:
            silent = f"TimeoutError: no answer within {timeout:g} s"
            raise PostgresChangesError(self.owner, where, silent, transient=True) from exc
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self.error(where, exc) from exc
        self.connection = connection
        try:
            yield connection
        finally:
            await self.close()

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is None:
            return
        if self.broken:
            connection.terminate()  # a statement may still be running: drop it, say nothing
            return
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            try:
                await connection.close(timeout=_CLOSE_TIMEOUT)
            except Exception:  # noqa: BLE001 - a connection that cannot close politely is dropped
                connection.terminate()

    def error(self, action: str, exc: BaseException) -> PostgresChangesError:
        import asyncpg.exceptions as pg

        lost = (
            OSError,
            pg.InterfaceError,
            pg.PostgresConnectionError,
            pg.CannotConnectNowError,
            pg.TooManyConnectionsError,
            pg.AdminShutdownError,
            pg.CrashShutdownError,
            pg.ObjectInUseError,  # the slot is held by another session (one being dropped)
            pg.QueryCanceledError,  # statement_timeout: the same as our own timeout
            pg.DuplicateObjectError,  # another process created the slot at the same moment
            pg.UniqueViolationError,  # the same, for a publication
        )
        transient = isinstance(exc, lost)
        if isinstance(exc, OSError | pg.InterfaceError):
            self.broken = True
        reason = scrub(f"{type(exc).__name__}: {exc}", self.secrets)
        return PostgresChangesError(self.owner, action, reason, transient=transient)

    async def call(self, action: str, call: Awaitable[T]) -> T:
        """``await call`` within ``timeout``; a failure becomes :class:`PostgresChangesError`."""
        import asyncpg

        try:
            with anyio.fail_after(self.timeout):
                return await call
        except TimeoutError as exc:
            self.broken = True
            silent = f"TimeoutError: no answer within {self.timeout:g} s"
            raise PostgresChangesError(self.owner, action, silent, transient=True) from exc
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self.error(action, exc) from exc

    async def prepare(self) -> None:
        """Check logical decoding is on; create the publication and the slot if missing."""
        wal_level = await self.call("reading wal_level", self.connection.fetchval("SHOW wal_level"))
        if wal_level != "logical":
            raise PostgresChangesError(
                self.owner,
                "starting logical decoding",
                f"the server runs with wal_level={wal_level}; set wal_level=logical "
                "(a restart of the server)",
            )
        await self._publication_ready()
        slot = self.slot
        row = await self.call(
            f"looking up slot {slot!r}",
            self.connection.fetchrow(
                "SELECT plugin, slot_type, database = current_database() AS here "
                "FROM pg_replication_slots WHERE slot_name = $1",
                slot,
            ),
        )
        if row is None:
            await self.call(
                f"creating slot {slot!r}",
                self.connection.execute(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot
                ),
            )
            log.info("postgres_changes_slot_created", slot=slot)
        elif row["slot_type"] != "logical" or row["plugin"] != "pgoutput" or not row["here"]:
            raise PostgresChangesError(
                self.owner,
                f"using slot {slot!r}",
                f"the slot exists but is a {row['slot_type']} slot of plugin "
                f"{row['plugin']!r}{'' if row['here'] else ' of another database'}; "
                "give another slot name (this watcher needs a logical pgoutput slot of its "
                "own)",
            )

    async def _publication_ready(self) -> None:
        name = self.publication
        tables = self.tables
        found = await self.call(
            f"looking up publication {name!r}",
            self.connection.fetch(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1",
                name,
            ),
        )
        exists = bool(found) or await self.call(
            f"looking up publication {name!r}",
            self.connection.fetchval(
                "SELECT count(*) > 0 FROM pg_publication WHERE pubname = $1", name
            ),
        )
        if tables is None:
            if not exists:
                raise PostgresChangesError(
                    self.owner,
                    f"reading publication {name!r}",
                    "no such publication: create it (CREATE PUBLICATION "
                    f"{name} FOR TABLE ...) or give tables=[...] to have it created",
                )
            return
        wanted = [check_table(self.owner, table) for table in tables]
        resolved = await self.call(
            "looking up the tables",
            self.connection.fetch(
                "SELECT n.nspname, c.relname FROM unnest($1::text[]) AS t(name) "
                "JOIN pg_class c ON c.oid = to_regclass(t.name) "
                "JOIN pg_namespace n ON n.oid = c.relnamespace",
                [".".join(f'"{part}"' for part in parts) for parts in wanted],
            ),
        )
        if len(resolved) != len(wanted):
            have = {f"{r[0]}.{r[1]}" for r in resolved} | {r[1] for r in resolved}
            missing = [t for t in tables if t not in have]
            raise PostgresChangesError(
                self.owner, "looking up the tables", f"no such table: {', '.join(missing)}"
            )
        want = {(r[0], r[1]) for r in resolved}
        if exists:
            have_set = {(r[0], r[1]) for r in found}
            if have_set != want:
                listed = ", ".join(sorted(f"{s}.{t}" for s, t in have_set)) or "no table"
                raise PostgresChangesError(
                    self.owner,
                    f"using publication {name!r}",
                    f"it publishes {listed}, not the tables given; change it with ALTER "
                    "PUBLICATION or give another publication name",
                )
            return
        names = ", ".join(f'"{schema}"."{table}"' for schema, table in sorted(want))
        await self.call(
            f"creating publication {name!r}",
            self.connection.execute(f'CREATE PUBLICATION "{name}" FOR TABLE {names}'),
        )
        log.info("postgres_changes_publication_created", publication=name, tables=tables)

    # -- reading -------------------------------------------------------------------------------

    async def finish(self, transaction: Any) -> None:
        """End the read-only transaction of a peek (a broken connection is dropped instead)."""
        if self.broken or self.connection is None:
            return
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            try:
                await transaction.rollback()
            except Exception:  # noqa: BLE001 - the connection is closed next if it is broken
                self.broken = True
