"""The trigger-side asset store as the runtime hands it out: ``self.asset_state_store``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from watchkeeper.store import Asset, AssetStateStoreAccessors, MemoryStateBackend
from watchkeeper.store.protocols import BaseStateBackend, Writer
from watchkeeper.triggerer import (
    AssetStoreUnavailableError,
    BaseEventTrigger,
    BaseTrigger,
    TriggerEvent,
    TriggerRunner,
    WatcherNameUnavailableError,
    WatchSpec,
)
from watchkeeper.triggerer.testing import run_trigger

from tests.support.runtime import FAST, GatedBackend, spec

ALSO_ON_UVLOOP = True  # the runner on asyncio's loop and on uvloop (see tests/conftest.py)
ORDERS = Asset("orders", uri="s3://bucket/orders")
USERS = Asset("users")


@pytest.fixture
def store(local_backend: BaseStateBackend) -> BaseStateBackend:
    """An opened memory or SQLite backend."""
    return local_backend


class Probe(BaseEventTrigger):
    """Runs ``body(self)`` inside run() and yields its result as the payload."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.in_init = hasattr(self, "asset_state_store")

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"has_store": hasattr(self, "asset_state_store")}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(self.body(self))


class TestOutsideRun:
    def test_reading_in_init_is_false_for_hasattr(self) -> None:
        """In __init__ the store does not exist yet, so hasattr() is False."""
        assert Probe(lambda t: None).in_init is False

    def test_reading_in_serialize_is_false_for_hasattr(self) -> None:
        """serialize() cannot see the store either."""
        assert Probe(lambda t: None).serialize()[1] == {"has_store": False}

    def test_error_is_runtime_and_attribute_error(self) -> None:
        """Reading it outside run() raises an error that is both RuntimeError and AttributeError."""
        trigger = Probe(lambda t: None)
        with pytest.raises(AssetStoreUnavailableError, match=r"only inside run\(\)") as info:
            _ = trigger.asset_state_store
        assert isinstance(info.value, RuntimeError)
        assert isinstance(info.value, AttributeError)

    def test_alias_raises_the_same(self) -> None:
        """self.asset_store is an alias and fails the same way outside run()."""
        with pytest.raises(AssetStoreUnavailableError):
            _ = Probe(lambda t: None).asset_store

    def test_plain_base_trigger_has_no_attribute(self) -> None:
        """A plain BaseTrigger (not an event trigger) has no asset_state_store at all."""

        class Plain(BaseTrigger):
            def serialize(self) -> tuple[str, dict[str, Any]]:
                return self.classpath(), {}

            async def run(self) -> AsyncIterator[TriggerEvent]:
                yield TriggerEvent(None)

        assert not hasattr(Plain(), "asset_state_store")
        assert not hasattr(Plain(), "asset_store")

    async def test_unbound_again_after_run(self) -> None:
        """Once run() ends the store is unbound again."""
        backend = MemoryStateBackend()
        trigger = Probe(lambda t: 1)
        await run_trigger(trigger, assets=[USERS], backend=backend)
        assert not hasattr(trigger, "asset_state_store")


class TestInsideRun:
    async def test_shorthand_with_one_asset(self, store: BaseStateBackend) -> None:
        """Bound to one asset, get/set work directly on the store, and subscripting works."""

        def body(t: BaseEventTrigger) -> Any:
            t.asset_state_store.set("wm", 41)
            return [t.asset_state_store.get("wm"), t.asset_state_store[ORDERS].get("wm")]

        events = await run_trigger(Probe(body), assets=[ORDERS], backend=store)
        assert events[0].payload == [41, 41]

    async def test_alias_is_the_same_mapping(self, store: BaseStateBackend) -> None:
        """self.asset_store is the very object self.asset_state_store returns."""
        events = await run_trigger(
            Probe(lambda t: t.asset_store is t.asset_state_store), assets=ORDERS, backend=store
        )
        assert events[0].payload is True

    async def test_mapping_with_several_assets(self, store: BaseStateBackend) -> None:
        """With several assets: subscript by Asset, name or URI match; iterate; len; .assets."""

        def body(t: BaseEventTrigger) -> Any:
            s = t.asset_state_store
            s[ORDERS].set("wm", 1)
            s["users"].set("wm", 2)
            return {
                "orders": s[Asset("renamed", uri="s3://bucket/orders")].get("wm"),
                "users": s[USERS].get("wm"),
                "names": [a.name for a in s],
                "len": len(s),
                "assets": [a.name for a in s.assets],
            }

        events = await run_trigger(Probe(body), assets=[ORDERS, USERS], backend=store)
        assert events[0].payload == {
            "orders": 1,
            "users": 2,
            "names": ["orders", "users"],
            "len": 2,
            "assets": ["orders", "users"],
        }

    async def test_shorthand_with_several_assets_raises(self, store: BaseStateBackend) -> None:
        """With several assets the shorthand raises ValueError telling to subscript."""

        def body(t: BaseEventTrigger) -> Any:
            return t.asset_state_store.get("wm")

        with pytest.raises(ValueError, match="subscript"):
            await run_trigger(Probe(body), assets=[ORDERS, USERS], backend=store)

    async def test_undeclared_asset_is_a_key_error(self, store: BaseStateBackend) -> None:
        """Subscripting with an asset the trigger does not watch raises KeyError naming it."""

        def body(t: BaseEventTrigger) -> Any:
            return t.asset_state_store["payments"].get("wm")

        with pytest.raises(KeyError, match="payments"):
            await run_trigger(Probe(body), assets=[ORDERS], backend=store)


class TestWatcherName:
    def test_outside_run_it_raises_and_hasattr_is_false(self) -> None:
        """Outside run() watcher_name raises an error that is a RuntimeError and AttributeError."""
        trigger = Probe(lambda t: None)
        assert not hasattr(trigger, "watcher_name")
        with pytest.raises(WatcherNameUnavailableError, match=r"only inside run\(\)") as info:
            _ = trigger.watcher_name
        assert isinstance(info.value, RuntimeError)
        assert isinstance(info.value, AttributeError)

    async def test_run_trigger_binds_the_given_name_or_the_class_name(self) -> None:
        """run_trigger binds watcher_name= in run() (by default the class name), unbound after."""
        backend = MemoryStateBackend()
        trigger = Probe(lambda t: t.watcher_name)
        named = await run_trigger(trigger, assets=ORDERS, backend=backend, watcher_name="feed")
        default = await run_trigger(Probe(lambda t: t.watcher_name), assets=ORDERS, backend=backend)
        assert (named[0].payload, default[0].payload) == ("feed", "Probe")
        assert not hasattr(trigger, "watcher_name")

    async def test_the_runner_binds_the_spec_watcher_name_or_its_trigger_id(self) -> None:
        """In a runner, watcher_name is the WatchSpec's watcher name, else its trigger_id."""
        backend = MemoryStateBackend()
        await backend.events.aregister_assets([ORDERS, USERS])
        named = WatchSpec("t1", Probe(lambda t: t.watcher_name), (ORDERS,), ("orders_feed",))
        async with TriggerRunner(backend, FAST) as runner, runner.subscribe() as events:
            await runner.start_trigger(named)
            await runner.start_trigger(spec("t2", Probe(lambda t: t.watcher_name), USERS))
            seen: dict[str, Any] = {}
            with anyio.fail_after(5):
                while len(seen) < 2:
                    event = await events.receive()
                    seen[event.watcher] = event.payload
        assert seen == {"orders_feed": "orders_feed", "t2": "t2"}


class TestSharedWithTasks:
    async def test_trigger_writes_are_visible_to_tasks(self, store: BaseStateBackend) -> None:
        """A value a trigger sets is what a task's accessor for the asset reads."""

        def body(t: BaseEventTrigger) -> Any:
            t.asset_state_store.set("cursor", {"offset": 7})
            return None

        await run_trigger(Probe(body), assets=[ORDERS], backend=store)
        task_side = AssetStateStoreAccessors(store, [ORDERS], writer=Writer("task", "t1"))
        assert await task_side.aget("cursor") == {"offset": 7}
        entry = await task_side.aget_entry("cursor")
        assert entry is not None and entry.writer == Writer("watcher", Probe.classpath())

    async def test_task_writes_are_visible_to_triggers(self, store: BaseStateBackend) -> None:
        """A value a task sets is what the trigger reads inside run()."""
        await store.events.aregister_assets([ORDERS])
        task_side = AssetStateStoreAccessors(store, [ORDERS], writer=Writer("task", "t1"))
        await task_side.aset("cursor", "from-task")
        events = await run_trigger(
            Probe(lambda t: t.asset_state_store.get("cursor")), assets=[ORDERS], backend=store
        )
        assert events[0].payload == "from-task"


class SyncReader(BaseEventTrigger):
    """Calls the sync get/set inside run(), then yields what it read."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        value = self.asset_state_store.get("k", "unset")
        self.asset_state_store.set("seen", value)
        yield TriggerEvent({"read": value})
        await anyio.sleep_forever()


class GateOpener(BaseEventTrigger):
    """Commits one event, then opens the gate the other trigger's sync read waits on."""

    def __init__(self, gate: anyio.Event) -> None:
        self.gate = gate

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent("opening")
        self.gate.set()
        await anyio.sleep_forever()


class TestSyncCallsInRun:
    async def test_sync_get_waits_without_blocking_other_triggers(self) -> None:
        """A sync get() in run() that waits on the backend lets another trigger commit meanwhile.

        The reader's sync get() can only finish after the opener committed and opened the
        gate; had the call blocked the loop, the opener could never run.
        """
        backend = GatedBackend()
        backend.gate = anyio.Event()
        await backend.events.aregister_assets([ORDERS, USERS])
        async with TriggerRunner(backend, FAST) as runner, runner.subscribe() as events:
            await runner.start_trigger(spec("reader", SyncReader(), ORDERS))
            await runner.start_trigger(spec("opener", GateOpener(backend.gate), USERS))
            with anyio.fail_after(5):
                first, second = await events.receive(), await events.receive()
        assert (first.watcher, second.watcher) == ("opener", "reader")
        assert second.payload == {"read": "unset"}
        assert await backend.aget(ORDERS.scope, "seen") == "unset"

    async def test_sync_get_and_set_on_a_real_backend(self, store: BaseStateBackend) -> None:
        """Sync get()/set() inside run() reach the backend through the trigger's portal."""
        await store.events.aregister_assets([ORDERS])
        await store.aset(ORDERS.scope, "k", [1, 2])
        events = await run_trigger(SyncReader(), assets=[ORDERS], backend=store, max_events=1)
        assert events[0].payload == {"read": [1, 2]}
        assert await store.aget(ORDERS.scope, "seen") == [1, 2]
