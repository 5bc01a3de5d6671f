"""A fresh PostgreSQL schema or database on the test server: a schema for one backend
(``pg_schema``, the ``backend`` fixture), a whole database for tests that need one (several
daemons, a process of their own, an outage)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import anyio

__all__ = ["PgDatabase", "database_dsn", "fresh_pg_database", "fresh_pg_schema"]


class PgDatabase(NamedTuple):
    """A database made for one test: its name and the DSN that connects to it."""

    name: str
    dsn: str


def database_dsn(dsn: str, database: str) -> str:
    """``dsn`` pointed at ``database`` instead of its own."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


@contextlib.asynccontextmanager
async def fresh_pg_database(dsn: str, *, prefix: str = "wk_test") -> AsyncIterator[PgDatabase]:
    """A new, empty database on the server of ``dsn``, dropped afterwards (even when a test
    closed it to connections to simulate an outage)."""
    import asyncpg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield PgDatabase(name, database_dsn(dsn, name))
    finally:
        with anyio.move_on_after(30, shield=True):
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await conn.close()


@contextlib.asynccontextmanager
async def fresh_pg_schema(dsn: str, *, prefix: str = "wk_test") -> AsyncIterator[str]:
    """A new, empty schema in the database of ``dsn`` (its name), dropped with what it holds
    afterwards."""
    import asyncpg

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        yield schema
    finally:
        with anyio.move_on_after(30, shield=True):
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
