"""The event-batch contract of the built-in backends: ``acommit_events(EventBatchCommit)``.

Runs against memory, SQLite and PostgreSQL through the ``backend`` fixture. A batch is all or
nothing; each of its events is deduplicated on its own; its state is written once to each asset
where at least one of its events was inserted; a fence guards the whole batch.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from watchkeeper.store import (
    AssetNotFoundError,
    LeaseLostError,
    PostgresStateBackend,
    SqliteStateBackend,
    StateStoreError,
)
from watchkeeper.store.protocols import (
    BaseStateBackend,
    EventBatchCommit,
    EventCommit,
    Fence,
    Writer,
    encode_json,
    encode_value,
)

from tests.store._contract import INVOICES_SCOPE, ORDERS_SCOPE, assert_rejected, snapshot

WATCHER = Writer("watcher", "orders_watch")
Event = tuple[object, str | None]


def batch(
    *assets: str,
    events: list[Event],
    state: dict[str, object] | None = None,
    fence: Fence | None = None,
) -> EventBatchCommit:
    """A batch of ``(payload, dedup_key)`` events with ``state``, written by WATCHER."""
    return EventBatchCommit(
        watcher="orders_watch",
        assets=assets,
        events=tuple((encode_json(p, what="payload"), key) for p, key in events),
        state={k: encode_value(k, v) for k, v in (state or {}).items()},
        writer=WATCHER,
        fence=fence,
    )


def single(asset: str, payload: object, dedup_key: str | None = None, **state: Any) -> EventCommit:
    return EventCommit(
        "orders_watch",
        (asset,),
        encode_json(payload, what="payload"),
        dedup_key,
        {k: encode_value(k, v) for k, v in state.items()},
        WATCHER,
    )


def plain(count: int, start: int = 0) -> list[Event]:
    return [(n, None) for n in range(start, start + count)]


class TestEventBatches:
    async def test_every_event_is_written_in_order_and_the_state_once(
        self, store: BaseStateBackend
    ) -> None:
        """Each event lands on each asset, ids in (event, asset) order; the state is one write."""
        events = await store.events.acommit_batch(
            batch("orders", "invoices", events=plain(3), state={"watermark": 2})
        )
        assert [(e.payload, e.asset) for e in events] == [
            (0, "orders"),
            (0, "invoices"),
            (1, "orders"),
            (1, "invoices"),
            (2, "orders"),
            (2, "invoices"),
        ]
        assert [e.id for e in events] == sorted(e.id for e in events)
        assert events == await store.events.alist_events()
        for scope in (ORDERS_SCOPE, INVOICES_SCOPE):
            entry = await store.aget_entry(scope, "watermark")
            assert entry is not None
            assert (entry.value, entry.version, entry.writer) == (2, 1, WATCHER)

    async def test_a_large_batch_keeps_its_order(self, store: BaseStateBackend) -> None:
        """A batch of more rows than one insert statement takes comes back whole and in order."""
        events = await store.events.acommit_batch(
            batch("orders", events=plain(1000), state={"w": 999})
        )
        assert [e.payload for e in events] == list(range(1000))
        assert [e.id for e in events] == [e.id for e in await store.events.alist_events()]
        assert await store.aget(ORDERS_SCOPE, "w") == 999

    async def test_each_event_is_deduplicated_on_its_own(self, store: BaseStateBackend) -> None:
        """Recorded keys are suppressed one by one; the rest and the state are written."""
        await store.events.acommit(single("orders", "first", "m1", w=1))
        events = await store.events.acommit_batch(
            batch(
                "orders",
                events=[("again", "m1"), ("new", "m2"), ("plain", None), ("m2 twice", "m2")],
                state={"w": 4},
            )
        )
        assert [(e.payload, e.dedup_key) for e in events] == [("new", "m2"), ("plain", None)]
        entry = await store.aget_entry(ORDERS_SCOPE, "w")
        assert entry is not None and (entry.value, entry.version) == (4, 2)

    async def test_a_batch_redelivered_in_full_writes_nothing(
        self, store: BaseStateBackend
    ) -> None:
        """When every event of a batch is a duplicate, neither events nor state are written."""
        keyed: list[Event] = [("a", "m1"), ("b", "m2")]
        await store.events.acommit_batch(batch("orders", events=keyed, state={"w": 2}))
        before = await snapshot(store)
        assert await store.events.acommit_batch(batch("orders", events=keyed, state={"w": 0})) == []
        assert await snapshot(store) == before
        assert await store.aget(ORDERS_SCOPE, "w") == 2

    async def test_dedup_and_state_are_per_asset(self, store: BaseStateBackend) -> None:
        """A key recorded on one asset suppresses the batch there only, with its state."""
        await store.events.acommit(single("orders", "seen", "m1", w=1))
        events = await store.events.acommit_batch(
            batch("orders", "invoices", events=[("again", "m1")], state={"w": 2})
        )
        assert [(e.asset, e.payload) for e in events] == [("invoices", "again")]
        assert await store.aget(ORDERS_SCOPE, "w") == 1
        assert await store.aget(INVOICES_SCOPE, "w") == 2

    async def test_an_unknown_asset_fails_the_whole_batch(self, store: BaseStateBackend) -> None:
        """A batch naming an unregistered asset raises and writes nothing anywhere."""
        await assert_rejected(
            store,
            AssetNotFoundError,
            store.events.acommit_batch,
            batch("orders", "ghost", events=plain(3), state={"w": 3}),
            says=("ghost",),
        )

    async def test_a_stale_fence_refuses_the_whole_batch(self, store: BaseStateBackend) -> None:
        """After the lease moved, the old holder's batch raises LeaseLostError and writes nothing."""
        await store.leases.aclaim_leases("a", ["w"], 60)
        stale = Fence("w", "a", 1)
        assert (
            len(await store.events.acommit_batch(batch("orders", events=plain(2), fence=stale)))
            == 2
        )
        await store.leases.arelease_leases("a", ["w"])
        assert await store.leases.aclaim_leases("b", ["w"], 60) == {"w": 2}
        await assert_rejected(
            store,
            LeaseLostError,
            store.events.acommit_batch,
            batch("orders", events=plain(2, 2), state={"w": 3}, fence=stale),
        )

    async def test_batches_and_single_commits_share_transactions(
        self, store: BaseStateBackend
    ) -> None:
        """Concurrent batches and single events all commit, a failing batch alone failing."""
        outcomes: dict[str, object] = {}

        async def send(name: str, commit: EventBatchCommit | EventCommit) -> None:
            try:
                if isinstance(commit, EventBatchCommit):
                    outcomes[name] = len(await store.events.acommit_batch(commit))
                else:
                    outcomes[name] = len(await store.events.acommit(commit))
            except AssetNotFoundError as exc:
                outcomes[name] = type(exc).__name__

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(send, "batch", batch("orders", events=plain(50), state={"b": 1}))
                tg.start_soon(send, "ghost", batch("ghost", events=plain(5)))
                for n in range(10):
                    tg.start_soon(send, f"single{n}", single("orders", n, f"s{n}"))
        assert outcomes.pop("batch") == 50
        assert outcomes.pop("ghost") == "AssetNotFoundError"
        assert set(outcomes.values()) == {1}
        listed = await store.events.alist_events()
        assert len(listed) == 60
        assert len({e.id for e in listed}) == 60
        assert await store.aget(ORDERS_SCOPE, "b") == 1

    async def test_payloads_are_decoded_once_when_read(self, store: BaseStateBackend) -> None:
        """A batch's payloads travel as their JSON text and come back decoded on the first
        read of each event's payload, the same object on every later read; the events equal
        those the log lists."""
        events = await store.events.acommit_batch(
            EventBatchCommit("w", ("orders",), (('{"n":1}', None), ('[2,{"x":null}]', None)))
        )
        assert [e.payload for e in events] == [{"n": 1}, [2, {"x": None}]]
        assert all(e.payload is e.payload for e in events)
        assert await store.events.alist_events() == events

    def test_an_empty_batch_is_refused(self) -> None:
        """A batch needs at least one event: a state alone would commit without an event."""
        with pytest.raises(ValueError, match="at least one event"):
            EventBatchCommit("w", ("orders",), (), {"w": "1"})

    @pytest.mark.parametrize(
        "event",
        [("1",), ("1", 2), (None, None), ["1", None]],
        ids=["short", "key", "payload", "list"],
    )
    def test_a_malformed_event_is_refused_by_index(self, event: object) -> None:
        """Each event must be a (payload_json, dedup_key) tuple; the error names its index."""
        with pytest.raises(TypeError, match=r"events\[1\] must be a \(payload_json"):
            EventBatchCommit("w", ("orders",), (("1", None), event))  # type: ignore[arg-type]


@pytest.fixture
async def poisoned(
    store: BaseStateBackend, tmp_path: Path, request: pytest.FixtureRequest
) -> BaseStateBackend:
    """The SQLite or PostgreSQL store, its database refusing any event whose payload is
    ``"poison"`` (a trigger on ``asset_events``): a failure in the middle of a batch's writes."""
    if isinstance(store, SqliteStateBackend):
        conn = sqlite3.connect(tmp_path / "state.db")
        try:
            conn.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON asset_events "
                "WHEN NEW.payload = '\"poison\"' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
            )
            conn.commit()
        finally:
            conn.close()
    elif isinstance(store, PostgresStateBackend):
        admin = await asyncpg.connect(request.getfixturevalue("pg_dsn"))
        try:
            await admin.execute(
                f"""CREATE FUNCTION "{store.schema}".poison() RETURNS trigger AS $$
                BEGIN
                    IF NEW.payload = '"poison"' THEN RAISE EXCEPTION 'poisoned'; END IF;
                    RETURN NEW;
                END $$ LANGUAGE plpgsql"""
            )
            await admin.execute(
                f'CREATE TRIGGER poison BEFORE INSERT ON "{store.schema}".asset_events '
                f'FOR EACH ROW EXECUTE FUNCTION "{store.schema}".poison()'
            )
        finally:
            await admin.close()
    else:
        pytest.skip("the memory backend has no database to refuse a row")  # not a service
    return store


class TestBatchAtomicityInTheDatabase:
    async def test_a_row_refused_late_in_a_batch_leaves_nothing(
        self, poisoned: BaseStateBackend
    ) -> None:
        """The database refusing the 300th event of a batch undoes the 299 written before it."""
        events: list[Event] = [*plain(299), ("poison", None)]
        await assert_rejected(
            poisoned,
            StateStoreError,
            poisoned.events.acommit_batch,
            batch("orders", events=events, state={"w": 1}),
            says=("poisoned",),
        )
        assert len(await poisoned.events.acommit_batch(batch("orders", events=plain(299)))) == 299

    async def test_a_refused_batch_fails_alone_in_its_group(
        self, poisoned: BaseStateBackend
    ) -> None:
        """Sharing a transaction with other commits, a refused batch fails and they commit."""
        outcomes: dict[str, object] = {}
        start = anyio.Event()

        async def send(name: str, commit: EventBatchCommit | EventCommit) -> None:
            await start.wait()
            try:
                if isinstance(commit, EventBatchCommit):
                    outcomes[name] = len(await poisoned.events.acommit_batch(commit))
                else:
                    outcomes[name] = len(await poisoned.events.acommit(commit))
            except StateStoreError as exc:
                outcomes[name] = "poisoned" in str(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                bad = batch("orders", events=[*plain(20), ("poison", None)], state={"bad": 1})
                tg.start_soon(send, "bad", bad)
                tg.start_soon(send, "good", batch("orders", events=plain(5, 100), state={"ok": 1}))
                for n in range(5):
                    tg.start_soon(send, f"single{n}", single("orders", n))
                await anyio.wait_all_tasks_blocked()
                start.set()
        assert outcomes == {"bad": True, "good": 5, **{f"single{n}": 1 for n in range(5)}}
        assert sorted(e.payload for e in await poisoned.events.alist_events()) == [
            *range(5),
            *range(100, 105),
        ]
        assert await poisoned.aget(ORDERS_SCOPE, "bad") is None
        assert await poisoned.aget(ORDERS_SCOPE, "ok") == 1
