"""``watchkeeper.triggerer.testing.run_trigger``: one trigger, once, through the real runtime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import greenback
import pytest
from watchkeeper.store import Asset, MemoryStateBackend
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer import BaseEventTrigger, InvalidEventError, TriggerEvent
from watchkeeper.triggerer.testing import run_trigger

from tests.support.runtime import Scripted

ORDERS = Asset("orders")
USERS = Asset("users")


class Counted(BaseEventTrigger):
    """Yields ``n`` events with watermarks, noting how far its generator got."""

    def __init__(self, n: int, *, then: str = "return") -> None:
        self.n = n
        self.then = then
        self.resumed_after: list[int] = []
        self.closed = False
        self.cleaned = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"n": self.n}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            for i in range(1, self.n + 1):
                yield TriggerEvent({"i": i}, state={"wm": i}, dedup_key=f"k{i}")
                self.resumed_after.append(i)
            if self.then == "hold":
                await anyio.sleep_forever()
        finally:
            self.closed = True

    async def cleanup(self) -> None:
        self.cleaned = True


class TestResults:
    async def test_returns_committed_events_in_order(self, backend: BaseStateBackend) -> None:
        """The result is this call's asset events in commit order, with payload and dedup_key."""
        events = await run_trigger(Counted(3), assets=[ORDERS], backend=backend)
        assert [(e.asset, e.payload, e.dedup_key) for e in events] == [
            ("orders", {"i": 1}, "k1"),
            ("orders", {"i": 2}, "k2"),
            ("orders", {"i": 3}, "k3"),
        ]
        assert events == await backend.events.alist_events()
        assert await backend.aget(ORDERS.scope, "wm") == 3

    async def test_registers_the_assets(self) -> None:
        """The assets are registered, so a fresh backend needs no preparation."""
        backend = MemoryStateBackend()
        await run_trigger(Counted(1), assets=[ORDERS, USERS], backend=backend)
        assert [a.name for a in await backend.events.alist_assets(active_only=True)] == [
            "orders",
            "users",
        ]

    async def test_only_this_calls_events(self) -> None:
        """Events committed before the call, and suppressed duplicates, are not returned."""
        backend = MemoryStateBackend()
        first = await run_trigger(Counted(2), assets=ORDERS, backend=backend)
        second = await run_trigger(Counted(3), assets=ORDERS, backend=backend)
        assert [e.payload for e in first] == [{"i": 1}, {"i": 2}]
        assert [e.payload for e in second] == [{"i": 3}]  # k1 and k2 were already recorded

    async def test_one_event_per_asset(self) -> None:
        """With two assets each trigger event gives two asset events."""
        events = await run_trigger(Counted(2), assets=[ORDERS, USERS], backend=MemoryStateBackend())
        assert [(e.asset, e.payload["i"]) for e in events] == [
            ("orders", 1),
            ("users", 1),
            ("orders", 2),
            ("users", 2),
        ]

    async def test_trigger_id_names_the_watcher(self) -> None:
        """watcher_name is the watcher on the events; the trigger's class name is the default."""
        backend = MemoryStateBackend()
        named = await run_trigger(Counted(1), assets=ORDERS, backend=backend, watcher_name="mine")
        default = await run_trigger(
            Scripted([TriggerEvent(0)], then="return"), assets=ORDERS, backend=backend
        )
        assert named[0].watcher == "mine"
        assert default[0].watcher == Scripted.__name__

    async def test_a_bad_watcher_name_is_refused(self) -> None:
        """watcher_name must be a non-empty str; anything else is refused before running."""
        trigger = Counted(1)
        with pytest.raises(TypeError, match="watcher_name must be a str"):
            await run_trigger(
                trigger,
                assets=ORDERS,
                backend=MemoryStateBackend(),
                watcher_name=3,  # type: ignore[arg-type]
            )
        with pytest.raises(ValueError, match="watcher_name must not be empty"):
            await run_trigger(trigger, assets=ORDERS, backend=MemoryStateBackend(), watcher_name="")
        assert trigger.resumed_after == [] and not trigger.cleaned


class TestStopping:
    async def test_stops_when_run_returns(self) -> None:
        """A run() that returns ends the call, with no restart, and cleanup awaited."""
        trigger = Counted(2)
        events = await run_trigger(trigger, assets=ORDERS, backend=MemoryStateBackend())
        assert len(events) == 2 and trigger.resumed_after == [1, 2]
        assert trigger.closed and trigger.cleaned

    async def test_stops_after_max_events(self) -> None:
        """max_events ends the call once that many events committed; the generator is closed."""
        trigger = Counted(10)
        events = await run_trigger(
            trigger, assets=ORDERS, backend=MemoryStateBackend(), max_events=3
        )
        assert [e.payload["i"] for e in events] == [1, 2, 3]
        assert trigger.resumed_after == [1, 2]  # closed at its third yield
        assert trigger.closed and trigger.cleaned

    async def test_stops_at_timeout_with_what_was_committed(self) -> None:
        """At the timeout the call returns what was committed by then and cleans up."""
        trigger = Counted(2, then="hold")
        with anyio.fail_after(10):
            events = await run_trigger(
                trigger, assets=ORDERS, backend=MemoryStateBackend(), timeout=0.05
            )
        assert [e.payload["i"] for e in events] == [1, 2]
        assert trigger.closed and trigger.cleaned

    async def test_no_restart(self) -> None:
        """run_trigger runs run() once; it never restarts it."""
        trigger = Scripted([], then="return")
        assert await run_trigger(trigger, assets=ORDERS, backend=MemoryStateBackend()) == []
        assert trigger.runs == 1 and trigger.cleanups == 1


class Broken(BaseEventTrigger):
    """Commits one event, then fails in run() or in cleanup()."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.cleaned = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent("before the bug")
        if self.where == "run":
            raise LookupError("no such partition")

    async def cleanup(self) -> None:
        self.cleaned = True
        if self.where == "cleanup":
            raise ConnectionError("socket already closed")


class TestErrors:
    async def test_exception_in_run_reaches_the_caller(self) -> None:
        """The exception run() raised is raised by run_trigger itself, after cleanup."""
        backend = MemoryStateBackend()
        trigger = Broken("run")
        with pytest.raises(LookupError, match="no such partition"):
            await run_trigger(trigger, assets=ORDERS, backend=backend)
        assert trigger.cleaned
        assert [e.payload for e in await backend.events.alist_events()] == ["before the bug"]

    async def test_exception_in_cleanup_reaches_the_caller(self) -> None:
        """A cleanup() that raises makes run_trigger raise it too, so the test sees the bug."""
        with pytest.raises(ConnectionError, match="socket already closed"):
            await run_trigger(Broken("cleanup"), assets=ORDERS, backend=MemoryStateBackend())

    async def test_invalid_event_reaches_the_caller(self) -> None:
        """Yielding something that is not a TriggerEvent raises InvalidEventError here."""

        class Sloppy(BaseEventTrigger):
            def serialize(self) -> tuple[str, dict[str, Any]]:
                return self.classpath(), {}

            async def run(self) -> AsyncIterator[TriggerEvent]:
                yield {"not": "an event"}  # type: ignore[misc]

        with pytest.raises(InvalidEventError, match="yielded a dict") as info:
            await run_trigger(Sloppy(), assets=ORDERS, backend=MemoryStateBackend())
        assert any("nothing was committed" in note for note in info.value.__notes__)

    async def test_argument_errors(self) -> None:
        """Bad arguments are refused before anything runs."""
        backend = MemoryStateBackend()
        with pytest.raises(TypeError, match="BaseEventTrigger"):
            await run_trigger(object(), assets=ORDERS, backend=backend)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="Asset"):
            await run_trigger(Counted(1), assets=[], backend=backend)
        with pytest.raises(ValueError, match="max_events"):
            await run_trigger(Counted(1), assets=ORDERS, backend=backend, max_events=0)
        with pytest.raises(ValueError, match="timeout"):
            await run_trigger(Counted(1), assets=ORDERS, backend=backend, timeout=0)
        assert await backend.events.alist_assets() == []

    async def test_caller_task_gets_no_portal(self) -> None:
        """The greenback portal lives in run_trigger's own task, not in the caller's."""
        await run_trigger(Counted(1), assets=ORDERS, backend=MemoryStateBackend())
        assert not greenback.has_portal()
