"""The greenback portal a trigger's sync store calls need: opened only for classes that use it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import greenback
from watchkeeper.store import Asset
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent, TriggerRunner

from tests.support.runtime import FAST, GatedBackend, spec, watch_logs

ALSO_ON_UVLOOP = True  # the runner on asyncio's loop and on uvloop (see tests/conftest.py)
ORDERS = Asset("orders")
USERS = Asset("users")


def _sync_reader_class() -> type[BaseEventTrigger]:
    """A fresh class per test: which classes needed a portal is remembered per process."""

    class SyncFirst(BaseEventTrigger):
        """Reads its watermark with a sync call before anything else, then yields it."""

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return self.classpath(), {}

        async def run(self) -> AsyncIterator[TriggerEvent]:
            value = self.asset_state_store.get("wm", "unset")
            yield TriggerEvent({"read": value, "portal": greenback.has_portal()})
            await anyio.sleep_forever()

    return SyncFirst


class AsyncOnly(BaseEventTrigger):
    """Uses only the async store methods, and reports whether its task has a portal."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        value = await self.asset_state_store.aget("wm", "unset")
        yield TriggerEvent({"read": value, "portal": greenback.has_portal()})
        await anyio.sleep_forever()


class TestLazyPortal:
    async def test_a_trigger_without_sync_calls_gets_no_portal(self) -> None:
        """A trigger that only awaits the store runs without a greenback portal, first run."""
        backend = GatedBackend()  # sync calls would need the portal (no sync hooks)
        await backend.events.aregister_assets([ORDERS])
        async with TriggerRunner(backend, FAST) as runner, runner.subscribe() as events:
            await runner.start_trigger(spec("async", AsyncOnly(), ORDERS))
            with anyio.fail_after(5):
                event = await events.receive()
            [slot] = runner.slots()
            assert (event.payload, slot.runs, slot.failures) == (
                {"read": "unset", "portal": False},
                1,
                0,
            )

    async def test_the_first_sync_call_opens_a_portal_and_restarts_run(self) -> None:
        """A sync call without a portal restarts run() at once with one: no failure, no
        error logged, the event committed once; the next trigger of the class starts with
        its portal (one run)."""
        backend = GatedBackend()
        await backend.events.aregister_assets([ORDERS, USERS])
        await backend.aset(ORDERS.scope, "wm", 7)
        cls = _sync_reader_class()
        with watch_logs() as logs:
            async with TriggerRunner(backend, FAST) as runner, runner.subscribe() as events:
                await runner.start_trigger(spec("first", cls(), ORDERS))
                with anyio.fail_after(5):
                    first = await events.receive()
                await runner.start_trigger(spec("second", cls(), USERS))
                with anyio.fail_after(5):
                    second = await events.receive()
                slots = {slot.trigger_id: slot for slot in runner.slots()}
                runs = {key: (slot.runs, slot.failures) for key, slot in slots.items()}
        assert (first.watcher, first.payload) == ("first", {"read": 7, "portal": True})
        assert (second.watcher, second.payload) == ("second", {"read": "unset", "portal": True})
        assert runs == {"first": (2, 0), "second": (1, 0)}
        assert logs.named("trigger_portal_opened", trigger_id="first")
        assert not logs.named("trigger_portal_opened", trigger_id="second")
        assert not logs.named("trigger_error")


def _careless_class() -> type[BaseEventTrigger]:
    """A fresh class per test (which classes needed a portal is remembered per process)."""

    class CatchesTheError(BaseEventTrigger):
        """Catches the sync call's error and carries on: it must still be restarted."""

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return self.classpath(), {}

        async def run(self) -> AsyncIterator[TriggerEvent]:
            try:
                value = self.asset_state_store.get("wm", "unset")
            except Exception:  # noqa: BLE001 - what a careless trigger does
                value = "swallowed"
            yield TriggerEvent({"read": value, "portal": greenback.has_portal()})
            await anyio.sleep_forever()

    return CatchesTheError


class TestCaughtSyncCallError:
    async def test_a_trigger_that_catches_the_error_is_restarted_with_a_portal(self) -> None:
        """run() swallowing SyncCallInLoopError is stopped at its next await and restarted
        with a portal: its only committed event read the real value, nothing 'swallowed'."""
        backend = GatedBackend()
        await backend.events.aregister_assets([ORDERS])
        await backend.aset(ORDERS.scope, "wm", 3)
        async with TriggerRunner(backend, FAST) as runner, runner.subscribe() as events:
            await runner.start_trigger(spec("careless", _careless_class()(), ORDERS))
            with anyio.fail_after(5):
                event = await events.receive()
            [slot] = runner.slots()
            runs = (slot.runs, slot.failures)
        assert event.payload == {"read": 3, "portal": True}
        assert runs == (2, 0)
        committed = await backend.events.alist_events(asset="orders")
        assert [e.payload for e in committed] == [{"read": 3, "portal": True}]


class TestStartAndStop:
    async def test_a_trigger_stopped_before_its_task_ran_ends_stopped_and_cleaned_up(
        self,
    ) -> None:
        """start_trigger only creates the task: a stop right after it (no turn of the loop
        between) still ends the trigger (state stopped, cleanup awaited), without waiting
        for stop_grace and without run() committing anything."""
        backend = GatedBackend()
        await backend.events.aregister_assets([ORDERS])
        trigger = AsyncOnly()
        cleaned: list[bool] = []

        async def cleanup() -> None:
            cleaned.append(True)

        trigger.cleanup = cleanup  # type: ignore[method-assign]
        with watch_logs() as logs:
            async with TriggerRunner(backend, FAST) as runner:
                await runner.start_trigger(spec("quick", trigger, ORDERS))
                [slot] = runner.slots()
                with anyio.fail_after(5):
                    await runner.stop_trigger("quick")
                assert runner.trigger_ids() == frozenset()
        assert (slot.state, slot.finished) == ("stopped", True)
        assert cleaned in ([], [True])  # cleanup() runs when run() had started
        assert not logs.named("trigger_ignored_cancellation")

    async def test_a_trigger_stopped_while_it_restarts_for_its_portal_is_not_restarted(
        self,
    ) -> None:
        """Leaving the runner while a trigger's task was cancelled for want of a portal ends
        it: no new task is started for it, and its state is stopped."""
        backend = GatedBackend()
        await backend.events.aregister_assets([ORDERS])
        cls = _sync_reader_class()
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("leaving", cls(), ORDERS))
            [slot] = runner.slots()
        assert (slot.state, slot.finished, slot.runs) in (
            ("stopped", True, 0),
            ("stopped", True, 1),
        )
        assert await backend.events.alist_events() == []
