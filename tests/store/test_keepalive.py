"""The node lease keep-alive (``NodeKeepAlive``) of SQLite and PostgreSQL: it extends a live
node lease from a thread of its own, and never revives, creates or reaps one.

Each channel is blocking and driven from a worker thread, as the daemon's keep-alive thread
drives it. Time is the backend's settable clock.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import (
    Asset,
    BackendUnavailableError,
    InvalidArgumentError,
    MemoryStateBackend,
    PostgresStateBackend,
    SqliteStateBackend,
    StateStoreError,
)
from watchkeeper.store.protocols import (
    BaseStateBackend,
    NodeKeepAliveChannel,
    NodeLease,
)

from tests.support.clock import T0, Clock
from tests.support.postgres import fresh_pg_schema

TTL = timedelta(seconds=30)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseStateBackend]:
    """SQLite and PostgreSQL (a fresh schema), on a settable clock."""
    async with contextlib.AsyncExitStack() as stack:
        backend: BaseStateBackend
        if request.param == "sqlite":
            backend = SqliteStateBackend(tmp_path / "state.db")
        else:
            schema = await stack.enter_async_context(
                fresh_pg_schema(request.getfixturevalue("pg_dsn"))
            )
            backend = PostgresStateBackend(request.getfixturevalue("pg_dsn"), schema=schema)
        await stack.enter_async_context(backend)
        backend.clock = Clock()
        await backend.events.aregister_assets([Asset("orders")])
        yield backend


def test_the_memory_backend_has_no_keepalive() -> None:
    """One process, one loop: the memory backend's node leases are renewed by the loop only."""
    assert MemoryStateBackend().leases.keepalive is None
    assert SqliteStateBackend("unused.db").leases.keepalive is not None


def keepalive(store: BaseStateBackend, owner: str) -> NodeKeepAliveChannel:
    keeper = store.leases.keepalive
    assert keeper is not None
    return keeper.open_node_keepalive(owner, TTL)


async def renew(channel: NodeKeepAliveChannel, limit: float = 10.0) -> bool:
    return await anyio.to_thread.run_sync(channel.renew, limit)


async def node(store: BaseStateBackend, owner: str) -> NodeLease | None:
    """``owner``'s node lease as another node ("watcher") sees it at its renewal."""
    beat = await store.leases.arenew_node("watcher", timedelta(days=1))
    return next((n for n in beat.nodes if n.owner == owner), None)


def advance(store: BaseStateBackend, seconds: float) -> None:
    clock = store.clock
    assert isinstance(clock, Clock)
    clock.advance(seconds)


class TestNodeKeepAlive:
    async def test_it_extends_a_live_node_lease_to_now_plus_ttl(
        self, store: BaseStateBackend
    ) -> None:
        """A renewal through the channel moves a live node's expiry to the store's now + ttl,
        like the loop's renewal, and keeps its trigger leases."""
        await store.leases.arenew_node("a", TTL)
        await store.leases.aclaim_leases("a", ["t1"], TTL)
        advance(store, 20)
        channel = keepalive(store, "a")
        try:
            assert await renew(channel)
            advance(store, 5)
            assert await renew(channel)  # the same connection, again
        finally:
            await anyio.to_thread.run_sync(channel.close)
        seen = await node(store, "a")
        assert seen is not None
        assert (seen.alive, seen.expires_at, seen.held) == (True, T0 + timedelta(seconds=55), 1)
        assert [(x.owner, x.token) for x in await store.leases.alist_leases()] == [("a", 1)]

    async def test_it_never_revives_a_reaped_node(self, store: BaseStateBackend) -> None:
        """Once another node reaped it, the channel says False and the node stays dead with
        the leases it held free for others: rejoining is the loop's renewal's job."""
        await store.leases.arenew_node("a", TTL)
        await store.leases.aclaim_leases("a", ["t1"], TTL)
        advance(store, 31)
        beat = await store.leases.arenew_node("b", TTL)
        assert beat.reaped == ("a",)
        channel = keepalive(store, "a")
        try:
            assert not await renew(channel)
        finally:
            await anyio.to_thread.run_sync(channel.close)
        seen = await node(store, "a")
        assert seen is not None and not seen.alive
        assert await store.leases.aclaim_leases("b", ["t1"], TTL) == {"t1": 2}

    async def test_it_never_creates_a_node(self, store: BaseStateBackend) -> None:
        """An owner that never joined gets False and no node lease."""
        channel = keepalive(store, "nobody")
        try:
            assert not await renew(channel)
        finally:
            await anyio.to_thread.run_sync(channel.close)
        assert await node(store, "nobody") is None

    @pytest.mark.parametrize(
        ("owner", "ttl", "error"),
        [
            ("", TTL, InvalidArgumentError),
            ("a", 0, InvalidArgumentError),
            ("a", "30", TypeError),
        ],
    )
    async def test_bad_arguments_are_refused_before_connecting(
        self, store: BaseStateBackend, owner: str, ttl: object, error: type[Exception]
    ) -> None:
        """The owner and ttl follow the lease rules of ``arenew_node``."""
        keeper = store.leases.keepalive
        assert keeper is not None
        with pytest.raises(error):
            keeper.open_node_keepalive(owner, ttl)  # type: ignore[arg-type]
        with pytest.raises(error):
            await store.leases.arenew_node(owner, ttl)  # type: ignore[arg-type]


class TestSqliteKeepAliveWhileLocked:
    async def test_a_held_write_lock_fails_the_renewal_within_its_timeout(
        self, tmp_path: Path
    ) -> None:
        """While another connection holds SQLite's write lock, a renewal fails with
        ``BackendUnavailableError`` after its timeout (not the backend's 30 s busy timeout);
        once the lock is gone, the same channel renews again."""
        path = tmp_path / "state.db"
        async with SqliteStateBackend(path) as db:
            await db.leases.arenew_node("a", TTL)
            channel = keepalive(db, "a")
            blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                blocker.execute("BEGIN IMMEDIATE")
                with anyio.fail_after(10):
                    with pytest.raises(BackendUnavailableError, match="'a'") as caught:
                        await renew(channel, limit=0.2)
                assert isinstance(caught.value, StateStoreError)
                blocker.execute("ROLLBACK")
                assert await renew(channel)
            finally:
                blocker.close()
                await anyio.to_thread.run_sync(channel.close)

    async def test_a_removed_database_file_is_not_created_again(self, tmp_path: Path) -> None:
        """The keep-alive opens the file read-write, never creating it: a database removed
        under the daemon fails the renewal and stays removed."""
        path = tmp_path / "state.db"
        async with SqliteStateBackend(path) as db:
            await db.leases.arenew_node("a", TTL)
            channel = keepalive(db, "a")
            for name in ("state.db", "state.db-wal", "state.db-shm"):
                (tmp_path / name).unlink(missing_ok=True)
            try:
                with pytest.raises(BackendUnavailableError):
                    await renew(channel, limit=0.2)
            finally:
                await anyio.to_thread.run_sync(channel.close)
            assert not path.exists()
