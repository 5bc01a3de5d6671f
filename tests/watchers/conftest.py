"""Fixtures of the watcher tests: durable state backends that can be closed and reopened, and
the MariaDB server the MySQL tests read from."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend

from tests.support.postgres import fresh_pg_schema
from tests.support.requires import unavailable

OpenBackend = Callable[[], contextlib.AbstractAsyncContextManager[BaseStateBackend]]

MYSQL_DSN = os.environ.get("WATCHKEEPER_TEST_MYSQL_DSN", "mysql://root@127.0.0.1:3306/test")


@pytest.fixture(scope="session")
def mysql_dsn() -> str:
    """The DSN of the test MariaDB; in CI (CI=true) an unreachable server fails the test."""
    try:
        with socket.create_connection(("127.0.0.1", 3306), timeout=1):
            return MYSQL_DSN
    except OSError as exc:
        reason = f"MariaDB is not reachable on 127.0.0.1:3306 ({exc})"
    unavailable(reason)


@pytest.fixture(params=["sqlite", "postgres"])
async def reopenable_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[OpenBackend]:
    """Opens a fresh backend instance on the same durable storage each time it is called.

    A watcher restarted on a second instance sees only what the first one committed, as a
    restarted daemon does.
    """
    if request.param == "sqlite":
        path = tmp_path / "state.db"

        def open_sqlite() -> contextlib.AbstractAsyncContextManager[BaseStateBackend]:
            return _opened(SqliteStateBackend(path))

        yield open_sqlite
        return
    dsn: str = request.getfixturevalue("pg_dsn")  # a sync fixture: skips when PostgreSQL is down
    async with fresh_pg_schema(dsn, prefix="wk_watchers") as schema:

        def open_postgres() -> contextlib.AbstractAsyncContextManager[BaseStateBackend]:
            return _opened(PostgresStateBackend(dsn, schema=schema))

        yield open_postgres


@contextlib.asynccontextmanager
async def _opened(backend: BaseStateBackend) -> AsyncIterator[BaseStateBackend]:
    async with backend:
        yield backend
