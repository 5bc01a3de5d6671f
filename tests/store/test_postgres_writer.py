"""PostgresStateBackend's group writer: batches in flight side by side, and what keeps them apart.

A batch is held in flight by locking, from another connection, a row it must write; meanwhile
the tests see which other writes go ahead (event commits on other assets) and which wait for
it (another event on the same asset, any other kind of write). Then, what one batch's event
commits check in the statement that writes them (assets, leases), each commit on its own.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import anyio
import asyncpg
import pytest
from watchkeeper.store import (
    Asset,
    AssetEvent,
    AssetScope,
    LeaseLostError,
    PostgresStateBackend,
    TaskScope,
)
from watchkeeper.store._commit_queue import CommitQueue
from watchkeeper.store.protocols import EventBatchCommit, EventCommit, Fence, Writer

TASK = TaskScope("dag", "run", "task")
OTHERS = 40
"""Watchers committing beside the held batch: more than the writer sends beside one alone."""
TTL = timedelta(seconds=30)


@pytest.fixture
async def store(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStateBackend]:
    async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
        await backend.events.aregister_assets(
            [Asset("a"), *(Asset(f"b{i}") for i in range(OTHERS))]
        )
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


def _queue(store: PostgresStateBackend) -> CommitQueue[Any]:
    """The backend's group-commit queue (its writer is open)."""
    writer = store._writer
    assert writer is not None
    return writer.queue


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
    await store.events.acommit(_event("wa", "a", 0))
    done: dict[str, list[AssetEvent]] = {}

    async def commit(name: str, commit: EventCommit) -> None:
        done[name] = await store.events.acommit(commit)

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
            with anyio.fail_after(10):  # a2 queued behind the held batch, not sent beside it
                await _queue(store).wait_held(1)
            assert "a1" not in done and "a2" not in done
            await tx.rollback()
    finally:
        await conn.close()
    assert done["a1"][0].id < done["a2"][0].id
    assert await store.aget(AssetScope(name="a"), "wm") == 2
    listed = await store.events.alist_events(asset="a")
    assert [e.payload for e in listed] == [0, 1, 2]


async def test_other_writes_wait_for_the_batch_in_flight(
    store: PostgresStateBackend, pg_dsn: str, pg_schema: str
) -> None:
    """A write that is not an event commit runs alone: not beside a held batch, and not before
    it."""
    await store.events.acommit(_event("wa", "a", 0))
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
            tg.start_soon(run, "event", lambda: store.events.acommit(_event("wa", "a", 1)))
            await _wait_blocked(conn)
            tg.start_soon(run, "set", lambda: store.aset(TASK, "k", 1))
            with anyio.fail_after(10):  # the set queued behind the held batch, not beside it
                await _queue(store).wait_held(1)
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


async def _one_batch(store: PostgresStateBackend, calls: dict[str, Any]) -> dict[str, object]:
    """Run ``calls`` (name: coroutine function) at once, so they share one batch; return each
    outcome (the events' payloads, a value, or the error's type name) and check they did."""
    outcomes: dict[str, object] = {}

    async def run(name: str, fn: Any) -> None:
        try:
            got = await fn()
        except Exception as exc:  # noqa: BLE001 - the test compares the outcomes
            outcomes[name] = type(exc).__name__
        else:
            outcomes[name] = [e.payload for e in got] if isinstance(got, list) else got

    before = store.commit_stats.batches
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for name, fn in calls.items():
                tg.start_soon(run, name, fn)
    assert store.commit_stats.batches == before + 1  # one transaction for all of them
    return outcomes


def _fenced(watcher: str, asset: str, n: int, fence: Fence | None) -> EventCommit:
    return EventCommit(watcher, (asset,), str(n), state={"wm": str(n)}, fence=fence)


async def test_a_round_of_commits_refuses_only_the_commits_that_fail_their_checks(
    store: PostgresStateBackend,
) -> None:
    """In one statement's round: a commit naming an unknown asset and one whose lease another
    daemon holds write nothing (no event, no state, on any of their assets); the others of the
    batch commit, and each error is the one it would get alone."""
    held = await store.leases.aclaim_leases("me", ["wa", "wb1"], TTL)
    await store.leases.aclaim_leases("other", ["wb2"], TTL)
    calls = {
        "live": lambda: store.events.acommit(_fenced("wa", "a", 1, Fence("wa", "me", held["wa"]))),
        "unfenced": lambda: store.events.acommit(_fenced("wb0", "b0", 1, None)),
        "unknown": lambda: store.events.acommit(
            EventCommit("wb1", ("b1", "nowhere"), "1", state={"wm": "1"})
        ),
        "stolen": lambda: store.events.acommit(_fenced("wb2", "b2", 1, Fence("wb2", "me", 1))),
        "unclaimed": lambda: store.events.acommit(_fenced("wb3", "b3", 1, Fence("wb3", "me", 1))),
    }
    outcomes = await _one_batch(store, calls)
    assert outcomes == {
        "live": [1],
        "unfenced": [1],
        "unknown": "AssetNotFoundError",
        "stolen": "LeaseLostError",
        "unclaimed": "LeaseLostError",
    }
    for asset in ("b1", "b2", "b3"):
        assert await store.events.alist_events(asset=asset) == []
        assert await store.alist(AssetScope(name=asset)) == []
    assert await store.aget(AssetScope(name="a"), "wm") == 1
    with pytest.raises(LeaseLostError, match="'other' holds it with token 1"):
        await store.events.acommit(_fenced("wb2", "b2", 2, Fence("wb2", "me", 1)))


async def test_commits_of_several_rounds_beside_a_fenced_set_keep_their_order(
    store: PostgresStateBackend,
) -> None:
    """Two commits on one asset in one batch take two statements (the second sees the first),
    with the leases of the whole batch locked first; a stale fence still refuses its own
    commit or set, and nothing else."""
    held = await store.leases.aclaim_leases("me", ["wa", "wb0", "task"], TTL)
    fence = Fence("wa", "me", held["wa"])
    writer = Writer("task", "dag.task", 1, fence=Fence("task", "me", held["task"]))
    stale = Writer("task", "dag.task", 1, fence=Fence("task", "me", held["task"] + 1))
    calls = {
        "first": lambda: store.events.acommit(_fenced("wa", "a", 1, fence)),
        "second": lambda: store.events.acommit(_fenced("wa", "a", 2, fence)),
        "stale": lambda: store.events.acommit(
            _fenced("wb0", "b0", 1, Fence("wb0", "me", held["wb0"] + 1))
        ),
        "set": lambda: store.aset(TASK, "k", 1, writer=writer),
        "stale set": lambda: store.aset(TASK, "j", 1, writer=stale),
    }
    outcomes = await _one_batch(store, calls)
    assert outcomes == {
        "first": [1],
        "second": [2],
        "stale": "LeaseLostError",
        "set": 1,
        "stale set": "LeaseLostError",
    }
    assert [e.payload for e in await store.events.alist_events(asset="a")] == [1, 2]
    assert await store.aget(AssetScope(name="a"), "wm") == 2
    assert await store.events.alist_events(asset="b0") == []
    assert await store.aget(TASK, "j") is None


async def test_an_event_round_carries_every_text_byte_for_byte(
    store: PostgresStateBackend, pg_dsn: str, pg_schema: str
) -> None:
    """The texts of a round of commits travel inside one JSON document: escapes, quotes,
    backslashes, spacing and characters outside the BMP come out exactly as they went in, in
    the payloads (a single event's and a batch's) and in the state; an asset named twice gets
    one event."""
    text = '{"z":1, "a":[1,{"é\U0001f642":"\\u0000\\"\\\\"}],  "m":1.5e300,"s":"\\ud83d\\ude42"}'
    calls = {
        "twice": lambda: store.events.acommit(
            EventCommit("wa", ("a", "b0", "a"), text, state={"k": text, "é\U0001f642": "1"})
        ),
        "other": lambda: store.events.acommit(EventCommit("wb1", ("b1",), text, dedup_key="d")),
        "batch": lambda: store.events.acommit_batch(
            EventBatchCommit(
                "wb2", ("b2",), ((text, "k"), ("null", None), (text, "k"), (text, None))
            )
        ),
    }
    outcomes = await _one_batch(store, calls)
    assert outcomes["twice"] == [json.loads(text)] * 2
    assert outcomes["batch"] == [json.loads(text), None, json.loads(text)]
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(
            f'SELECT asset_name, payload FROM "{pg_schema}".asset_events ORDER BY id'
        )
    finally:
        await conn.close()
    assert [(r[0], r[1]) for r in rows] == [
        ("a", text), ("b0", text), ("b1", text), ("b2", text), ("b2", "null"), ("b2", text)
    ]  # fmt: skip
    for asset in ("a", "b0"):
        raw = await store.aget_raw(AssetScope(name=asset), "k")
        assert raw is not None and raw.value_json == text
        assert await store.aget(AssetScope(name=asset), "é\U0001f642") == 1


async def test_plain_upserts_of_one_batch_fail_alone(store: PostgresStateBackend) -> None:
    """A batch of plain asset-state upserts is one statement: a put on an unknown asset gets
    its error and writes nothing, the others are written with their versions; two puts on
    one row through two scopes naming the same asset are replayed one by one, both applied."""
    await store.aset(AssetScope(name="b0"), "k", 0)
    (a_id,) = [a.asset_id for a in await store.events.alist_assets() if a.name == "a"]
    calls = {
        "known": lambda: store.aset(AssetScope(name="b0"), "k", 1),
        "other": lambda: store.aset(AssetScope(name="b1"), "k", 1),
        "unknown": lambda: store.aset(AssetScope(name="nowhere"), "k", 1),
    }
    outcomes = await _one_batch(store, calls)
    assert outcomes == {"known": 2, "other": 1, "unknown": "AssetNotFoundError"}
    assert [(e.key, e.version) for e in await store.alist(AssetScope(name="b0"))] == [("k", 2)]
    assert await store.aget(AssetScope(name="b1"), "k") == 1
    twice = {
        "by_name": lambda: store.aset(AssetScope(name="a"), "k", "name"),
        "by_id": lambda: store.aset(AssetScope(asset_id=a_id), "k", "id"),
    }
    before = store.commit_stats.batches
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for fn in twice.values():
                tg.start_soon(fn)
    assert store.commit_stats.batches == before + 1
    (entry,) = await store.alist(AssetScope(name="a"))
    assert entry.version == 2 and entry.value in ("name", "id")


async def test_single_commits_and_a_batch_share_one_round(store: PostgresStateBackend) -> None:
    """A single event commit is a batch of one: commits and a trigger's batch of events on
    other assets go in one statement; the batch's duplicate dedup key is suppressed on its
    own, and each gets its own events and state."""
    calls = {
        "single": lambda: store.events.acommit(_event("wa", "a", 1)),
        "batch": lambda: store.events.acommit_batch(
            EventBatchCommit(
                "wb0", ("b0", "b1"), (("1", "x"), ("2", None), ("3", "x")), state={"wm": "3"}
            )
        ),
        "keyed": lambda: store.events.acommit(
            EventCommit("wb2", ("b2",), "1", dedup_key="x", state={"wm": "1"})
        ),
    }
    outcomes = await _one_batch(store, calls)
    assert outcomes == {"single": [1], "batch": [1, 1, 2, 2], "keyed": [1]}
    for asset in ("b0", "b1"):
        assert [e.payload for e in await store.events.alist_events(asset=asset)] == [1, 2]
        assert await store.aget(AssetScope(name=asset), "wm") == 3
    again = await store.events.acommit(
        EventCommit("wb2", ("b2",), "9", dedup_key="x", state={"wm": "9"})
    )
    assert again == [] and await store.aget(AssetScope(name="b2"), "wm") == 1


@pytest.mark.parametrize(
    "at",
    [
        datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(1893, 4, 1, 12, 30, 15, 123457, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2026, 3, 29, 1, 30, 0, 999999, tzinfo=UTC),  # a DST change in the session's zone
        datetime(9999, 12, 31, 23, 59, 59, 999998, tzinfo=UTC),
    ],
)
async def test_a_writes_time_is_stored_to_the_microsecond(
    pg_dsn: str, pg_schema: str, at: datetime
) -> None:
    """An event commit and a plain upsert carry their time inside their JSON document: what
    is stored (and returned) is the backend's clock to the microsecond, far from 1970 too,
    whatever time zone the session is in."""
    async with PostgresStateBackend(
        pg_dsn, schema=pg_schema, server_settings={"TimeZone": "Europe/Berlin"}
    ) as store:
        await store.events.aregister_assets([Asset("a"), Asset("b")])
        store.clock = lambda: at
        (event,) = await store.events.acommit(EventCommit("w", ("a",), "1", state={"wm": "1"}))
        assert await store.aset(AssetScope(name="b"), "k", 1) == 1
        assert event.created_at == at
        assert [e.created_at for e in await store.events.alist_events(asset="a")] == [at]
        for asset, key in (("a", "wm"), ("b", "k")):
            entry = await store.aget_entry(AssetScope(name=asset), key)
            assert entry is not None and entry.updated_at == at
