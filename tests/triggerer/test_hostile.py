"""Hostile watchers: each one gets a clear logged error and degrades only itself.

Every test runs the hostile watcher beside a healthy one and checks that the healthy one keeps
committing, that its committed events are all there (contiguous ticks, watermark on the last
one), and that the hostile one wrote nothing it should not have.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from watchkeeper.store import Asset, MemoryStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend, TriggerStatus
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent, TriggerRunner, WatchSpec

from tests.support.runtime import LogWatch, Ticker, fast, spec, watch_logs

HOSTILE = Asset("hostile")
HEALTHY = Asset("healthy")


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseStateBackend]:
    """A memory or SQLite backend with a 1 KiB value limit and both assets registered."""
    backend: BaseStateBackend = (
        MemoryStateBackend(max_value_bytes=1024)
        if request.param == "memory"
        else SqliteStateBackend(tmp_path / "state.db", max_value_bytes=1024)
    )
    async with backend:
        await backend.events.aregister_assets([HOSTILE, HEALTHY])
        yield backend


async def assert_healthy_lost_nothing(backend: BaseStateBackend, ticker: Ticker) -> None:
    events = await backend.events.alist_events(asset="healthy")
    ticks = [e.payload["tick"] for e in events]
    assert ticks == list(range(1, len(ticks) + 1))
    assert len(ticks) >= ticker.count
    assert await backend.aget(HEALTHY.scope, "wm") == ticks[-1]


async def assert_hostile_wrote_nothing(backend: BaseStateBackend) -> None:
    assert await backend.events.alist_events(asset="hostile") == []
    assert await backend.alist(HOSTILE.scope) == []


async def fail_beside_healthy(
    backend: BaseStateBackend, hostile: BaseEventTrigger
) -> tuple[LogWatch, dict[str, TriggerStatus], Ticker]:
    """Run ``hostile`` until it is failed, and check the healthy watcher keeps going."""
    ticker = Ticker()
    with watch_logs() as logs:
        async with TriggerRunner(backend, fast(max_failures=2)) as runner:
            await runner.start_trigger(spec("healthy", ticker, HEALTHY))
            await runner.start_trigger(spec("hostile", hostile, HOSTILE))
            await logs.wait_for("trigger_failed", trigger_id="hostile")
            with anyio.fail_after(5):
                await ticker.reached(ticker.count + 20).wait()
            statuses = {s.trigger_id: s for s in runner.statuses()}
    assert statuses["healthy"].state == "running"
    assert statuses["hostile"].state == "failed"
    await assert_healthy_lost_nothing(backend, ticker)
    return logs, statuses, ticker


class YieldsOnce(BaseEventTrigger):
    """Yields the given object as is."""

    def __init__(self, item: object) -> None:
        self.item = item

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield self.item  # type: ignore[misc]
        await anyio.sleep_forever()


BAD_EVENTS = [
    pytest.param({"payload": 1}, "InvalidEventError", "yielded a dict", id="not-an-event"),
    pytest.param(TriggerEvent({1, 2}), "ValueTypeError", "value at payload is a set", id="set"),
    pytest.param(
        TriggerEvent({"at": datetime(2024, 1, 1)}),
        "ValueTypeError",
        "is a datetime, which is not JSON",
        id="datetime",
    ),
    pytest.param(
        TriggerEvent({"x": math.nan}), "InvalidValueError", "nan, which JSON", id="nan-payload"
    ),
    pytest.param(
        TriggerEvent("ok", state={"wm": [1.0, math.inf]}),
        "InvalidValueError",
        "inf, which JSON",
        id="inf-state",
    ),
    pytest.param(
        TriggerEvent("ok", state={"blob": "x" * 5000}),
        "ValueTooLargeError",
        "5002 bytes encoded, over the limit of 1024",
        id="too-large",
    ),
    pytest.param(
        TriggerEvent("ok", state={"": 1}), "InvalidKeyError", "must not be empty", id="empty-key"
    ),
    pytest.param(
        TriggerEvent("ok", state={7: 1}),  # type: ignore[dict-item]
        "KeyTypeError",
        "key must be a str",
        id="int-key",
    ),
    pytest.param(
        TriggerEvent("ok", state=[("wm", 1)]),  # type: ignore[arg-type]
        "InvalidEventError",
        "state is a list",
        id="state-list",
    ),
    pytest.param(
        TriggerEvent("ok", dedup_key=12),  # type: ignore[arg-type]
        "InvalidEventError",
        "dedup_key is 12",
        id="dedup-int",
    ),
]


class TestBadEvents:
    @pytest.mark.parametrize(("item", "error_type", "fragment"), BAD_EVENTS)
    async def test_bad_event_fails_only_its_watcher(
        self, store: BaseStateBackend, item: object, error_type: str, fragment: str
    ) -> None:
        """A watcher yielding an unstorable event is failed with a clear error; nothing leaks."""
        logs, statuses, _ = await fail_beside_healthy(store, YieldsOnce(item))
        [failed] = logs.named("trigger_failed", trigger_id="hostile")
        assert failed["error"].startswith(f"{error_type}: ")
        assert fragment in failed["error"]
        assert statuses["hostile"].last_error == failed["error"]
        [first, *_] = logs.named("trigger_error", trigger_id="hostile")
        assert first["log_level"] == "error" and first["exc_info"] is not None
        await assert_hostile_wrote_nothing(store)


class GoodThenBad(BaseEventTrigger):
    """Commits a good event (deduplicated across restarts), then yields a too-large one."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent("good", state={"wm": 1}, dedup_key="good-1")
        yield TriggerEvent("bad", state={"wm": 2, "blob": "y" * 4096})


class NotAGenerator(BaseEventTrigger):
    """run() is a coroutine ('async def' without yield), not an async generator."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> None:  # type: ignore[override]
        return None


class RaisesOnCall(BaseEventTrigger):
    """run() is a plain method that raises before any generator exists."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    def run(self) -> AsyncIterator[TriggerEvent]:
        raise KeyError("missing config")


class TestBrokenRuns:
    async def test_state_of_a_rejected_event_is_not_written(self, store: BaseStateBackend) -> None:
        """After a good event, a rejected one leaves the watermark and events as they were.

        Re-delivering the good event on each restart is suppressed by its dedup_key and is not
        progress, so the watcher still ends up failed.
        """
        logs, _, _ = await fail_beside_healthy(store, GoodThenBad())
        events = await store.events.alist_events(asset="hostile")
        assert [e.payload for e in events] == ["good"]
        assert await store.aget(HOSTILE.scope, "wm") == 1
        assert await store.aget(HOSTILE.scope, "blob") is None
        assert "ValueTooLargeError" in logs.named("trigger_failed")[0]["error"]

    async def test_run_that_is_not_a_generator(self, store: BaseStateBackend) -> None:
        """An 'async def run' without yield is refused clearly (and its coroutine is closed)."""
        logs, _, _ = await fail_beside_healthy(store, NotAGenerator())
        [failed] = logs.named("trigger_failed")
        assert failed["error"].startswith("InvalidEventError")
        assert "must be an async generator" in failed["error"]

    async def test_run_that_raises_when_called(self, store: BaseStateBackend) -> None:
        """A run() that raises before returning a generator is an ordinary trigger failure."""
        logs, _, _ = await fail_beside_healthy(store, RaisesOnCall())
        assert logs.named("trigger_failed")[0]["error"] == "KeyError: 'missing config'"
        await assert_hostile_wrote_nothing(store)


class Blocker(BaseEventTrigger):
    """Blocks the loop with time.sleep() on purpose once, then behaves."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent("before")
        time.sleep(0.4)  # noqa: ASYNC251 - the deliberately blocking trigger under test
        yield TriggerEvent("after")
        await anyio.sleep_forever()


class Stubborn(BaseEventTrigger):
    """Catches cancellation and keeps awaiting, until the runner has logged that it did."""

    def __init__(self, logs: LogWatch) -> None:
        self.logs = logs
        self.alive = anyio.Event()
        self.ignored = 0
        self.cancelled_again = False
        self.cleaned = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent("alive")
        self.alive.set()
        while not self.logs.named("trigger_ignored_cancellation"):
            try:
                await anyio.sleep(0.01)
            except anyio.get_cancelled_exc_class():
                self.ignored += 1
        try:
            await anyio.sleep(3600)  # anyio delivers the cancellation again right here
        except anyio.get_cancelled_exc_class():
            self.cancelled_again = True
            raise

    async def cleanup(self) -> None:
        self.cleaned = True


class TestHostileToTheLoop:
    async def test_blocking_watcher_is_named_and_others_carry_on(
        self, store: BaseStateBackend
    ) -> None:
        """A watcher blocking the loop is named in loop_blocked; nobody loses an event."""
        ticker = Ticker()
        with watch_logs() as logs:
            async with TriggerRunner(store, fast(lag_threshold=0.1)) as runner:
                with runner.subscribe() as events:
                    await runner.start_trigger(spec("healthy", ticker, HEALTHY))
                    await runner.start_trigger(spec("hostile", Blocker(), HOSTILE))
                    with anyio.fail_after(10):
                        while (await events.receive()).payload != "after":
                            pass
                        await ticker.reached(ticker.count + 20).wait()
                states = {s.trigger_id: s.state for s in runner.statuses()}
        blocked = logs.named("loop_blocked", trigger_id="hostile")  # a busy machine may add more
        assert blocked and blocked[0]["classpath"] == Blocker.classpath()
        assert states == {"healthy": "running", "hostile": "running"}
        assert [e.payload for e in await store.events.alist_events(asset="hostile")] == [
            "before",
            "after",
        ]
        await assert_healthy_lost_nothing(store, ticker)

    async def test_watcher_ignoring_cancellation_on_exit(self, store: BaseStateBackend) -> None:
        """Leaving the runner names a watcher that swallows cancellation, and still finishes.

        anyio cancels it again at its next await after each swallowed cancellation; once it
        lets one through, cleanup runs and the runner exits.
        """
        ticker = Ticker()
        with watch_logs() as logs:
            stubborn = Stubborn(logs)
            with anyio.fail_after(10):
                async with TriggerRunner(store, fast(stop_grace=0.1)) as runner:
                    await runner.start_trigger(spec("healthy", ticker, HEALTHY))
                    await runner.start_trigger(spec("hostile", stubborn, HOSTILE))
                    await stubborn.alive.wait()
                    await ticker.reached(ticker.count + 20).wait()
        [entry] = logs.named("trigger_ignored_cancellation")
        assert (entry["trigger_id"], entry["classpath"]) == ("hostile", Stubborn.classpath())
        assert entry["log_level"] == "error" and entry["stop_grace"] == 0.1
        assert stubborn.ignored >= 1 and stubborn.cancelled_again and stubborn.cleaned
        assert {s.state for s in runner.statuses()} == {"stopped"}
        await assert_healthy_lost_nothing(store, ticker)

    async def test_stop_trigger_on_a_watcher_ignoring_cancellation(
        self, store: BaseStateBackend
    ) -> None:
        """stop_trigger returns after stop_grace, naming the watcher, while others carry on."""
        ticker = Ticker()
        with watch_logs() as logs:
            stubborn = Stubborn(logs)
            async with TriggerRunner(store, fast(stop_grace=0.05)) as runner:
                await runner.start_trigger(spec("healthy", ticker, HEALTHY))
                await runner.start_trigger(WatchSpec("hostile", stubborn, (HOSTILE,)))
                with anyio.fail_after(10):
                    await stubborn.alive.wait()
                    await runner.stop_trigger("hostile")
                    assert runner.trigger_ids() == {"healthy"}
                    await ticker.reached(ticker.count + 20).wait()
        assert logs.named("trigger_ignored_cancellation", trigger_id="hostile")
        assert stubborn.cancelled_again and stubborn.cleaned
        await assert_healthy_lost_nothing(store, ticker)
