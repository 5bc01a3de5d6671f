"""PostgresStateBackend's group writer: batches in flight side by side, and what keeps them apart.

A batch is held in flight by locking, from another connection, a row it must write; meanwhile
the tests see which other writes go ahead (event commits on other assets) and which wait for
it (another event on the same asset, any other kind of write).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest
from watchkeeper.store import Asset, AssetEvent, AssetScope, PostgresStateBackend, TaskScope
from watchkeeper.store.backend import EventCommit

TASK = TaskScope("dag", "run", "task")
OTHERS = 40
"""Watchers committing beside the held batch: more than the writer sends beside one alone."""


@pytest.fixture
async def store(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStateBackend]:
    async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
        await backend.aregister_assets([Asset("a"), *(Asset(f"b{i}") for i in range(OTHERS))])
        yield backend


def _event(watcher: str, asset: str, n: int) -> EventCommit:
    return EventCommit(watcher, (asset,), str(n), state={"wm": str(n)})


async def _hold_state_row(conn: asyncpg.Connection, schema: str, asset: str) -> None:
    """Lock ``asset``'s state rows from ``conn`` (in its open transaction)."""
    await conn.execute(
        f'SELECT 1 FROM "{schema}".asset_state s JOIN "{schema}".assets a ON a.id = s.asset_id '
        "WHERE a.name = $1 FOR UPDATE",
        asset,
    )


async def _wait_blocked(conn: asyncpg.Connection) -> None:
    """Until another session waits for a lock ``conn`` holds (the held batch is in flight)."""
    blocked = "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
    with anyio.fail_after(10):
        # The server's lock table has no event to wait on: poll it, bounded above.
        while not await conn.fetchval(blocked, conn.get_server_pid()):  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_events_on_other_assets_commit_while_a_batch_is_held(
    store: PostgresStateBackend, pg_dsn: str, pg_schema: str
) -> None:
    """A batch waiting on the server does not hold up a batch of event commits on other
    assets; a second event on the held asset waits for the first and gets the next id."""
    await store.acommit_event(_event("wa", "a", 0))
    done: dict[str, list[AssetEvent]] = {}

    async def commit(name: str, commit: EventCommit) -> None:
        done[name] = await store.acommit_event(commit)

    conn = await asyncpg.connect(pg_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await _hold_state_row(conn, pg_schema, "a")
        async with anyio.create_task_group() as tg:
            tg.start_soon(commit, "a1", _event("wa", "a", 1))
            await _wait_blocked(conn)
            with anyio.fail_after(10):  # a writer running one batch at a time never gets here
                async with anyio.create_task_group() as others:
                    for i in range(OTHERS):
                        others.start_soon(commit, f"b{i}", _event(f"wb{i}", f"b{i}", 1))
            tg.start_soon(commit, "a2", _event("wa", "a", 2))
            await anyio.sleep(0.3)  # time enough for a write that went ahead to commit
            assert "a1" not in done and "a2" not in done
            await tx.rollback()
    finally:
        await conn.close()
    assert done["a1"][0].id < done["a2"][0].id
    assert await store.aget(AssetScope(name="a"), "wm") == 2
    listed = await store.alist_events(asset="a")
    assert [e.payload for e in listed] == [0, 1, 2]


async def test_other_writes_wait_for_the_batch_in_flight(
    store: PostgresStateBackend, pg_dsn: str, pg_schema: str
) -> None:
    """A write that is not an event commit runs alone: not beside a held batch, and not before
    it."""
    await store.acommit_event(_event("wa", "a", 0))
    order: list[str] = []

    async def run(name: str, fn: Any) -> None:
        await fn()
        order.append(name)

    conn = await asyncpg.connect(pg_dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await _hold_state_row(conn, pg_schema, "a")
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "event", lambda: store.acommit_event(_event("wa", "a", 1)))
            await _wait_blocked(conn)
            tg.start_soon(run, "set", lambda: store.aset(TASK, "k", 1))
            await anyio.sleep(0.3)  # time enough for a write that went ahead to commit
            check = f'SELECT count(*) FROM "{pg_schema}".task_state'
            assert order == []
            other = await asyncpg.connect(pg_dsn)
            try:
                assert await other.fetchval(check) == 0
            finally:
                await other.close()
            await tx.rollback()
    finally:
        await conn.close()
    assert order == ["event", "set"]
    assert await store.aget(TASK, "k") == 1
