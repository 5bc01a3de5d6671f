"""The connections of :class:`~watchkeeper.store.PostgresStateBackend`: how each is opened
(bounded, with TCP keepalive), and what becomes of one whose statement failed.

Every statement on them is bounded (asyncpg's ``command_timeout``, the backend's
``statement_timeout``): on a network that black-holes a connection (its socket open, its
bytes dropped) the answer never comes, and an unbounded statement would hold its caller, and
the connection, forever. A connection whose statement timed out or was cancelled is
terminated (:func:`breaks_connection`), never reused nor returned to the pool: the server may
still be running the statement, or never have seen it, and asyncpg would wait for the
cancellation to be acknowledged before the next one.
"""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import time
import urllib.parse
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.lowlevel import checkpoint_if_cancelled

from ..errors import InvalidSettingError
from .sql import is_unavailable

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_STATEMENT_TIMEOUT",
    "GC_TIMEOUT",
    "IDLE_IN_TRANSACTION_FLOOR",
    "KEEPALIVE_COUNT",
    "KEEPALIVE_IDLE",
    "KEEPALIVE_INTERVAL",
    "MIGRATION_TIMEOUT",
    "TCP_USER_TIMEOUT",
    "Freshness",
    "breaks_connection",
    "check_timeout",
    "close_quietly",
    "connect",
    "connection_class",
    "describe_dsn",
    "discard",
    "drop_if_broken",
    "keep_alive",
    "keep_session",
    "pooled",
    "roll_back",
    "session_settings",
    "transaction",
]


#: The bound of one connection attempt (asyncpg's ``timeout``; its own default is 60 s). A
#: connect runs shielded (:func:`connect`), so this is also the longest a cancelled caller waits.
CONNECT_TIMEOUT: Final = 10.0

#: The default bound of one statement (``[database] statement_timeout``): a statement whose
#: answer has not come by then fails with :class:`StoreUnavailableError` and its connection is
#: terminated, as on a network that black-holes the connection (its socket open, its bytes
#: dropped), where the answer would never come.
DEFAULT_STATEMENT_TIMEOUT: Final = 5.0

#: The bound of a schema migration's statements, which may rewrite a large table.
MIGRATION_TIMEOUT: Final = 600.0

#: The bound of a garbage collection's deletes, which may remove millions of rows at once (the
#: first pass over a large table). A dead network is still found sooner: any other statement
#: that times out ends the connection (:class:`Freshness`).
GC_TIMEOUT: Final = 300.0

#: TCP keepalive of every connection: probes after this many idle seconds, this often, and
#: the connection is dropped after this many unanswered ones; data unacknowledged for
#: ``TCP_USER_TIMEOUT`` seconds drops it too. An idle connection (a LISTEN) to a peer that
#: vanished is so found dead within about 25 s instead of hours.
KEEPALIVE_IDLE: Final = 10
KEEPALIVE_INTERVAL: Final = 5
KEEPALIVE_COUNT: Final = 3
TCP_USER_TIMEOUT: Final = 25


def keep_alive(sock: socket.socket | None) -> None:
    """Turn on TCP keepalive (:data:`KEEPALIVE_IDLE` ...) on a TCP socket; nothing on a Unix
    socket. The per-socket timings are set where the platform has them."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", TCP_USER_TIMEOUT * 1000),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


@functools.cache
def connection_class() -> type[asyncpg.Connection]:
    """``asyncpg.Connection`` with TCP keepalive on its socket (:func:`keep_alive`), set as
    the connection is made (asyncpg has no setting for it), and the moment it was made."""
    import asyncpg

    class KeptAliveConnection(asyncpg.Connection):
        def __init__(self, protocol: Any, transport: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(protocol, transport, *args, **kwargs)
            self.opened_at = time.monotonic()  # read by Freshness.stale
            self.freshness: Freshness | None = None  # set by Freshness.track
            keep_alive(transport.get_extra_info("socket"))

        def terminate(self) -> None:
            # Its server session may live on (a black-holed network) and still commit what
            # it was given: the backend fences it before its next statement (Freshness).
            if self.freshness is not None and not self.is_closed():
                self.freshness.in_doubt.add(self.get_server_pid())
            super().terminate()

    return KeptAliveConnection


async def connect(dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect`` (same arguments), with TCP keepalive, never interrupted half-way.

    A connect cancelled while the server answers its TLS request leaves asyncpg's half-made
    protocol holding an error nobody reads, which the event loop reports as "Future exception
    was never retrieved". So the attempt finishes under a shield, bounded by
    :data:`CONNECT_TIMEOUT`; a cancellation that came meanwhile then closes the new connection
    and is raised. Every connection on the backend's event loop, the pool's included, is opened
    here (the keep-alive thread's, on a loop of its own that nothing cancels, is not). Pass
    ``command_timeout`` to bound each statement (see :func:`breaks_connection`), and the
    backend's ``freshness`` (:class:`Freshness`) to have the connection ended with the others
    when a statement times out."""
    import asyncpg

    freshness: Freshness | None = kwargs.pop("freshness", None)
    kwargs.setdefault("timeout", CONNECT_TIMEOUT)
    if kwargs.get("connection_class", asyncpg.Connection) is asyncpg.Connection:
        kwargs["connection_class"] = connection_class()  # the pool passes the default
    with anyio.CancelScope(shield=True):
        conn: asyncpg.Connection = await asyncpg.connect(dsn, **kwargs)
    try:
        await checkpoint_if_cancelled()
    except BaseException:
        conn.terminate()
        raise
    if freshness is not None:
        freshness.track(conn)
    return conn


class Freshness:
    """Which of a backend's connections to trust. Once a statement timed out, every
    connection made before it may sit on the same dead network, as silent, and would each
    cost a statement's bound to find out, one after the other. So :meth:`saw` terminates
    them all at once (a statement in flight on one fails as on a lost connection, and its
    caller retries on a new one), and any such connection still held is replaced, without a
    round trip, when next used (:meth:`stale`)."""

    def __init__(self) -> None:
        self.stale_before = -math.inf
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        self.in_doubt: set[int] = set()
        """Server process ids of the sessions this backend terminated on its side: a session
        whose network went silent lives on at the server and may still apply what it was sent
        (a statement waiting on a lock commits once the lock is free). :meth:`fence` ends them
        before any other statement, so nothing reads a watermark such a session may still
        move, and nothing is written twice."""
        self.fences = 0
        """How many times :meth:`fence` ended in-doubt sessions (a counter for tests)."""
        self._fencing = anyio.Lock()

    def track(self, conn: Any) -> None:
        """Count ``conn`` (just made) among the connections :meth:`saw` terminates, and note
        its server session as in doubt should it be terminated."""
        self._conns.add(conn)
        if hasattr(conn, "freshness"):
            conn.freshness = self

    async def fence(self, conn: Any) -> None:
        """End the in-doubt sessions (:attr:`in_doubt`) from ``conn`` and wait until the server
        has reaped them: a statement they were running is rolled back, unless it had committed,
        which any read after this sees. Only sessions of this user and session name are ended
        (a process id the server reused for another client is left alone)."""
        if not self.in_doubt:
            return
        async with self._fencing:
            pids = sorted(self.in_doubt)
            if not pids:
                return
            await conn.execute(FENCE_SQL, pids)
            while await conn.fetchval(IN_DOUBT_SQL, pids):  # noqa: ASYNC110 - the server's state
                await anyio.sleep(0.01)
            self.in_doubt.difference_update(pids)
            self.fences += 1

    def saw(self, exc: BaseException) -> None:
        """Note the failure ``exc`` of a statement: a timeout ends the older connections."""
        if not isinstance(exc, TimeoutError):
            return
        self.stale_before = time.monotonic()
        for conn in list(self._conns):
            if self.stale(conn) and not conn.is_closed():
                conn.terminate()

    def stale(self, conn: Any) -> bool:
        """Whether ``conn`` (a connection or a pooled proxy) was made before the last
        statement that timed out."""
        opened_at: float = getattr(conn, "opened_at", math.inf)
        return opened_at <= self.stale_before


_SAME_CLIENT = """
    FROM pg_stat_activity AS a
    WHERE a.pid = ANY($1::int[]) AND a.pid <> pg_backend_pid()
      AND a.usename = session_user
      AND a.application_name = current_setting('application_name')"""

#: End the in-doubt sessions (:meth:`Freshness.fence`).
FENCE_SQL: Final = "SELECT pg_terminate_backend(a.pid)" + _SAME_CLIENT

#: How many of them the server still runs.
IN_DOUBT_SQL: Final = "SELECT count(*)" + _SAME_CLIENT


def breaks_connection(exc: BaseException) -> bool:
    """Whether a connection that raised ``exc`` mid-statement must be terminated rather than
    reused or returned to the pool: a statement that timed out or was cancelled (its answer may
    never come: the connection is not known to be idle), a lost or unavailable server. A
    server's own error about the statement (a constraint, bad data) leaves it usable."""
    return not isinstance(exc, Exception) or is_unavailable(exc)


def drop_if_broken(conn: Any, exc: BaseException) -> None:
    """Terminate ``conn`` (a connection or a pooled proxy) if ``exc`` breaks it."""
    import asyncpg

    if not breaks_connection(exc):
        return
    try:
        if not conn.is_closed():
            conn.terminate()
    except asyncpg.InterfaceError:
        pass  # a pooled proxy whose connection was terminated already is detached


@contextlib.asynccontextmanager
async def pooled(pool: asyncpg.Pool, freshness: Freshness) -> AsyncIterator[Any]:
    """``pool.acquire()``, except that a connection whose statement timed out or was cancelled
    (:func:`breaks_connection`) is terminated, never handed back (released, asyncpg would wait
    for the server to acknowledge the cancellation, which a dead network never does), and a
    stale one (:class:`Freshness`) is replaced before use."""
    while True:
        async with pool.acquire() as conn:
            if freshness.stale(conn):
                conn.terminate()  # the pool opens a new one in its place
                continue
            try:
                await freshness.fence(conn)
                yield conn
            except BaseException as exc:
                freshness.saw(exc)
                drop_if_broken(conn, exc)
                raise
            return


@contextlib.asynccontextmanager
async def transaction(conn: Any) -> AsyncIterator[None]:
    """``BEGIN`` ... ``COMMIT`` on ``conn``; on an error ``ROLLBACK`` (bounded, shielded), but a
    connection the error broke (:func:`breaks_connection`) is terminated at once instead (the
    server rolls back when the session ends), as is one that could not roll back."""
    await conn.execute("BEGIN")
    try:
        yield
    except BaseException as exc:
        if breaks_connection(exc):
            drop_if_broken(conn, exc)
        else:
            await roll_back(conn)
        raise
    await conn.execute("COMMIT")


async def roll_back(conn: Any) -> None:
    """End ``conn``'s failed transaction; a connection that cannot (within 5 s) is terminated,
    so no transaction is ever left open on it."""
    if conn.is_closed():
        return
    rolled_back = False
    with anyio.move_on_after(5, shield=True):
        try:
            if conn.is_in_transaction():
                await conn.execute("ROLLBACK")
            rolled_back = True
        except Exception:  # noqa: BLE001 - the statement's own error is the one to report
            rolled_back = False
    if not conn.is_closed() and (not rolled_back or conn.is_in_transaction()):
        conn.terminate()


async def close_quietly(conn: asyncpg.Connection | None) -> None:
    """Close a connection of the backend's own (a listener, the lease lane) within 2 s, shielded,
    and terminate it if the close did not finish."""
    if conn is None or conn.is_closed():
        return
    with anyio.move_on_after(2, shield=True):
        await conn.close()
    if not conn.is_closed():
        conn.terminate()


async def keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset hook, in place of asyncpg's reset query (``SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``): nothing to undo.

    The query costs a round trip per read, about a third of the throughput, and the backend
    leaves no session state on a pooled connection: no ``SET``, no ``LISTEN``, no cursors
    outside a transaction, only transaction-scoped advisory locks, and tables named by their
    schema instead of a search path. asyncpg still rolls back a transaction left open and
    drops listeners on release.
    """


def check_timeout(name: str, value: object) -> float:
    """``value`` as a number of seconds > 0 (finite), or :class:`InvalidSettingError` naming
    ``name``."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < math.inf:
        raise InvalidSettingError(name, f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def describe_dsn(dsn: str, schema: str | None) -> str:
    """``host=… db=… schema=…`` from a DSN, never its password."""
    shown = schema or "(search_path)"
    try:
        url = urllib.parse.urlsplit(dsn)
        if url.scheme not in ("postgresql", "postgres"):
            return f"dsn=(not a postgresql:// URL) schema={shown}"
        query = urllib.parse.parse_qs(url.query)
        host = url.hostname or query.get("host", ["localhost"])[0]
        port = url.port or int(query.get("port", ["5432"])[0])
        db = url.path.lstrip("/") or query.get("dbname", ["(default)"])[0]
    except ValueError:
        return f"dsn=(unparsed) schema={shown}"
    return f"host={host}:{port} db={db} schema={shown}"


def discard(conn: asyncpg.Connection | None, pool: asyncpg.Pool | None) -> None:
    """Drop what a failed open left behind (abruptly: this cleanup must neither hang nor raise)."""
    if pool is not None:
        pool.terminate()
    if conn is not None:
        conn.terminate()


IDLE_IN_TRANSACTION_FLOOR = 5.0
"""The least idle-in-transaction timeout :func:`session_settings` sets,
in seconds: no live process sits that long between two statements of one of its short
transactions, even on a busy machine, while a shorter lease (tests use them) would end
sessions that are merely slow."""


def session_settings(settings: dict[str, str], name: str, lease_seconds: float) -> None:
    """Set ``application_name`` (cut to PostgreSQL's 63 bytes) and the idle-in-transaction
    timeout (``lease_seconds``, at least :data:`IDLE_IN_TRANSACTION_FLOOR`) in ``settings``
    unless they are there already."""
    idle = max(lease_seconds, IDLE_IN_TRANSACTION_FLOOR)
    settings.setdefault("application_name", name.encode()[:63].decode(errors="ignore"))
    settings.setdefault("idle_in_transaction_session_timeout", f"{int(idle * 1000)}ms")
