"""Opening PostgreSQL connections: a cancelled caller never interrupts a connect half-way.

asyncpg's connect, cancelled while the server answers its TLS request, can leave a protocol
holding an error nobody reads (the loop reports it, and the suite's runner fails the test that
happened to be running). Every connection of the backend is opened through ``sql.connect``,
which finishes the attempt under a shield and then closes it and raises the cancellation. The
server's answer is slowed down by a proxy here, so the caller is cancelled mid-connect every
time.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import asyncpg
import pytest
from watchkeeper.store import PostgresStateBackend
from watchkeeper.store.postgres.connections import connect

from ..support.daemons import free_port

DELAY = 0.4
"""How long the proxy holds the server's first answer (the reply to the TLS request)."""


@pytest.fixture
async def slow_dsn(pg_dsn: str) -> AsyncIterator[str]:
    """A DSN through a proxy that delays the server's first bytes by ``DELAY``."""
    target = urlsplit(pg_dsn)
    port = free_port()

    async def pipe(
        src: anyio.abc.ByteStream,
        dst: anyio.abc.ByteStream,
        delay: float,
        done: anyio.CancelScope,
    ) -> None:
        try:
            async for chunk in src:
                await anyio.sleep(delay)
                delay = 0.0
                await dst.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        done.cancel()  # one side is gone: so is the connection

    async def handle(client: anyio.abc.SocketStream) -> None:
        server = await anyio.connect_tcp(target.hostname or "127.0.0.1", target.port or 5432)
        async with client, server, anyio.create_task_group() as tg:
            tg.start_soon(pipe, client, server, 0.0, tg.cancel_scope)
            tg.start_soon(pipe, server, client, DELAY, tg.cancel_scope)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        netloc = target.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        yield urlunsplit(target._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) > 1 else host))
        tg.cancel_scope.cancel()


async def _sessions(pg_dsn: str, name: str) -> int:
    conn = await asyncpg.connect(pg_dsn)
    try:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
        )
        return count
    finally:
        await conn.close()


async def test_a_connect_cancelled_half_way_finishes_then_closes(
    slow_dsn: str, pg_dsn: str
) -> None:
    """The caller is cancelled while the server's answer is held: the connect still completes
    (the caller waits for it), the new connection is closed, and the cancellation is raised."""
    name = f"wk-connect-{uuid.uuid4().hex[:8]}"
    started = anyio.current_time()
    with anyio.move_on_after(0.1) as scope:
        await connect(slow_dsn, server_settings={"application_name": name})
    assert scope.cancelled_caught
    assert anyio.current_time() - started >= DELAY  # it was not interrupted at 0.1 s
    with anyio.fail_after(5):
        # The server's activity view has no event to wait on: poll it, bounded above.
        while await _sessions(pg_dsn, name):  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_a_connect_not_cancelled_returns_the_connection(slow_dsn: str) -> None:
    conn = await connect(slow_dsn)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_renewals_cancelled_anywhere_leave_no_transaction_open(
    pg_dsn: str, pg_schema: str
) -> None:
    """A node renewal cancelled at any point (a daemon's start-up renewals are cancelled when
    its first load ends) must not leave the lease connection inside a transaction: the next
    renewals would then commit nothing, and every write of the daemon's watchers would be
    refused as if its node lease had expired. The cancellation sweeps the first 4 ms of a
    renewal in 20 µs steps; after each, a renewal must be seen by another session."""
    ttl = timedelta(seconds=30)
    expiry = f'SELECT expires_at FROM "{pg_schema}".trigger_nodes WHERE owner = $1'
    other = await asyncpg.connect(pg_dsn)
    try:
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as store:
            await store.leases.arenew_node("a", ttl)
            for step in range(200):
                with anyio.move_on_after(step * 0.00002):
                    await store.leases.arenew_node("a", ttl)
                before = await other.fetchval(expiry, "a")
                await anyio.sleep(0.001)  # the database clock moves on
                await store.leases.arenew_node("a", ttl)
                assert await other.fetchval(expiry, "a") > before, f"step {step}"
    finally:
        await other.close()
