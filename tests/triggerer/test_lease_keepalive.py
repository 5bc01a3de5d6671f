"""The daemon's node lease survives an event loop blocked for longer than the lease lives:
a thread of its own keeps it alive (``LeaseKeeper.kept_alive``), so the daemon neither stops
its own watchers at its deadline nor gets reaped. A real daemon on SQLite and on PostgreSQL,
with a node lease of 1 s (margin 0.5 s) and a loop blocked for 2.5 s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer import Daemon
from watchkeeper.triggerer.daemon._leases import LeaseKeeper
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers

from tests.support.daemons import append_lines, committed, lines_settings
from tests.support.postgres import fresh_pg_schema
from tests.support.runtime import watch_logs

BLOCK = 2.5
"""Seconds the test blocks the loop: over the 1 s node lease, and its 0.5 s deadline."""


@pytest.fixture(autouse=True)
def _unload() -> Iterator[None]:
    yield
    unload_watchers()


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseStateBackend]:
    async with contextlib.AsyncExitStack() as stack:
        backend: BaseStateBackend
        if request.param == "sqlite":
            backend = SqliteStateBackend(tmp_path / "state.db")
        else:
            dsn = request.getfixturevalue("pg_dsn")
            schema = await stack.enter_async_context(fresh_pg_schema(dsn))
            backend = PostgresStateBackend(dsn, schema=schema)
        yield await stack.enter_async_context(backend)


class TestKeepAliveThroughABlockedLoop:
    async def test_a_blocked_loop_neither_lapses_nor_loses_the_node_lease(
        self, db: BaseStateBackend, tmp_path: Path
    ) -> None:
        """The loop sleeps 2.5 s with a node lease of 2 s: the keep-alive thread renews it
        meanwhile, so no ``node_lease_lapsed`` follows, the watcher keeps running under the
        same token and commits the next line; without the thread the deadline (1.5 s after
        the last renewal) would have passed and the daemon stopped its watcher. (With a 1 s
        lease the thread had 0.2 s of slack, and a scheduling hiccup on a loaded machine
        lapsed the lease now and then.)"""
        source = tmp_path / "alpha.txt"
        append_lines(source, 1, 1)
        settings = lines_settings(
            tmp_path,
            source,
            heartbeat_interval=0.2,
            lease_renew_interval=0.2,
            lease_ttl=2.0,
            lease_margin=0.5,
        )
        async with Daemon(settings, backend=db) as d:
            (trigger_id,) = d.groups
            await committed(db, 1)
            with watch_logs() as logs:
                before = d.leases.keepalives
                time.sleep(BLOCK)  # noqa: ASYNC251 - the point: a loop blocked past the lease
                assert not d.leases.lapsed()
                assert d.leases.keepalives > before
                append_lines(source, 2, 2)
                await committed(db, 2)
                with anyio.fail_after(10):  # two turns of the lease loop since the block
                    for _ in range(2):
                        await d.leases.wait_renewal()
            names = [e["event"] for e in logs.entries]
            assert "node_lease_lapsed" not in names
            assert "node_lease_reaped" not in names
            assert list(d.groups) == [trigger_id]
            assert d.leases.held == {trigger_id: 1}
            assert [(x.owner, x.token) for x in await db.leases.alist_leases()] == [(d.owner, 1)]
            assert [e.payload["n"] for e in await db.events.alist_events()] == [1, 2]


class TestKeepAliveGivesUpOnAHungLoop:
    async def test_a_loop_silent_past_the_limit_lets_the_node_lease_lapse(
        self, db: BaseStateBackend
    ) -> None:
        """The thread keeps a busy loop's lease, not a hung one's: with a keep-alive limit of
        1.2 s and the loop blocked for 3 s, the thread extends the lease at first, then stops,
        says so once, and the deadline passes, so the store reaps the node lease as it would
        without the thread and other daemons may take its watchers."""
        keeper = LeaseKeeper(db, "hung-host:1:0", 0.5, margin=0.1, keepalive_limit=1.2)
        with watch_logs() as logs:
            async with keeper.kept_alive(0.1):
                await keeper.renew()
                time.sleep(3.0)  # noqa: ASYNC251 - the point: a loop that does not come back
                assert keeper.keepalives > 0  # it kept the lease while under the limit
                assert keeper.lapsed()
                # The node lease expired in the store too: another daemon's renewal reaps it.
                beat = await db.leases.arenew_node("other-host:1:0", 0.5)
                assert "hung-host:1:0" in beat.reaped
        assert len(logs.named("node_keepalive_stopped")) == 1
