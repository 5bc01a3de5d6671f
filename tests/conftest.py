"""Fixtures shared by the whole suite: the anyio backend, PostgreSQL access, state backends."""

from __future__ import annotations

import logging
import os
import socket
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
from watchkeeper.store import MemoryStateBackend
from watchkeeper.store.protocols import BaseStateBackend

from tests.support.aws import AWS_ENV, moto_server
from tests.support.pg_logical import LogicalCluster, logical_cluster
from tests.support.postgres import PgDatabase, fresh_pg_database, fresh_pg_schema
from tests.support.pubsub import pubsub_emulator
from tests.support.requires import unavailable
from tests.support.runtime import open_backend

PG_DSN = os.environ.get("WATCHKEEPER_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def anyio_backend() -> str:
    """aiosqlite and asyncpg are asyncio-only."""
    return "asyncio"


EVENT_LOOPS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
]
"""asyncio's own loop, and uvloop under it (what the daemon runs on when uvloop is installed)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module that sets ``ALSO_ON_UVLOOP = True`` runs each of its async tests twice: on
    asyncio's loop and on uvloop (the runtime modules do, so both loops run the runner)."""
    if "anyio_backend" in metafunc.fixturenames and getattr(
        metafunc.module, "ALSO_ON_UVLOOP", False
    ):
        metafunc.parametrize("anyio_backend", EVENT_LOOPS)


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """Each test starts from structlog's defaults, so capture_logs() sees everything; the
    root logger's handlers and level that a test's configure_logging() set are undone."""
    root = logging.getLogger()
    level = root.level
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
    for handler in [h for h in root.handlers if h.get_name() == "watchkeeper"]:
        root.removeHandler(handler)
    root.setLevel(level)


def _pg_address(dsn: str) -> tuple[str, int]:
    """``(host, port)`` of a ``postgresql://`` DSN, with libpq's defaults."""
    url = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qs(url.query)
    host = url.hostname or query.get("host", ["localhost"])[0]
    port = url.port or int(query.get("port", ["5432"])[0])
    return host, port


def _pg_reachable(dsn: str = PG_DSN) -> str | None:
    """None when the server of ``dsn`` answers, else the reason it does not."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed"
    host, port = _pg_address(dsn)
    try:
        if host.startswith("/"):  # a Unix-domain socket directory, as libpq takes it
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(1)
                sock.connect(f"{host}/.s.PGSQL.{port}")
        else:
            with socket.create_connection((host, port), timeout=1):
                pass
    except OSError as exc:
        return f"PostgreSQL is not reachable on {host}:{port} ({exc})"
    return None


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The DSN of the test server; in CI (CI=true) an unreachable server fails the test."""
    reason = _pg_reachable()
    if reason is not None:
        unavailable(reason)
    return PG_DSN


@pytest.fixture(scope="session")
def _moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def moto_endpoint(_moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The endpoint URL of a real ``moto_server`` (SQS, S3) shared by the session, with test
    credentials and a region in the environment (inherited by daemons the test starts)."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    return _moto_endpoint


@pytest.fixture(scope="session")
def pg_logical() -> Iterator[LogicalCluster]:
    """A throwaway PostgreSQL cluster with ``wal_level=logical`` (logical decoding), shared
    by the session, stopped and removed after it."""
    with logical_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _pubsub_host() -> Iterator[str]:
    with pubsub_emulator() as host:
        yield host


@pytest.fixture
def pubsub_host(_pubsub_host: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``host:port`` of a real Pub/Sub emulator shared by the session; the test's environment
    has no ``PUBSUB_EMULATOR_HOST`` of its own (a watcher is told the host explicitly)."""
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    return _pubsub_host


@pytest.fixture
async def pg_schema(pg_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL schema for one test, dropped afterwards."""
    async with fresh_pg_schema(pg_dsn) as schema:
        yield schema


@pytest.fixture
async def pg_database(pg_dsn: str) -> AsyncIterator[PgDatabase]:
    """A fresh, empty PostgreSQL database for one test (its name and DSN), dropped afterwards:
    for tests that need a whole database (daemons in processes, an outage), not a schema."""
    async with fresh_pg_database(pg_dsn) as database:
        yield database


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test runs in ``tmp_path``, an empty directory, with no ``WATCHKEEPER*`` variable
    of the outer environment (for tests of settings and of the command line)."""
    for name in list(os.environ):
        if name.upper().startswith("WATCHKEEPER"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture(params=["memory", "sqlite"])
async def local_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BaseStateBackend]:
    """Each backend that needs no server, opened and empty: memory, and SQLite under tmp_path."""
    async with open_backend(request.param, tmp_path) as backend:
        yield backend


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BaseStateBackend]:
    """Each built-in backend, opened and empty (PostgreSQL in a fresh schema)."""
    kind = request.param
    if kind == "memory":
        async with MemoryStateBackend() as memory:
            yield memory
    elif kind == "sqlite":
        from watchkeeper.store import SqliteStateBackend

        async with SqliteStateBackend(tmp_path / "state.db") as sqlite:
            yield sqlite
    else:
        dsn = request.getfixturevalue("pg_dsn")
        from watchkeeper.store import PostgresStateBackend

        async with (
            fresh_pg_schema(dsn) as schema,
            PostgresStateBackend(dsn, schema=schema) as postgres,
        ):
            yield postgres
