"""The metastore contract of the built-in backends: asset events, GC, trigger and daemon status.

Runs against memory, SQLite and PostgreSQL through the ``backend`` fixture, like
``test_contract.py``. Times handed to garbage collection are derived from the rows' own
``updated_at``/``expires_at``, so the tests never depend on the wall clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from watchkeeper.store import NEVER_EXPIRE, Asset, AssetNotFoundError, StateStoreError
from watchkeeper.store.protocols import (
    BaseStateBackend,
    DaemonStatus,
    EventCommit,
    RefusedDefinition,
    TriggerStatus,
    Writer,
    encode_json,
    encode_value,
)

from tests.store._contract import (
    INVOICES_SCOPE,
    ORDERS,
    ORDERS_SCOPE,
    OTHER_RUN,
    TASK,
    TASK_MAP_0,
    snapshot,
)

WATCHER = Writer("watcher", "orders_watch")


def commit(
    *assets: str,
    payload: object = None,
    dedup_key: str | None = None,
    state: dict[str, object] | None = None,
    watcher: str = "orders_watch",
) -> EventCommit:
    return EventCommit(
        watcher=watcher,
        assets=assets,
        payload_json=encode_json(payload, what="payload"),
        dedup_key=dedup_key,
        state={k: encode_value(k, v) for k, v in (state or {}).items()},
        writer=WATCHER,
    )


class TestEvents:
    async def test_one_event_per_asset(self, store: BaseStateBackend) -> None:
        """A commit for two assets writes one event for each, in commit order."""
        events = await store.events.acommit(commit("orders", "invoices", payload={"row": 1}))
        assert [(e.asset, e.watcher, e.payload, e.dedup_key) for e in events] == [
            ("orders", "orders_watch", {"row": 1}, None),
            ("invoices", "orders_watch", {"row": 1}, None),
        ]
        assert events[0].id < events[1].id
        assert all(e.created_at.tzinfo is not None for e in events)
        assert await store.events.alist_events() == events

    async def test_payload_round_trips(self, store: BaseStateBackend) -> None:
        """Any JSON payload, null included, is stored and listed as it was committed."""
        payloads: list[object] = [None, 0, "s", [1, None], {"a": {"b": [1.5]}}, True]
        for payload in payloads:
            (event,) = await store.events.acommit(commit("orders", payload=payload))
            assert event.payload == payload
        assert [e.payload for e in await store.events.alist_events()] == payloads

    async def test_state_is_written_with_the_event(self, store: BaseStateBackend) -> None:
        """The commit's state lands in every asset's state, one version up, with the writer."""
        await store.aset(ORDERS_SCOPE, "watermark", 10)
        await store.events.acommit(
            commit("orders", "invoices", payload=1, state={"watermark": 11, "seen": [1]})
        )
        for scope in (ORDERS_SCOPE, INVOICES_SCOPE):
            assert await store.aget(scope, "watermark") == 11
            assert await store.aget(scope, "seen") == [1]
        entry = await store.aget_entry(ORDERS_SCOPE, "watermark")
        assert entry is not None and (entry.version, entry.writer) == (2, WATCHER)

    async def test_duplicate_writes_nothing(self, store: BaseStateBackend) -> None:
        """A commit whose dedup_key is recorded writes neither an event nor its state."""
        await store.events.acommit(commit("orders", payload=1, dedup_key="m1", state={"w": 5}))
        before = await snapshot(store)
        again = await store.events.acommit(
            commit("orders", payload=2, dedup_key="m1", state={"w": 3})
        )
        assert again == []
        assert await snapshot(store) == before
        assert await store.aget(ORDERS_SCOPE, "w") == 5

    async def test_dedup_is_per_asset(self, store: BaseStateBackend) -> None:
        """A dedup_key recorded for one asset still lets another asset record it once."""
        await store.events.acommit(commit("orders", dedup_key="m1", state={"w": 1}))
        events = await store.events.acommit(
            commit("orders", "invoices", dedup_key="m1", state={"w": 2})
        )
        assert [e.asset for e in events] == ["invoices"]
        assert await store.aget(ORDERS_SCOPE, "w") == 1
        assert await store.aget(INVOICES_SCOPE, "w") == 2
        assert await store.events.acommit(commit("orders", "invoices", dedup_key="m1")) == []

    async def test_without_dedup_key_every_commit_counts(self, store: BaseStateBackend) -> None:
        """Without a dedup_key, identical commits each write an event."""
        for _ in range(3):
            await store.events.acommit(commit("orders", payload="same"))
        assert len(await store.events.alist_events(asset="orders")) == 3

    @pytest.mark.parametrize("deactivate", [False, True], ids=["unknown", "inactive"])
    async def test_unknown_asset_fails_the_whole_commit(
        self, store: BaseStateBackend, deactivate: bool
    ) -> None:
        """A commit naming an unknown or inactive asset raises and writes nothing anywhere."""
        if deactivate:
            await store.events.aregister_assets([Asset("gone")])
            await store.events.adeactivate_asset("gone")
        before = await snapshot(store)
        with pytest.raises(AssetNotFoundError, match="gone"):
            await store.events.acommit(commit("orders", "gone", dedup_key="x", state={"w": 1}))
        assert await snapshot(store) == before
        assert len(await store.events.acommit(commit("orders", dedup_key="x"))) == 1

    async def test_list_filters(self, store: BaseStateBackend) -> None:
        """alist_events() filters by since_id and asset and stops at limit, in commit order."""
        for number in range(4):
            await store.events.acommit(commit("orders", "invoices", payload=number))
        everything = await store.events.alist_events()
        assert [e.payload for e in everything] == [0, 0, 1, 1, 2, 2, 3, 3]
        orders = await store.events.alist_events(asset="orders")
        assert [e.payload for e in orders] == [0, 1, 2, 3]
        cut = everything[3].id
        assert await store.events.alist_events(since_id=cut) == everything[4:]
        assert await store.events.alist_events(since_id=cut, asset="invoices") == [
            e for e in everything[4:] if e.asset == "invoices"
        ]
        assert await store.events.alist_events(limit=3) == everything[:3]
        assert await store.events.alist_events(since_id=everything[-1].id) == []

    async def test_list_newest_first_and_before(self, store: BaseStateBackend) -> None:
        """newest_first pages from the end of the log; before_id bounds the ids from above."""
        for number in range(5):
            await store.events.acommit(commit("orders", "invoices", payload=number))
        orders = await store.events.alist_events(asset="orders")
        newest = await store.events.alist_events(asset="orders", newest_first=True, limit=2)
        assert [e.payload for e in newest] == [4, 3]
        older = await store.events.alist_events(
            asset="orders", newest_first=True, limit=2, before_id=newest[-1].id
        )
        assert [e.payload for e in older] == [2, 1]
        assert await store.events.alist_events(asset="orders", before_id=orders[2].id) == orders[:2]
        between = await store.events.alist_events(
            asset="orders", since_id=orders[0].id, before_id=orders[3].id, newest_first=True
        )
        assert [e.payload for e in between] == [2, 1]
        assert await store.events.alist_events(before_id=orders[0].id) == []
        with pytest.raises(StateStoreError, match="before_id"):
            await store.events.alist_events(before_id=-1)

    async def test_concurrent_commits_get_unique_ordered_ids(self, store: BaseStateBackend) -> None:
        """Commits from many coroutines at once all land, with distinct increasing ids."""
        results: dict[int, int] = {}

        async def emit(number: int) -> None:
            (event,) = await store.events.acommit(
                commit("orders", payload=number, dedup_key=f"m{number}", state={f"k{number}": 1})
            )
            results[number] = event.id

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for number in range(40):
                    tg.start_soon(emit, number)
        listed = await store.events.alist_events()
        assert sorted(results.values()) == [e.id for e in listed]
        assert len(set(results.values())) == 40
        assert len(await store.alist(ORDERS_SCOPE)) == 40


class TestGarbageCollection:
    async def test_expired_rows_are_deleted(self, store: BaseStateBackend) -> None:
        """A row is kept until its expiry and deleted by the first GC after it."""
        await store.aset(TASK, "short", 1, retention=timedelta(hours=1))
        await store.aset(TASK, "other", 2)
        entry = await store.aget_entry(TASK, "short")
        assert entry is not None and entry.expires_at is not None
        early = await store.gc.acollect_garbage(now=entry.expires_at - timedelta(seconds=1))
        assert early.total == 0 and await store.aget(TASK, "short") == 1
        report = await store.gc.acollect_garbage(now=entry.expires_at + timedelta(seconds=1))
        assert report.expired == [(TASK, "short")] and report.total == 1
        assert await store.aget(TASK, "short") is None
        assert await store.aget(TASK, "other") == 2

    async def test_default_retention_counts_from_last_update(self, store: BaseStateBackend) -> None:
        """A row without retention goes default_retention_days after its update, as set at GC time."""
        await store.aset(TASK, "k", 1)
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None
        later = entry.updated_at + timedelta(days=31)
        kept = await store.gc.acollect_garbage(default_retention_days=60, now=later)
        assert kept.total == 0 and await store.aget(TASK, "k") == 1
        report = await store.gc.acollect_garbage(default_retention_days=30, now=later)
        assert report.retention == [(TASK, "k")] and report.expired == []
        assert await store.aget(TASK, "k") is None

    @pytest.mark.parametrize("batch_size", [0, 1])
    async def test_retention_cutoff_is_exact(
        self, store: BaseStateBackend, batch_size: int
    ) -> None:
        """With the backend's clock as GC time: a row without retention is kept at exactly
        default_retention_days after its update and collected one microsecond later."""
        t0 = datetime(2031, 1, 1, tzinfo=UTC)
        tick = timedelta(microseconds=1)
        store.clock = lambda: t0
        await store.aset(TASK, "k", 1)
        await store.aset(TASK, "later", 1)  # written one tick after k: inside the cutoff
        store.clock = lambda: t0 + tick
        await store.aset(TASK, "later", 2)
        for days in (30, 7):
            store.clock = lambda days=days: t0 + timedelta(days=days)  # type: ignore[misc]
            kept = await store.gc.acollect_garbage(
                default_retention_days=days, batch_size=batch_size
            )
            assert kept.total == 0 and await store.aget(TASK, "k") == 1
        store.clock = lambda: t0 + timedelta(days=7) + tick
        dry = await store.gc.acollect_garbage(default_retention_days=7, dry_run=True)
        assert dry.retention == [(TASK, "k")]
        report = await store.gc.acollect_garbage(default_retention_days=7, batch_size=batch_size)
        assert report.retention == [(TASK, "k")] and report.total == 1
        assert await store.aget(TASK, "k") is None and await store.aget(TASK, "later") == 2

    @pytest.mark.parametrize("batch_size", [0, 1])
    async def test_expiry_is_exact(self, store: BaseStateBackend, batch_size: int) -> None:
        """A row written with a retention expires at exactly write time + retention (the
        backend's clock): kept by a GC at that instant, collected one microsecond later."""
        t0 = datetime(2031, 1, 1, tzinfo=UTC)
        tick = timedelta(microseconds=1)
        store.clock = lambda: t0
        await store.aset(TASK, "k", 1, retention=timedelta(hours=1))
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None and entry.expires_at == t0 + timedelta(hours=1)
        store.clock = lambda: t0 + timedelta(hours=1)
        kept = await store.gc.acollect_garbage(batch_size=batch_size)
        assert kept.total == 0 and await store.aget(TASK, "k") == 1
        store.clock = lambda: t0 + timedelta(hours=1) + tick
        report = await store.gc.acollect_garbage(batch_size=batch_size)
        assert report.expired == [(TASK, "k")] and report.total == 1
        assert await store.aget(TASK, "k") is None

    async def test_zero_days_disables_default_retention(self, store: BaseStateBackend) -> None:
        """default_retention_days=0 keeps rows without retention forever."""
        await store.aset(TASK, "k", 1)
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None
        far = entry.updated_at + timedelta(days=10_000)
        assert (await store.gc.acollect_garbage(default_retention_days=0, now=far)).total == 0
        assert await store.aget(TASK, "k") == 1

    async def test_never_expire_is_never_collected(self, store: BaseStateBackend) -> None:
        """NEVER_EXPIRE rows survive any GC, whatever default_retention_days says."""
        await store.aset(TASK, "job_id", "spark-1", retention=NEVER_EXPIRE)
        entry = await store.aget_entry(TASK, "job_id")
        assert entry is not None
        far = entry.updated_at + timedelta(days=10_000)
        assert (await store.gc.acollect_garbage(default_retention_days=1, now=far)).total == 0
        assert await store.aget(TASK, "job_id") == "spark-1"

    async def test_explicit_retention_overrides_the_default(self, store: BaseStateBackend) -> None:
        """A row with a timedelta retention longer than the default waits for its own expiry."""
        await store.aset(TASK, "k", 1, retention=timedelta(days=365))
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None
        later = entry.updated_at + timedelta(days=31)
        assert (await store.gc.acollect_garbage(default_retention_days=30, now=later)).total == 0
        assert await store.aget(TASK, "k") == 1

    async def test_rewrite_refreshes_the_last_update(self, store: BaseStateBackend) -> None:
        """A row rewritten recently is kept although it was first written long ago."""
        now = datetime.now(UTC)
        store.clock = lambda: now - timedelta(days=40)
        await store.aset(TASK, "old", 1)
        await store.aset(TASK, "rewritten", 1)
        store.clock = lambda: now
        await store.aset(TASK, "rewritten", 2)
        report = await store.gc.acollect_garbage(default_retention_days=30, now=now)
        assert report.retention == [(TASK, "old")]
        assert await store.aget(TASK, "rewritten") == 2

    async def test_asset_state_has_no_retention(self, store: BaseStateBackend) -> None:
        """State of an active asset is never collected, however old."""
        await store.aset(ORDERS_SCOPE, "watermark", 1)
        entry = await store.aget_entry(ORDERS_SCOPE, "watermark")
        assert entry is not None
        far = entry.updated_at + timedelta(days=10_000)
        assert (await store.gc.acollect_garbage(default_retention_days=1, now=far)).total == 0
        assert await store.aget(ORDERS_SCOPE, "watermark") == 1

    async def test_orphan_sweep_after_deactivation(self, store: BaseStateBackend) -> None:
        """GC deletes the state of a deactivated asset and leaves active assets alone."""
        for key in ("a", "b"):
            await store.aset(ORDERS_SCOPE, key, 1)
            await store.aset(INVOICES_SCOPE, key, 1)
        await store.events.adeactivate_asset("orders")
        report = await store.gc.acollect_garbage()
        assert sorted(report.orphaned) == [("orders", "a"), ("orders", "b")]
        assert len(await store.alist(INVOICES_SCOPE)) == 2
        await store.events.aregister_assets([ORDERS])
        assert await store.alist(ORDERS_SCOPE) == []

    async def test_batches_delete_everything_due(self, store: BaseStateBackend) -> None:
        """Whatever the batch size, one pass deletes every expired and orphaned row."""
        await store.aset(TASK_MAP_0, "keep", 1, retention=NEVER_EXPIRE)
        for batch_size in (0, 1, 2, 100):
            await store.events.aregister_assets([ORDERS])
            for number in range(7):
                await store.aset(TASK, f"t{number}", number, retention=timedelta(minutes=1))
                await store.aset(ORDERS_SCOPE, f"o{number}", number)
            await store.events.adeactivate_asset("orders")
            entry = await store.aget_entry(TASK, "t6")
            assert entry is not None and entry.expires_at is not None
            report = await store.gc.acollect_garbage(
                batch_size=batch_size, now=entry.expires_at + timedelta(seconds=1)
            )
            assert (len(report.expired), len(report.orphaned)) == (7, 7), batch_size
            assert await store.alist(TASK) == []
            assert await store.aget(TASK_MAP_0, "keep") == 1

    async def test_dry_run_reports_without_deleting(self, store: BaseStateBackend) -> None:
        """dry_run reports what a real pass deletes, and deletes nothing."""
        await store.aset(TASK, "exp", 1, retention=timedelta(minutes=1))
        await store.aset(OTHER_RUN, "stale", 1)
        await store.aset(INVOICES_SCOPE, "w", 1)
        await store.events.adeactivate_asset("invoices")
        entry = await store.aget_entry(OTHER_RUN, "stale")
        assert entry is not None
        later = entry.updated_at + timedelta(days=31)
        before = await self._rows(store)
        dry = await store.gc.acollect_garbage(dry_run=True, now=later)
        assert dry.dry_run and await self._rows(store) == before
        real = await store.gc.acollect_garbage(now=later)
        assert not real.dry_run
        assert (dry.expired, dry.retention, sorted(dry.orphaned)) == (
            real.expired,
            real.retention,
            sorted(real.orphaned),
        )
        assert (real.expired, real.retention, real.orphaned) == (
            [(TASK, "exp")],
            [(OTHER_RUN, "stale")],
            [("invoices", "w")],
        )
        assert await store.alist(TASK) == await store.alist(OTHER_RUN) == []

    @staticmethod
    async def _rows(store: BaseStateBackend) -> tuple[object, ...]:
        """Every row, including those of inactive assets (reached via a dry run of nothing)."""
        task_rows = [await store.alist(scope) for scope in (TASK, OTHER_RUN)]
        orphans = (await store.gc.acollect_garbage(dry_run=True, default_retention_days=0)).orphaned
        return (task_rows, sorted(orphans))


def _status(trigger_id: str, **changes: object) -> TriggerStatus:
    fields: dict[str, object] = {
        "trigger_id": trigger_id,
        "classpath": "pkg.watchers.OrdersTrigger",
        "assets": ("orders",),
        "watchers": ("orders_watch",),
        "state": "running",
        "failures": 0,
        "last_error": None,
        "last_event_at": datetime(2024, 6, 1, 12, 30, 0, 123456, tzinfo=UTC),
        "events": 3,
        "owner": "daemon-1",
    }
    fields.update(changes)
    return TriggerStatus(**fields)  # type: ignore[arg-type]


def _without_updated_at(statuses: list[TriggerStatus]) -> list[tuple[object, ...]]:
    return [
        (
            s.trigger_id,
            s.classpath,
            tuple(s.assets),
            tuple(s.watchers),
            s.state,
            s.failures,
            s.last_error,
            s.last_event_at,
            s.events,
            s.owner,
        )
        for s in statuses
    ]


class TestTriggerStatus:
    async def test_empty_at_first(self, store: BaseStateBackend) -> None:
        """A fresh store has no trigger status."""
        assert await store.status.alist_trigger_status() == []

    async def test_save_and_list(self, store: BaseStateBackend) -> None:
        """Saved statuses are listed with every field, ordered by trigger_id."""
        saved = [
            _status("t2", assets=("orders", "invoices"), watchers=("a", "b")),
            _status("t1", state="failed", failures=3, last_error="boom", last_event_at=None),
        ]
        await store.status.asave_trigger_status(saved)
        listed = await store.status.alist_trigger_status()
        assert _without_updated_at(listed) == _without_updated_at([saved[1], saved[0]])

    async def test_save_upserts(self, store: BaseStateBackend) -> None:
        """Saving a trigger's status again replaces the previous row, every field of it."""
        await store.status.asave_trigger_status([_status("t1")])
        again = _status(
            "t1", classpath="pkg.Other", assets=("invoices",), watchers=("w2",),
            state="backing_off", failures=1, last_error="boom", last_event_at=None, events=9,
            owner="daemon-2",
        )  # fmt: skip
        await store.status.asave_trigger_status([again])
        (listed,) = await store.status.alist_trigger_status()
        assert (listed.state, listed.failures) == ("backing_off", 1)
        assert _without_updated_at([listed]) == _without_updated_at([again])

    async def test_delete(self, store: BaseStateBackend) -> None:
        """Deleting statuses removes exactly those; unknown ids are ignored."""
        await store.status.asave_trigger_status([_status("t1"), _status("t2"), _status("t3")])
        await store.status.adelete_trigger_status(["t1", "t3", "never"])
        assert [s.trigger_id for s in await store.status.alist_trigger_status()] == ["t2"]


T0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
TICK = timedelta(microseconds=1)


def at(store: BaseStateBackend, when: datetime) -> None:
    """Set the backend's clock: events get this created_at, GC takes it as now."""
    store.clock = lambda: when


class TestEventRetention:
    """GC deletes events older than [events] retention_days; events with a dedup_key stay at
    least dedup_retention_days, so a redelivery inside that window is still suppressed."""

    async def test_events_go_at_the_exact_retention_boundary(self, store: BaseStateBackend) -> None:
        """An event exactly retention_days old is kept; one microsecond later GC deletes it,
        and a newer event stays."""
        at(store, T0)
        (old,) = await store.events.acommit(commit("orders", payload="old"))
        at(store, T0 + timedelta(days=1))
        (new,) = await store.events.acommit(commit("orders", payload="new"))
        at(store, T0 + timedelta(days=30))
        kept = await store.gc.acollect_garbage(event_retention_days=30)
        assert (kept.events, kept.total) == (0, 0)
        assert await store.events.alist_events() == [old, new]
        at(store, T0 + timedelta(days=30) + TICK)
        report = await store.gc.acollect_garbage(event_retention_days=30)
        assert (report.events, report.total) == (1, 1)
        assert await store.events.alist_events() == [new]

    async def test_dedup_key_suppresses_a_redelivery_until_its_window_passed(
        self, store: BaseStateBackend
    ) -> None:
        """With a 1-day event retention and a 7-day dedup window, the plain event goes after a
        day, the keyed one stays (suppressing its redelivery) until 7 days have passed."""
        at(store, T0)
        await store.events.acommit(commit("orders", payload=1, dedup_key="m1", state={"w": 1}))
        await store.events.acommit(commit("orders", payload="plain"))
        days: dict[str, Any] = {"event_retention_days": 1, "dedup_retention_days": 7}
        at(store, T0 + timedelta(days=2))
        assert (await store.gc.acollect_garbage(**days)).events == 1
        assert [e.dedup_key for e in await store.events.alist_events()] == ["m1"]
        redelivered = commit("orders", payload=2, dedup_key="m1", state={"w": 0})
        assert await store.events.acommit(redelivered) == []
        at(store, T0 + timedelta(days=7))
        assert (await store.gc.acollect_garbage(**days)).events == 0
        assert await store.events.acommit(redelivered) == []
        assert await store.aget(ORDERS_SCOPE, "w") == 1
        at(store, T0 + timedelta(days=7) + TICK)
        assert (await store.gc.acollect_garbage(**days)).events == 1
        assert await store.events.alist_events() == []
        (again,) = await store.events.acommit(redelivered)
        assert (again.payload, again.dedup_key) == (2, "m1")
        assert await store.aget(ORDERS_SCOPE, "w") == 0

    async def test_a_keyed_event_follows_the_longer_event_retention(
        self, store: BaseStateBackend
    ) -> None:
        """With a dedup window shorter than the event retention, a keyed event stays (and
        suppresses) for the whole event retention."""
        at(store, T0)
        await store.events.acommit(commit("orders", dedup_key="m1"))
        at(store, T0 + timedelta(days=30))
        report = await store.gc.acollect_garbage(event_retention_days=30, dedup_retention_days=7)
        assert report.events == 0
        assert await store.events.acommit(commit("orders", dedup_key="m1")) == []
        at(store, T0 + timedelta(days=30) + TICK)
        report = await store.gc.acollect_garbage(event_retention_days=30, dedup_retention_days=7)
        assert report.events == 1

    async def test_zero_days_keep_events_forever(self, store: BaseStateBackend) -> None:
        """event_retention_days=0 keeps every event; dedup_retention_days=0 keeps those with a
        dedup_key while the others go."""
        at(store, T0)
        await store.events.acommit(commit("orders", payload="plain"))
        await store.events.acommit(commit("orders", payload="keyed", dedup_key="m1"))
        at(store, T0 + timedelta(days=100_000))
        assert (await store.gc.acollect_garbage(event_retention_days=0)).events == 0
        assert len(await store.events.alist_events()) == 2
        report = await store.gc.acollect_garbage(event_retention_days=1, dedup_retention_days=0)
        assert report.events == 1
        assert [e.payload for e in await store.events.alist_events()] == ["keyed"]

    @pytest.mark.parametrize("batch_size", [0, 1, 2, 100])
    async def test_batches_delete_every_due_event(
        self, store: BaseStateBackend, batch_size: int
    ) -> None:
        """Whatever state_cleanup_batch_size is, one pass deletes every due event, no other."""
        at(store, T0)
        for number in range(5):
            await store.events.acommit(commit("orders", "invoices", payload=number))
        at(store, T0 + timedelta(days=2))
        (fresh,) = await store.events.acommit(commit("orders", payload="fresh"))
        report = await store.gc.acollect_garbage(event_retention_days=1, batch_size=batch_size)
        assert report.events == 10
        assert await store.events.alist_events() == [fresh]

    async def test_dry_run_counts_what_a_real_pass_deletes(self, store: BaseStateBackend) -> None:
        """A dry run reports the number of due events and deletes none of them."""
        at(store, T0)
        await store.events.acommit(commit("orders", "invoices", payload=1))
        await store.events.acommit(commit("orders", payload=2, dedup_key="m1"))
        at(store, T0 + timedelta(days=3))
        await store.events.acommit(commit("orders", payload=3))
        before = await store.events.alist_events()
        days: dict[str, Any] = {"event_retention_days": 2, "dedup_retention_days": 2}
        dry = await store.gc.acollect_garbage(dry_run=True, **days)
        assert (dry.dry_run, dry.events) == (True, 3)
        assert await store.events.alist_events() == before
        real = await store.gc.acollect_garbage(**days)
        assert (real.dry_run, real.events) == (False, 3)
        assert [e.payload for e in await store.events.alist_events()] == [3]

    async def test_ids_keep_growing_after_gc(self, store: BaseStateBackend) -> None:
        """Event ids are never reused once GC deleted the newest events, so a reader that
        follows 'events with an id above N' sees every new one."""
        at(store, T0)
        for number in range(3):
            await store.events.acommit(commit("orders", payload=number))
        last = (await store.events.alist_events())[-1].id
        at(store, T0 + timedelta(days=40))
        assert (await store.gc.acollect_garbage()).events == 3
        (event,) = await store.events.acommit(commit("orders", payload="next"))
        assert event.id > last
        assert await store.events.alist_events(since_id=last) == [event]
        assert await store.events.alist_events(since_id=event.id - 1, asset="orders") == [event]

    @pytest.mark.parametrize(
        "days",
        [
            {"event_retention_days": -1},
            {"dedup_retention_days": -1},
            {"event_retention_days": True},
            {"event_retention_days": 1.5},
        ],
    )
    async def test_bad_retention_is_refused_and_deletes_nothing(
        self, store: BaseStateBackend, days: dict[str, Any]
    ) -> None:
        """A negative or non-int event retention is a ValueError naming it; nothing is deleted."""
        at(store, T0)
        await store.events.acommit(commit("orders", payload=1))
        await store.aset(TASK, "k", 1, retention=timedelta(seconds=1))
        before = (await snapshot(store), await store.aget(TASK, "k"))
        at(store, T0 + timedelta(days=400))
        (name,) = days
        with pytest.raises(ValueError, match=f"invalid {name} .*: must be an int >= 0"):
            await store.gc.acollect_garbage(**days)
        assert (await snapshot(store), await store.aget(TASK, "k")) == before

    async def test_a_huge_retention_keeps_everything(self, store: BaseStateBackend) -> None:
        """A retention reaching before year 1 deletes nothing instead of overflowing."""
        at(store, T0)
        await store.events.acommit(commit("orders", payload=1))
        report = await store.gc.acollect_garbage(event_retention_days=10**12)
        assert report.events == 0 and len(await store.events.alist_events()) == 1


BAD_METASTORE_CALLS: list[tuple[str, str, Any]] = [
    ("list_events_limit", "invalid limit -1: ", lambda s: s.events.alist_events(limit=-1)),
    ("list_events_since", "since_id must be an int", lambda s: s.events.alist_events(since_id="0")),
    ("list_events_asset", "invalid asset name ''", lambda s: s.events.alist_events(asset="")),
    ("gc_batch_size", "invalid batch_size -5: ", lambda s: s.gc.acollect_garbage(batch_size=-5)),
    (
        "gc_retention",
        "invalid default_retention_days -1: ",
        lambda s: s.gc.acollect_garbage(default_retention_days=-1),
    ),
    (
        "register_assets",
        "assets must be a sequence of Asset",
        lambda s: s.events.aregister_assets(["x"]),
    ),
    (
        "register_a_str",
        "assets must be a sequence of Asset",
        lambda s: s.events.aregister_assets("ab"),
    ),
    ("commit_event", "commit must be an EventCommit", lambda s: s.events.acommit({"x": 1})),
    ("deactivate", "invalid asset name ''", lambda s: s.events.adeactivate_asset("")),
    ("save_status", "statuses must be a sequence of", lambda s: s.status.asave_trigger_status([1])),
    (
        "delete_status",
        "trigger_ids must be a sequence of",
        lambda s: s.status.adelete_trigger_status([1]),
    ),
    (
        "claim_owner",
        "invalid owner '': must be a non-empty str",
        lambda s: s.leases.aclaim_leases("", ["t"], 5),
    ),
    (
        "claim_ttl",
        "invalid ttl 0: must be positive",
        lambda s: s.leases.aclaim_leases("me", ["t"], 0),
    ),
]


class TestBadMetastoreArguments:
    @pytest.mark.parametrize(
        ("message", "call"),
        [(m, c) for _, m, c in BAD_METASTORE_CALLS],
        ids=[name for name, _, _ in BAD_METASTORE_CALLS],
    )
    async def test_every_backend_refuses_alike(
        self, store: BaseStateBackend, message: str, call: Any
    ) -> None:
        """Memory, SQLite and PostgreSQL refuse the same bad metastore argument with the same
        error of the tree and message, and change nothing."""
        await store.events.aregister_assets([ORDERS])
        await store.events.acommit(commit("orders", payload=1))
        before = await snapshot(store)
        with pytest.raises((ValueError, TypeError)) as info:
            await call(store)
        assert isinstance(info.value, StateStoreError)
        assert str(info.value).startswith(message), str(info.value)
        assert await snapshot(store) == before


T_START = datetime(2024, 6, 1, 12, 0, 0, 250000, tzinfo=UTC)


def _daemon(owner: str, **changes: object) -> DaemonStatus:
    fields: dict[str, object] = {
        "owner": owner,
        "started_at": T_START,
        "heartbeat_at": T_START + timedelta(seconds=42, microseconds=5),
        "lease_ttl": 15.0,
        "watchers_path": "/srv/watchers",
        "refused": (),
    }
    fields.update(changes)
    return DaemonStatus(**fields)  # type: ignore[arg-type]


class TestDaemonStatus:
    async def test_empty_at_first(self, store: BaseStateBackend) -> None:
        """A fresh store has no daemon status."""
        assert await store.status.alist_daemon_status() == []

    async def test_save_and_list_round_trips_every_field(self, store: BaseStateBackend) -> None:
        """Rows come back equal, ordered by owner, refusals included even when their texts
        hold NUL, newlines or lone surrogates (which a PostgreSQL text column refuses)."""
        refused = (
            RefusedDefinition("bad.py", None, "invalid asset name 'a\\x00b': control character"),
            RefusedDefinition("odd\udc80.py", "feed\x00", "line one\nline two"),
        )
        settings = {"heartbeat_interval": 5.0, "lease_ttl": 3.0, "reload_interval": 0.25}
        saved = [
            _daemon("host:2:b"),
            _daemon("host:1:a", refused=refused, lease_ttl=2.5, settings=settings),
        ]
        for status in saved:
            await store.status.asave_daemon_status(status)
        assert await store.status.alist_daemon_status() == [saved[1], saved[0]]

    async def test_save_upserts(self, store: BaseStateBackend) -> None:
        """Saving a daemon's row again replaces it (a heartbeat)."""
        await store.status.asave_daemon_status(_daemon("d1"))
        later = _daemon("d1", heartbeat_at=T_START + timedelta(minutes=5))
        await store.status.asave_daemon_status(later)
        assert await store.status.alist_daemon_status() == [later]

    async def test_delete(self, store: BaseStateBackend) -> None:
        """Deleting rows removes exactly those owners; unknown owners are ignored."""
        for owner in ("d1", "d2", "d3"):
            await store.status.asave_daemon_status(_daemon(owner))
        await store.status.adelete_daemon_status(["d1", "d3", "never"])
        assert [d.owner for d in await store.status.alist_daemon_status()] == ["d2"]

    @pytest.mark.parametrize(
        ("status", "error"),
        [
            ("d1", TypeError),
            (_daemon(""), ValueError),
            (_daemon("d9", heartbeat_at=datetime(2024, 1, 1)), TypeError),  # naive
            (_daemon("d9", lease_ttl=0.0), ValueError),
            (_daemon("d9", lease_ttl=float("nan")), TypeError),
            (_daemon("d9", refused=("bad.py",)), TypeError),
            (_daemon("d9", settings={"lease_ttl": "3"}), TypeError),
            (_daemon("d9", settings={"lease_ttl": float("inf")}), TypeError),
            (_daemon("d9", settings=[("lease_ttl", 3.0)]), TypeError),
        ],
    )
    async def test_bad_input_is_refused_and_changes_nothing(
        self, store: BaseStateBackend, status: object, error: type[Exception]
    ) -> None:
        """A malformed row is a TypeError/ValueError and nothing is written."""
        await store.status.asave_daemon_status(_daemon("d1"))
        with pytest.raises(error):
            await store.status.asave_daemon_status(status)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await store.status.adelete_daemon_status("d1")  # a str, not a list of owners
        assert [d.owner for d in await store.status.alist_daemon_status()] == ["d1"]
