"""The contract of versions, compare-and-set, asset scopes and the sync twins, for every backend.

The second half of ``test_contract.py`` (which has values, keys, retention, delete and clear),
with the same fixtures: each test runs against memory, SQLite and PostgreSQL, and a rejected
call must leave the store exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.to_thread
import pytest
from watchkeeper.store import (
    Asset,
    AssetNotFoundError,
    AssetScope,
    StateScope,
    VersionConflictError,
)
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, Writer

from tests.store._contract import (
    INVOICES_SCOPE,
    ORDERS_SCOPE,
    SCOPES,
    TASK,
    assert_rejected,
)


class TestVersionsAndEntries:
    async def test_version_increases_with_every_write(self, store: BaseStateBackend) -> None:
        """Each write of a key returns its version, one more than the last."""
        for scope in SCOPES:
            versions = [await store.aset(scope, "k", n) for n in range(5)]
            assert versions == [1, 2, 3, 4, 5]
            entry = await store.aget_entry(scope, "k")
            assert entry is not None and entry.version == 5

    async def test_deleted_key_starts_again_at_one(self, store: BaseStateBackend) -> None:
        """A key written after its deletion is new: version 1."""
        for scope in SCOPES:
            await store.aset(scope, "k", 1)
            await store.aset(scope, "k", 2)
            await store.adelete(scope, "k")
            assert await store.aset(scope, "k", 3) == 1

    async def test_entry_carries_its_metadata(self, store: BaseStateBackend) -> None:
        """aget_entry() returns key, value, version, a timezone-aware update time and the writer."""
        writers = [Writer("task", "dag/run_1/task[-1]", 3), Writer("watcher", "orders_watch"), None]
        for scope in SCOPES:
            for number, writer in enumerate(writers):
                await store.aset(scope, f"k{number}", {"v": number}, writer=writer)
                entry = await store.aget_entry(scope, f"k{number}")
                assert entry is not None
                assert (entry.key, entry.value, entry.version, entry.writer) == (
                    f"k{number}",
                    {"v": number},
                    1,
                    writer,
                )
                assert isinstance(entry.updated_at, datetime)
                assert entry.updated_at.tzinfo is not None
            assert await store.aget_entry(scope, "missing") is None

    async def test_update_time_moves_with_every_write(self, store: BaseStateBackend) -> None:
        """Each write, plain, compare-and-set or by an event, stamps the key with the backend's
        clock at that write: a write one microsecond later has an update time one later."""
        t0 = datetime(2031, 5, 1, 9, 30, tzinfo=UTC)
        step = timedelta(microseconds=1)
        for scope in SCOPES:
            stamps = []
            for n in range(3):
                store.clock = lambda n=n: t0 + n * step  # type: ignore[misc]
                if n == 1:
                    await store.aset(scope, "k", n, expected_version=1)
                else:
                    await store.aset(scope, "k", n)
                entry = await store.aget_entry(scope, "k")
                assert entry is not None
                stamps.append(entry.updated_at)
            assert stamps == [t0, t0 + step, t0 + 2 * step]
        store.clock = lambda: t0 + 3 * step
        await store.events.acommit(EventCommit("w", ("orders",), "1", state={"k": "3"}))
        entry = await store.aget_entry(ORDERS_SCOPE, "k")
        assert entry is not None and entry.updated_at == t0 + 3 * step

    async def test_list_carries_versions_and_writers(self, store: BaseStateBackend) -> None:
        """alist() entries carry the same metadata as aget_entry()."""
        writer = Writer("api", "api")
        for scope in SCOPES:
            await store.aset(scope, "a", 1, writer=writer)
            await store.aset(scope, "a", 2, writer=writer)
            await store.aset(scope, "b", 1)
            listed = await store.alist(scope)
            assert listed == [
                await store.aget_entry(scope, "a"),
                await store.aget_entry(scope, "b"),
            ]
            assert [(e.version, e.writer) for e in listed] == [(2, writer), (1, None)]


class TestCompareAndSet:
    async def test_matching_version_writes(self, seeded: BaseStateBackend) -> None:
        """expected_version equal to the current version writes and returns the next one."""
        for scope in SCOPES:
            assert await seeded.aset(scope, "b", "new", expected_version=1) == 2
            assert await seeded.aget(scope, "b") == "new"

    async def test_mismatch_raises_and_changes_nothing(self, seeded: BaseStateBackend) -> None:
        """A stale expected_version raises VersionConflictError naming key, expected and actual."""
        for scope in SCOPES:
            error = await assert_rejected(
                seeded, VersionConflictError, seeded.aset, scope, "b", "new", expected_version=7
            )
            assert isinstance(error, VersionConflictError)
            assert (error.key, error.expected, error.actual) == ("b", 7, 1)
            assert str(error) == "key 'b' is at version 1, expected 7"

    async def test_zero_means_must_not_exist(self, seeded: BaseStateBackend) -> None:
        """expected_version=0 creates a missing key and conflicts with an existing one."""
        for scope in SCOPES:
            assert await seeded.aset(scope, "fresh", 1, expected_version=0) == 1
            error = await assert_rejected(
                seeded, VersionConflictError, seeded.aset, scope, "fresh", 2, expected_version=0
            )
            assert isinstance(error, VersionConflictError) and error.actual == 1

    async def test_version_of_missing_key_is_zero(self, seeded: BaseStateBackend) -> None:
        """Expecting a version of a key that does not exist reports actual version 0."""
        for scope in SCOPES:
            error = await assert_rejected(
                seeded, VersionConflictError, seeded.aset, scope, "nope", 1, expected_version=3
            )
            assert isinstance(error, VersionConflictError) and error.actual == 0
            await seeded.adelete(scope, "b")
            assert await seeded.aset(scope, "b", 1, expected_version=0) == 1

    async def test_invalid_expected_version_is_value_error(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """expected_version that is not an int >= 0 raises ValueError and changes nothing."""
        for scope in SCOPES:
            for expected in (-1, "1", 1.0, True):
                with subtests.test(scope=str(scope), expected=expected):
                    await assert_rejected(
                        seeded,
                        ValueError,
                        seeded.aset,
                        scope,
                        "b",
                        1,
                        expected_version=expected,
                        says=("expected_version",),
                    )

    async def test_concurrent_compare_and_set_has_one_winner(
        self, seeded: BaseStateBackend
    ) -> None:
        """Of ten concurrent writers expecting the same version, exactly one succeeds."""

        async def attempt(scope: StateScope, number: int, outcomes: dict[int, bool]) -> None:
            try:
                await seeded.aset(scope, "b", number, expected_version=1)
            except VersionConflictError:
                outcomes[number] = False
            else:
                outcomes[number] = True

        for scope in SCOPES:
            outcomes: dict[int, bool] = {}
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for number in range(10):
                        tg.start_soon(attempt, scope, number, outcomes)
            winners = [number for number, won in outcomes.items() if won]
            assert len(outcomes) == 10 and len(winners) == 1
            assert await seeded.aget(scope, "b") == winners[0]


class TestAssetScopes:
    async def test_unknown_asset_is_an_error(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """An unregistered asset raises AssetNotFoundError (a KeyError) naming it, never a default."""
        scope = AssetScope(name="typo")
        calls: list[tuple[Any, ...]] = [
            (seeded.aget, scope, "k"),
            (seeded.aget, scope, "k", "default"),
            (seeded.aget_entry, scope, "k"),
            (seeded.aset, scope, "k", 1),
            (seeded.adelete, scope, "k"),
            (seeded.aclear, scope),
            (seeded.alist, scope),
        ]
        for call in calls:
            with subtests.test(method=call[0].__name__, args=call[2:]):
                error = await assert_rejected(seeded, AssetNotFoundError, *call, says=("typo",))
                assert isinstance(error, KeyError)

    async def test_asset_is_reachable_by_uri(self, store: BaseStateBackend) -> None:
        """AssetScope(uri=...) reaches the same state as AssetScope(name=...)."""
        by_uri = AssetScope(uri="s3://data/orders")
        await store.aset(by_uri, "k", "via uri")
        assert await store.aget(ORDERS_SCOPE, "k") == "via uri"
        await store.aset(ORDERS_SCOPE, "k", "via name")
        assert await store.aget(by_uri, "k") == "via name"

    async def test_inactive_asset_is_unreachable(self, seeded: BaseStateBackend) -> None:
        """Once deactivated, an asset's state can no longer be read or written."""
        assert await seeded.events.adeactivate_asset("orders")
        with pytest.raises(AssetNotFoundError, match="orders"):
            await seeded.aget(ORDERS_SCOPE, "a", "default")
        with pytest.raises(AssetNotFoundError, match="orders"):
            await seeded.aset(ORDERS_SCOPE, "a", 2)
        assert await seeded.aget(INVOICES_SCOPE, "a") == {"n": 1}

    async def test_registry_lists_and_deactivates(self, store: BaseStateBackend) -> None:
        """alist_assets() shows registrations; deactivation is reported once, unknown is False."""
        listed = await store.events.alist_assets()
        assert [(a.name, a.uri, a.active) for a in listed] == [
            ("invoices", None, True),
            ("orders", "s3://data/orders", True),
        ]
        assert await store.events.adeactivate_asset("orders") is True
        assert await store.events.adeactivate_asset("orders") is False
        assert await store.events.adeactivate_asset("never-registered") is False
        assert [a.name for a in await store.events.alist_assets(active_only=True)] == ["invoices"]
        assert [a.active for a in await store.events.alist_assets()] == [True, False]

    async def test_reregistration_reactivates_and_updates_uri(
        self, store: BaseStateBackend
    ) -> None:
        """Registering an asset again marks it active and stores its new URI."""
        await store.events.adeactivate_asset("orders")
        await store.events.aregister_assets([Asset("orders", uri="s3://moved/orders")])
        (orders,) = [a for a in await store.events.alist_assets() if a.name == "orders"]
        assert (orders.uri, orders.active) == ("s3://moved/orders", True)
        await store.aset(AssetScope(uri="s3://moved/orders"), "k", 1)
        assert await store.aget(ORDERS_SCOPE, "k") == 1


def _exercise_sync(store: BaseStateBackend, scope: StateScope) -> None:
    assert store.set(scope, "a", {"n": 1}) == 1
    assert store.put_json(scope, "b", "[1,2]") == 1
    assert store.set(scope, "a", {"n": 2}, expected_version=1) == 2
    assert store.get(scope, "a") == {"n": 2}
    assert store.get(scope, "missing", "d") == "d"
    raw = store.get_raw(scope, "b")
    assert raw is not None and raw.value_json == "[1,2]"
    entry = store.get_entry(scope, "a")
    assert entry is not None and entry.version == 2
    assert [e.key for e in store.list(scope)] == ["a", "b"]
    store.delete(scope, "a")
    store.delete(scope, "a")
    assert store.get(scope, "a") is None
    assert store.clear(scope) == 1


SYNC_REJECTIONS: list[tuple[Callable[[BaseStateBackend], object], type[Exception]]] = [
    (lambda s: s.set(TASK, "a", None), ValueError),
    (lambda s: s.set(TASK, "a", {1, 2}), TypeError),
    (lambda s: s.set(TASK, "a", 1, retention=7), TypeError),
    (lambda s: s.set(TASK, "", 1), ValueError),
    (lambda s: s.get(TASK, 5), TypeError),  # type: ignore[arg-type]
    (lambda s: s.delete(TASK, "k" * 513), ValueError),
    (lambda s: s.set(TASK, "a", 1, expected_version=9), VersionConflictError),
    (lambda s: s.set(TASK, "a", 1, expected_version=-1), ValueError),
    (lambda s: s.put_json(TASK, "a", "1", expected_version=9), VersionConflictError),
    (lambda s: s.get(AssetScope(name="typo"), "a"), AssetNotFoundError),
    (lambda s: s.clear(AssetScope(name="typo")), AssetNotFoundError),
]


class TestSyncTwins:
    async def test_sync_methods_from_a_worker_thread(self, store: BaseStateBackend) -> None:
        """Every sync twin works from a worker thread and agrees with its async original."""
        for scope in SCOPES:
            with anyio.fail_after(30):
                await anyio.to_thread.run_sync(_exercise_sync, store, scope)
            assert await store.alist(scope) == []

    async def test_sync_writes_are_visible_to_async_reads(self, store: BaseStateBackend) -> None:
        """A value set from a thread is read back by aget(), and the reverse."""
        await anyio.to_thread.run_sync(lambda: store.set(TASK, "k", [1, "two"]))
        assert await store.aget(TASK, "k") == [1, "two"]
        await store.aset(ORDERS_SCOPE, "w", "2024-06-01")
        assert await anyio.to_thread.run_sync(lambda: store.get(ORDERS_SCOPE, "w")) == "2024-06-01"

    async def test_sync_twins_reject_like_async_ones(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """A sync call from a thread raises the same error as its twin and changes nothing."""
        for number, (call, error) in enumerate(SYNC_REJECTIONS):
            with subtests.test(case=number, error=error.__name__):
                await assert_rejected(seeded, error, anyio.to_thread.run_sync, call, seeded)

    async def test_run_sync_reaches_metastore_methods(self, seeded: BaseStateBackend) -> None:
        """run_sync() calls an async-only metastore method from a thread, with keywords."""

        def work() -> tuple[list[str], int]:
            assets = seeded.run_sync(seeded.events.alist_assets, active_only=True)
            report = seeded.run_sync(seeded.gc.acollect_garbage, dry_run=True)
            return [a.name for a in assets], report.total

        assert await anyio.to_thread.run_sync(work) == (["invoices", "orders"], 0)
