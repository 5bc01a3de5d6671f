"""A PostgreSQL backend on a network that black-holes its connections (the sockets stay open,
their bytes are dropped, new connections work: :meth:`TcpProxy.black_hole`).

Every statement is bounded (``statement_timeout``): a read is answered on a new connection,
an event commit in flight fails as :class:`StoreUnavailableError` and the next one commits, a
cancelled read leaves no connection behind in the pool, and every connection has TCP
keepalive. Nothing here waits longer than a statement's bound and a few seconds.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import anyio.to_thread
import asyncpg
import pytest
from watchkeeper.store import (
    Asset,
    AssetScope,
    InvalidSettingError,
    PostgresStateBackend,
    StoreUnavailableError,
)
from watchkeeper.store.protocols import EventCommit
from watchkeeper.store.settings import DatabaseSettings

from tests.support.proxy import TcpProxy, open_proxy

pytestmark = [pytest.mark.anyio]

BOUND = 5.0
"""The default statement bound (``[database] statement_timeout``)."""
SLACK = 5.0
"""What a loaded machine may add to a bound (a reconnect, a slow loop)."""


def proxied(dsn: str, proxy: TcpProxy) -> str:
    url = urlsplit(dsn)
    netloc = url.netloc.rsplit("@", 1)
    netloc[-1] = proxy.dsn_host
    return urlunsplit(url._replace(netloc="@".join(netloc)))


async def backend_rows(dsn: str, schema: str, sql: str) -> list[str]:
    """The first column of ``sql``'s rows in ``schema``, on a connection of the test's own."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        return [row[0] for row in await conn.fetch(sql)]
    finally:
        await conn.close()


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[TcpProxy]:
    async with open_proxy(urlsplit(pg_dsn).port or 5432) as running:
        yield running


@pytest.mark.postgres
class TestBlackHole:
    async def test_a_read_is_answered_on_a_new_connection(
        self, pg_dsn: str, pg_schema: str, proxy: TcpProxy
    ) -> None:
        """The read's statement gets no answer; within its bound it is sent again on a new
        connection, which answers."""
        async with PostgresStateBackend(proxied(pg_dsn, proxy), schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("a")])
            scope = AssetScope(name="a")
            await backend.aput_json(scope, "k", "1")
            assert await backend.aget(scope, "k") == 1
            assert proxy.black_hole() > 0
            accepted = proxy.accepted
            with anyio.fail_after(BOUND + SLACK):
                assert await backend.aget(scope, "k") == 1
            assert proxy.accepted > accepted, "answered without a new connection"

    async def test_an_event_commit_fails_as_unavailable_and_the_next_one_commits(
        self, pg_dsn: str, pg_schema: str, proxy: TcpProxy
    ) -> None:
        """An event commit sent on a black-holed connection may or may not have committed:
        it fails, within its bound, as the store being unavailable; the next one commits on a
        new connection. Raw SQL finds the second event and not the first (its bytes were
        dropped)."""
        async with PostgresStateBackend(proxied(pg_dsn, proxy), schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("a")])
            log = backend.events
            await log.acommit(EventCommit("w", ("a",), json.dumps({"n": 1})))
            assert proxy.black_hole() > 0
            with anyio.fail_after(BOUND + SLACK), pytest.raises(StoreUnavailableError):
                await log.acommit(EventCommit("w", ("a",), json.dumps({"n": 2})))
            with anyio.fail_after(SLACK):
                await log.acommit(EventCommit("w", ("a",), json.dumps({"n": 3})))
        conn = await asyncpg.connect(pg_dsn)
        try:
            rows = await conn.fetch(f'SELECT payload FROM "{pg_schema}".asset_events ORDER BY id')
        finally:
            await conn.close()
        assert [json.loads(r[0])["n"] for r in rows] == [1, 3]

    async def test_a_commit_left_waiting_at_the_server_is_fenced_before_the_next_read(
        self, pg_dsn: str, pg_schema: str, proxy: TcpProxy
    ) -> None:
        """A commit whose session is black-holed while the server has it waiting on a lock
        fails on our side, but its session lives on at the server and would commit once the
        lock is free: the watcher, restarted from the watermark it reads, would then commit
        its event a second time. The backend ends that session before its next statement, so
        the read sees the old watermark, the old commit never lands, and the event is in the
        log once."""
        async with PostgresStateBackend(
            proxied(pg_dsn, proxy), schema=pg_schema, statement_timeout=1.0
        ) as backend:
            await backend.events.aregister_assets([Asset("a")])
            scope = AssetScope(name="a")
            await backend.events.acommit(EventCommit("w", ("a",), '{"n":1}', state={"wm": "1"}))
            holder = await asyncpg.connect(pg_dsn)  # holds the watermark's row, not proxied
            try:
                tx = holder.transaction()
                await tx.start()
                await holder.execute(f'SELECT 1 FROM "{pg_schema}".asset_state FOR UPDATE')
                again = EventCommit("w", ("a",), '{"n":2}', state={"wm": "2"})
                async with anyio.create_task_group() as tg:

                    async def first() -> None:
                        with pytest.raises(StoreUnavailableError):
                            await backend.events.acommit(again)

                    tg.start_soon(first)
                    with anyio.fail_after(BOUND + SLACK):  # the commit waits on the lock
                        while not await holder.fetchval(  # noqa: ASYNC110 - the server's state
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND datname = current_database()"
                        ):
                            await anyio.sleep(0.01)
                    assert proxy.black_hole() > 0
                # Restarted from its watermark: the old commit's session is ended first.
                with anyio.fail_after(BOUND + SLACK):
                    assert await backend.aget(scope, "wm") == 1
                assert backend._freshness.fences == 1
                await tx.commit()  # the lock is free: an old session still alive commits now
                with anyio.fail_after(BOUND + SLACK):
                    await backend.events.acommit(again)
            finally:
                await holder.close()
            payloads = [
                json.loads(p)["n"]
                for p in await backend_rows(pg_dsn, pg_schema, "SELECT payload FROM asset_events")
            ]
        assert sorted(payloads) == [1, 2]

    async def test_a_cancelled_read_leaves_no_connection_in_the_pool(
        self, pg_dsn: str, pg_schema: str, proxy: TcpProxy
    ) -> None:
        """A read cancelled while its statement waits on a black-holed connection drops that
        connection: the pool's one slot is free at once (released, the connection would wait
        for an acknowledgement of the cancellation that never comes, and hold the slot)."""
        dsn = proxied(pg_dsn, proxy)
        async with PostgresStateBackend(dsn, schema=pg_schema, min_size=1, max_size=1) as backend:
            await backend.events.aregister_assets([Asset("a")])
            scope = AssetScope(name="a")
            await backend.aput_json(scope, "k", "1")
            assert await backend.aget(scope, "k") == 1
            assert proxy.black_hole() > 0
            with anyio.move_on_after(0.5) as cancelled:
                await backend.aget(scope, "k")
            assert cancelled.cancelled_caught
            with anyio.fail_after(BOUND - 1):  # not rescued by the statement's bound
                assert await backend.aget(scope, "k") == 1

    async def test_the_keepalive_thread_replaces_its_connection_after_a_timeout(
        self, pg_dsn: str, pg_schema: str, proxy: TcpProxy
    ) -> None:
        """Once a statement timed out on the backend's loop, the keep-alive thread does not
        send its renewal on its older, as silent, connection: it renews at once on a new one
        (a renewal on the old one would fail after its whole limit, and the lease lapse)."""
        dsn = proxied(pg_dsn, proxy)
        async with PostgresStateBackend(dsn, schema=pg_schema, statement_timeout=1.0) as backend:
            await backend.events.aregister_assets([Asset("a")])
            await backend.leases.arenew_node("kept", 30)
            channel = backend._leases.open_node_keepalive("kept", 30)
            try:
                assert await anyio.to_thread.run_sync(channel.renew, 5.0)
                assert proxy.black_hole() > 0
                with anyio.fail_after(1.0 + SLACK):
                    await backend.aget(AssetScope(name="a"), "k")  # times out, then answers
                accepted = proxy.accepted
                with anyio.fail_after(SLACK):
                    assert await anyio.to_thread.run_sync(channel.renew, 30.0)
                assert proxy.accepted > accepted
            finally:
                await anyio.to_thread.run_sync(channel.close)

    async def test_the_keepalive_thread_connect_is_bounded(self, pg_schema: str) -> None:
        """A server that accepts the connection and never answers fails the keep-alive's
        renewal within its limit, as the store being unavailable."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)

        async def mute(stream: anyio.abc.SocketStream) -> None:
            async with stream:  # open, silent
                await anyio.sleep_forever()

        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, mute)
            backend = PostgresStateBackend(f"postgresql://u@127.0.0.1:{port}/db")
            channel = backend._leases.open_node_keepalive("kept", 30)
            try:
                with anyio.fail_after(1.0 + SLACK), pytest.raises(StoreUnavailableError):
                    await anyio.to_thread.run_sync(channel.renew, 1.0)
            finally:
                await anyio.to_thread.run_sync(channel.close)
                tg.cancel_scope.cancel()

    @pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/net/tcp")  # not a service
    async def test_every_connection_has_tcp_keepalive(
        self, pg_dsn: str, pg_schema: str, proxy: TcpProxy
    ) -> None:
        """The writer's, the pool's, the lease lane's and the listener's connections all run a
        keepalive timer (``/proc/net/tcp``: timer 2), so a peer that vanished is found."""
        async with PostgresStateBackend(proxied(pg_dsn, proxy), schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("a")])
            await backend.aget(AssetScope(name="a"), "k")
            await backend.leases.arenew_node("keepalive-test", 30)
            with anyio.move_on_after(0.2):
                await backend.leases.await_lease_release()  # opens the LISTEN connection
            timers = client_timers(proxy.port)
            assert len(timers) >= 4, timers
            assert set(timers) == {2}, f"a connection without keepalive: {timers}"


def client_timers(port: int) -> list[int]:
    """The ``tr`` (timer kind) of each established TCP socket connected to ``port``."""
    timers = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, timer = fields[2], fields[3], fields[5]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            timers.append(int(timer.split(":")[0], 16))
    return timers


class TestSetting:
    @pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), True, "5"])
    def test_a_bad_statement_timeout_is_refused_by_name(self, value: object) -> None:
        with pytest.raises(InvalidSettingError, match="statement_timeout"):
            PostgresStateBackend("postgresql://u@h/db", statement_timeout=value)  # type: ignore[arg-type]

    def test_the_setting_reaches_the_backend(self) -> None:
        from watchkeeper.store import StoreSettings, open_state_backend

        settings = StoreSettings(
            database=DatabaseSettings(url="postgresql://u@h/db", statement_timeout=2.5)  # type: ignore[arg-type]
        )
        backend = open_state_backend(settings)
        assert isinstance(backend, PostgresStateBackend)
        assert backend.statement_timeout == 2.5
        assert DatabaseSettings().statement_timeout == BOUND

    @pytest.mark.parametrize("value", [0, -1, "inf"])
    def test_the_setting_refuses_a_bound_that_is_none(self, value: object) -> None:
        with pytest.raises(ValueError, match="statement_timeout"):
            DatabaseSettings(statement_timeout=value)  # type: ignore[arg-type]
