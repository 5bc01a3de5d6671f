"""The SQLite schema of :class:`~watchkeeper.store.SqliteStateBackend`: migrations and helpers.

Migrations are numbered and applied in order, each recorded in ``schema_migrations``. They run
inside one ``BEGIN IMMEDIATE`` transaction, so two processes that open the same new file at the
same moment serialise on the write lock: the first creates the tables, the second finds them
recorded and applies nothing. A migration is a tuple of single statements, never a script,
because :meth:`sqlite3.Connection.executescript` commits the open transaction first.

Timestamps are stored as ISO-8601 text in UTC with microseconds
(``2026-05-09T07:35:25.123456+00:00``): fixed width, so text order is time order and the GC can
compare them in SQL, and readable by anyone who opens the file with the ``sqlite3`` shell.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final, Literal, TypeVar

from .._types import AssetScope
from ..errors import BackendUnavailableError, StoreUnavailableError
from ..sql.dialects import SQLITE, sqlite_text
from ..sql.logs import LOG_TABLE_SQLITE
from ..sql.migrations import Migrations
from ..sql.migrations import migrate as migrate_job
from .executor import run_on
from .tasks_schema import TASK_LIFECYCLE, TASK_TABLES, TRY_COUNTS

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Synchronous",
    "apply_migrations",
    "asset_match",
    "connect",
    "from_db",
    "is_busy",
    "is_transient",
    "migrate",
    "retry_busy",
    "to_db",
    "unavailable",
]

T = TypeVar("T")

Synchronous = Literal["FULL", "NORMAL", "OFF"]

_SCHEMA_MIGRATIONS: Final = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""

MIGRATIONS: Final[tuple[tuple[int, str, tuple[str, ...]], ...]] = (
    (
        1,
        "assets and state",
        (
            """
            CREATE TABLE assets (
                id         INTEGER PRIMARY KEY,
                name       TEXT NOT NULL UNIQUE,
                uri        TEXT,
                active     INTEGER NOT NULL DEFAULT 1,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL
            )
            """,
            "CREATE INDEX assets_uri ON assets (uri) WHERE uri IS NOT NULL",
            """
            CREATE TABLE task_state (
                dag_id       TEXT NOT NULL,
                run_id       TEXT NOT NULL,
                task_id      TEXT NOT NULL,
                map_index    INTEGER NOT NULL,
                key          TEXT NOT NULL,
                value        TEXT NOT NULL,
                version      INTEGER NOT NULL,
                updated_at   TEXT NOT NULL,
                writer_kind  TEXT,
                writer_name  TEXT,
                writer_try   INTEGER,
                expires_at   TEXT,
                never_expire INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (dag_id, run_id, task_id, map_index, key)
            )
            """,
            # The two GC scans: expired rows, and rows governed by default_retention_days.
            """
            CREATE INDEX task_state_expires ON task_state (expires_at)
            WHERE expires_at IS NOT NULL AND never_expire = 0
            """,
            """
            CREATE INDEX task_state_retention ON task_state (updated_at)
            WHERE expires_at IS NULL AND never_expire = 0
            """,
            """
            CREATE TABLE asset_state (
                asset_id    INTEGER NOT NULL REFERENCES assets (id),
                key         TEXT NOT NULL,
                value       TEXT NOT NULL,
                version     INTEGER NOT NULL,
                updated_at  TEXT NOT NULL,
                writer_kind TEXT,
                writer_name TEXT,
                writer_try  INTEGER,
                PRIMARY KEY (asset_id, key)
            )
            """,
        ),
    ),
    (
        2,
        "asset events",
        (
            """
            CREATE TABLE asset_events (
                id         INTEGER PRIMARY KEY AUTOINCREMENT,
                asset_id   INTEGER NOT NULL REFERENCES assets (id),
                asset_name TEXT NOT NULL,
                watcher    TEXT NOT NULL,
                payload    TEXT NOT NULL,
                dedup_key  TEXT,
                created_at TEXT NOT NULL
            )
            """,
            """
            CREATE UNIQUE INDEX asset_events_dedup ON asset_events (asset_id, dedup_key)
            WHERE dedup_key IS NOT NULL
            """,
            "CREATE INDEX asset_events_asset ON asset_events (asset_name, id)",
        ),
    ),
    (
        3,
        "trigger status",
        (
            """
            CREATE TABLE trigger_status (
                trigger_id    TEXT PRIMARY KEY,
                classpath     TEXT NOT NULL,
                assets        TEXT NOT NULL,
                watchers      TEXT NOT NULL,
                state         TEXT NOT NULL,
                failures      INTEGER NOT NULL DEFAULT 0,
                last_error    TEXT,
                last_event_at TEXT,
                events        INTEGER NOT NULL DEFAULT 0,
                updated_at    TEXT,
                owner         TEXT
            )
            """,
        ),
    ),
    (
        4,
        "trigger leases",
        (
            # owner is NULL once released; the row stays so the next token is still higher.
            """
            CREATE TABLE trigger_leases (
                trigger_id TEXT PRIMARY KEY,
                owner      TEXT,
                token      INTEGER NOT NULL,
                expires_at TEXT NOT NULL
            )
            """,
        ),
    ),
    (
        5,
        "event retention",
        # The GC's scan for events past [events] retention_days (see _gc.py).
        ("CREATE INDEX asset_events_created ON asset_events (created_at)",),
    ),
    (
        6,
        "daemon status",
        (
            # One row per daemon, refreshed every heartbeat; refused is JSON text.
            """
            CREATE TABLE daemon_status (
                owner         TEXT PRIMARY KEY,
                started_at    TEXT NOT NULL,
                heartbeat_at  TEXT NOT NULL,
                lease_ttl     REAL NOT NULL,
                watchers_path TEXT NOT NULL,
                refused       TEXT NOT NULL
            )
            """,
        ),
    ),
    (
        7,
        "watcher controls and api tokens",
        (
            # One row per watcher an operator paused, resumed or retried (see _controls.py).
            """
            CREATE TABLE watcher_controls (
                watcher    TEXT PRIMARY KEY,
                paused     INTEGER NOT NULL DEFAULT 0,
                retry_seq  INTEGER NOT NULL DEFAULT 0,
                updated_at TEXT NOT NULL,
                updated_by TEXT
            )
            """,
            # Only a salted SHA-256 digest of each token's secret is kept.
            """
            CREATE TABLE api_tokens (
                name       TEXT PRIMARY KEY,
                token_id   TEXT NOT NULL UNIQUE,
                scopes     TEXT NOT NULL,
                salt       TEXT NOT NULL,
                digest     TEXT NOT NULL,
                created_at TEXT NOT NULL,
                expires_at TEXT,
                revoked_at TEXT
            )
            """,
        ),
    ),
    (8, "tasks on asset events", TASK_TABLES),
    (
        9,
        "node leases",
        (
            # One row per daemon, renewed every second or so; its trigger leases live as long
            # as it is alive (see _leases.py). trigger_leases.expires_at is no longer read.
            """
            CREATE TABLE trigger_nodes (
                owner      TEXT PRIMARY KEY,
                alive      INTEGER NOT NULL,
                expires_at TEXT NOT NULL,
                joined_at  TEXT NOT NULL
            )
            """,
            "CREATE INDEX trigger_leases_owner ON trigger_leases (owner)",
        ),
    ),
    (
        10,
        "runs found by state through an index",
        (
            # The partial index (WHERE state IN ('queued', 'running')) served no query: SQLite
            # uses a partial index only when the query repeats its WHERE, and "state =
            # 'queued'" does not, so every claim scanned every run ever made.
            "DROP INDEX task_runs_open",
            "CREATE INDEX task_runs_state ON task_runs (state, id)",
        ),
    ),
    (11, "tries counted by cause", TRY_COUNTS),
    (12, "run logs", LOG_TABLE_SQLITE),
    (13, "task batch windows, active run limits, removed tasks", TASK_LIFECYCLE),
)

SQLITE_MIGRATIONS: Final = Migrations(SQLITE, _SCHEMA_MIGRATIONS, MIGRATIONS)
SCHEMA_VERSION: Final = SQLITE_MIGRATIONS.version

_BUSY_CODES: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_TRANSIENT_CODES: Final = _BUSY_CODES | {
    sqlite3.SQLITE_IOERR,  # disk I/O error
    sqlite3.SQLITE_FULL,  # disk full
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_CANTOPEN,  # a journal or WAL file could not be opened (unmounted disk)
    sqlite3.SQLITE_PROTOCOL,  # WAL locking race
}


to_db = sqlite_text
"""A datetime as fixed-width UTC ISO text; a naive datetime is taken to be UTC."""


def from_db(text: str) -> datetime:
    """The aware UTC datetime of text written by :func:`to_db`."""
    return datetime.fromisoformat(text)


def asset_match(scope: AssetScope, alias: str = "") -> tuple[str, list[object]]:
    """A WHERE condition (and its parameters) selecting the active assets ``scope`` names.

    Like the memory backend, a row matches on its id, or its name, or (only when the scope has
    no name) its URI; callers take the lowest id. Only the fields that are set become terms, so
    each term can use its index (the primary key, the unique name, the URI index).
    """
    col = f"{alias}." if alias else ""
    terms: list[str] = []
    params: list[object] = []
    if scope.asset_id is not None:
        terms.append(f"{col}id = ?")
        params.append(scope.asset_id)
    if scope.name is not None:
        terms.append(f"{col}name = ?")
        params.append(scope.name)
    elif scope.uri is not None:
        terms.append(f"{col}uri = ?")
        params.append(scope.uri)
    return f"{col}active = 1 AND ({' OR '.join(terms)})", params


def is_busy(exc: BaseException) -> bool:
    """True for SQLITE_BUSY / SQLITE_LOCKED (and their extended codes): worth a retry."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    return "locked" in str(exc) or "busy" in str(exc)


def is_transient(exc: BaseException) -> bool:
    """True when an sqlite3 error says the database cannot serve us now, whatever the data:
    locked, busy, a disk I/O error, a full disk, no memory, a file that would not open."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _TRANSIENT_CODES
    return is_busy(exc) or "disk I/O error" in str(exc)


def unavailable(exc: sqlite3.Error, message: str) -> BackendUnavailableError:
    """``message`` as :class:`StoreUnavailableError` when ``exc`` is transient, else as
    :class:`BackendUnavailableError`; ``exc`` chained either way."""
    kind = StoreUnavailableError if is_transient(exc) else BackendUnavailableError
    error = kind(message)
    error.__cause__ = exc
    return error


def retry_busy(fn: Callable[[], T], *, timeout: float, what: str) -> T:
    """Call ``fn`` (blocking; worker threads only), retrying with backoff while SQLite is busy.

    SQLite's own busy handler already waits up to ``busy_timeout`` inside each attempt; this
    covers the cases it does not (a busy WAL recovery, a lock met before the handler applies).
    After ``timeout`` seconds the last error is raised as :class:`StoreUnavailableError`.
    """
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise unavailable(exc, f"SQLite could not {what}: {exc}") from exc
        time.sleep(delay)  # a worker thread, never the event loop
        delay = min(delay * 2, 0.25)


def _md5(text: str | None) -> str | None:
    if text is None:
        return None
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def connect(path: str, *, synchronous: Synchronous, busy_timeout: float) -> sqlite3.Connection:
    """Open the writer's connection: WAL, the busy timeout, ``synchronous`` and foreign keys.

    The connection is in autocommit mode (``isolation_level=None``): the writer issues
    ``BEGIN IMMEDIATE`` and ``COMMIT`` itself. It may be used from any one thread at a time.
    """
    try:
        conn = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise BackendUnavailableError(f"cannot open SQLite database {path!r}: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")

        def set_wal() -> None:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise BackendUnavailableError(
                    f"SQLite database {path!r} refused WAL mode (journal_mode is {mode})"
                )

        retry_busy(set_wal, timeout=busy_timeout, what=f"switch {path!r} to WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.create_function("md5", 1, _md5, deterministic=True)  # as PostgreSQL's
    except BaseException:
        conn.close()
        raise
    return conn


def apply_migrations(conn: sqlite3.Connection, now: datetime) -> list[int]:
    """Apply the pending migrations inside the caller's open transaction; return their versions."""
    return run_on(migrate_job(SQLITE_MIGRATIONS, ""), conn, now)


def migrate(conn: sqlite3.Connection, now: datetime, *, busy_timeout: float) -> list[int]:
    """Apply pending migrations in their own ``BEGIN IMMEDIATE`` transaction (opening does this)."""

    def attempt() -> list[int]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = apply_migrations(conn, now)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return done

    try:
        return retry_busy(attempt, timeout=busy_timeout, what="apply schema migrations")
    except sqlite3.Error as exc:
        raise BackendUnavailableError(f"schema migration failed: {exc}") from exc
