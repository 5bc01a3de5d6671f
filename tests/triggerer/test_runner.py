"""The embeddable runner: commit semantics, supervision, cleanup, capacity, status, logs, lag."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from watchkeeper.store import Asset, AssetEvent, MemoryStateBackend
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, TriggerStatus
from watchkeeper.triggerer import (
    BaseEventTrigger,
    CapacityError,
    RunnerConfig,
    TriggerEvent,
    TriggerRunner,
    WatchSpec,
)
from watchkeeper.triggerer.runtime._supervisor import backoff_delay

from tests.support.runtime import FAST, Scripted, Ticker, fast, spec, watch_logs

ALSO_ON_UVLOOP = True  # the runner on asyncio's loop and on uvloop (see tests/conftest.py)
ORDERS = Asset("orders")
USERS = Asset("users")


async def registered(backend: BaseStateBackend, *assets: Asset) -> BaseStateBackend:
    await backend.events.aregister_assets(list(assets) or [ORDERS, USERS])
    return backend


class HeldCommitBackend(MemoryStateBackend):
    """Holds every commit until ``release`` is set; ``entered`` says a commit is waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def _acommit_event(self, commit: EventCommit) -> list[AssetEvent]:
        self.entered.set()
        await self.release.wait()
        return await super()._acommit_event(commit)


class AfterYield(BaseEventTrigger):
    """Records what is durable when its generator is resumed after the first yield."""

    def __init__(self, backend: BaseStateBackend) -> None:
        self.backend = backend
        self.resumed = anyio.Event()
        self.events_seen: list[AssetEvent] = []
        self.wm_seen: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"n": 1}, state={"wm": 1})
        self.events_seen = await self.backend.events.alist_events()
        self.wm_seen = await self.asset_state_store.aget("wm")
        self.resumed.set()
        await anyio.sleep_forever()


class TestCommit:
    async def test_generator_is_not_resumed_before_the_commit(self) -> None:
        """While the commit of a yielded event is pending, the generator stays suspended."""
        backend = await registered(HeldCommitBackend())
        trigger = AfterYield(backend)
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("w", trigger, ORDERS))
            with anyio.fail_after(5):
                await backend.entered.wait()  # type: ignore[attr-defined]
                await anyio.wait_all_tasks_blocked()
                assert not trigger.resumed.is_set()
                backend.release.set()  # type: ignore[attr-defined]
                await trigger.resumed.wait()

    async def test_event_and_state_are_durable_when_resumed(
        self, backend: BaseStateBackend
    ) -> None:
        """After the yield, the event is in the store and the watermark equals its state."""
        await registered(backend)
        trigger = AfterYield(backend)
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("w", trigger, ORDERS))
            with anyio.fail_after(5):
                await trigger.resumed.wait()
        assert [(e.asset, e.payload, e.watcher) for e in trigger.events_seen] == [
            ("orders", {"n": 1}, "w")
        ]
        assert trigger.wm_seen == 1

    async def test_events_carry_the_asset_watchers_names(self, backend: BaseStateBackend) -> None:
        """A spec naming its AssetWatcher stores that name on its events, not the trigger id."""
        await registered(backend)
        one, two = AfterYield(backend), AfterYield(backend)
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(WatchSpec("3f2a9c", one, (ORDERS,), ("orders_feed",)))
            with anyio.fail_after(5):
                await one.resumed.wait()
            await runner.start_trigger(WatchSpec("77b0e1", two, (ORDERS,), ("a_feed",)))
            with anyio.fail_after(5):
                await two.resumed.wait()
        assert [e.watcher for e in await backend.events.alist_events()] == [
            "orders_feed",
            "a_feed",
        ]

    async def test_each_watermark_is_visible_after_its_yield(
        self, backend: BaseStateBackend
    ) -> None:
        """Every resumption sees the state of the event it just yielded."""
        await registered(backend)
        trigger = Scripted([TriggerEvent(i, state={"wm": i}) for i in range(1, 6)])
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("w", trigger, ORDERS))
            with anyio.fail_after(5):
                await trigger.drained.wait()
        assert trigger.seen_after_yield == [1, 2, 3, 4, 5]
        assert [e.payload for e in await backend.events.alist_events()] == [1, 2, 3, 4, 5]

    async def test_dedup_key_suppresses_the_event_and_its_state(
        self, backend: BaseStateBackend
    ) -> None:
        """A redelivered dedup_key commits no event and does not move the watermark back."""
        await registered(backend)
        trigger = Scripted(
            [
                TriggerEvent("m1", state={"wm": 5}, dedup_key="m1"),
                TriggerEvent("m1 again", state={"wm": 1}, dedup_key="m1"),
                TriggerEvent("m2", state={"wm": 6}, dedup_key="m2"),
            ]
        )
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("w", trigger, ORDERS))
            with anyio.fail_after(5):
                await trigger.drained.wait()
            [status] = runner.statuses()
        assert trigger.seen_after_yield == [5, 5, 6]
        events = await backend.events.alist_events()
        assert [(e.payload, e.dedup_key) for e in events] == [("m1", "m1"), ("m2", "m2")]
        assert status.events == 2

    async def test_one_event_per_watched_asset(self, backend: BaseStateBackend) -> None:
        """A watcher of two assets commits one event and the state on each of them."""
        await registered(backend)
        trigger = Scripted([TriggerEvent("x", state={"wm": 3})])
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("w", trigger, ORDERS, USERS))
            with anyio.fail_after(5):
                await trigger.drained.wait()
        assert sorted(e.asset for e in await backend.events.alist_events()) == ["orders", "users"]
        assert await backend.aget(ORDERS.scope, "wm") == 3
        assert await backend.aget(USERS.scope, "wm") == 3

    async def test_a_trigger_that_never_awaits_does_not_starve_others(self) -> None:
        """On a backend that commits without suspending, a firehose still shares the loop."""
        backend = await registered(MemoryStateBackend())
        firehose, ticker = Firehose(20_000), Ticker()
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("firehose", firehose, ORDERS))
            await runner.start_trigger(spec("ticker", ticker, USERS))
            with anyio.fail_after(20):
                await ticker.reached(20).wait()
            assert firehose.emitted < 20_000

    async def test_many_triggers_commit_everything(self, backend: BaseStateBackend) -> None:
        """Twenty concurrent watchers commit all their events, each in its own order."""
        await registered(backend, *[Asset(f"a{i}") for i in range(20)])
        triggers = [
            Scripted([TriggerEvent(j, state={"wm": j}) for j in range(25)]) for _ in range(20)
        ]
        async with TriggerRunner(backend, FAST) as runner:
            for i, trigger in enumerate(triggers):
                await runner.start_trigger(spec(f"t{i}", trigger, Asset(f"a{i}")))
            with anyio.fail_after(20):
                for trigger in triggers:
                    await trigger.drained.wait()
        events = await backend.events.alist_events()
        assert len(events) == 500
        for i in range(20):
            assert [e.payload for e in events if e.watcher == f"t{i}"] == list(range(25))
            assert await backend.aget(Asset(f"a{i}").scope, "wm") == 24


class Firehose(BaseEventTrigger):
    """Yields events without ever awaiting anything itself."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.emitted = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        for i in range(self.n):
            yield TriggerEvent(i)
            self.emitted += 1
        await anyio.sleep_forever()


class Flaky(BaseEventTrigger):
    """Commits one event per run, then raises: a trigger that keeps making progress."""

    def __init__(self) -> None:
        self.runs = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.runs += 1
        yield TriggerEvent(self.runs)
        raise RuntimeError(f"flaky run {self.runs}")


class TestSupervision:
    async def test_restarted_after_raising(self) -> None:
        """A run that raises is logged and restarted after a backoff; cleanup follows each run."""
        backend = await registered(MemoryStateBackend())
        trigger = Scripted([], then="raise", error=ValueError("bad input"))
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(max_failures=10)) as runner:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                await logs.wait_for("trigger_started", run=3)
        assert trigger.runs >= 3 and trigger.cleanups == trigger.runs
        errors = logs.named("trigger_error", trigger_id="w")
        assert errors[0]["error"] == "ValueError: bad input"
        assert isinstance(errors[0]["exc_info"], ValueError)
        assert len(logs.named("trigger_backoff", trigger_id="w")) >= 2

    async def test_restarted_after_returning(self) -> None:
        """A run that returns is restarted too, and its state shows why."""
        backend = await registered(MemoryStateBackend())
        trigger = Scripted([TriggerEvent(1)], then="return")
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(max_failures=10)) as runner:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                await logs.wait_for("trigger_started", run=2)
                [status] = runner.statuses()
        assert logs.named("trigger_returned", trigger_id="w")
        assert status.last_error == "run() returned"
        assert trigger.runs >= 2

    async def test_failed_after_max_failures(self) -> None:
        """After max_failures consecutive failures the trigger is 'failed' and not restarted."""
        backend = await registered(MemoryStateBackend())
        trigger = Scripted([], then="raise")
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(max_failures=3)) as runner:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                [failed] = await logs.wait_for("trigger_failed", trigger_id="w")
                await anyio.wait_all_tasks_blocked()
                [status] = runner.statuses()
                assert runner.trigger_ids() == {"w"}
        assert failed["error"] == "RuntimeError: scripted failure"
        assert failed["classpath"] == Scripted.classpath()
        assert (status.state, status.failures) == ("failed", 3)
        assert status.last_error == "RuntimeError: scripted failure"
        assert trigger.runs == 3 and trigger.cleanups == 3

    async def test_a_commit_resets_the_failure_count(self) -> None:
        """A trigger that commits before each failure is never marked failed."""
        backend = await registered(MemoryStateBackend())
        trigger = Flaky()
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(max_failures=2)) as runner:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                await logs.wait_for("trigger_started", run=5)
        assert not logs.named("trigger_failed")
        assert len(await backend.events.alist_events()) >= 4

    async def test_backoff_doubles_up_to_the_cap(self) -> None:
        """The restart delays double from backoff_initial and stop growing at backoff_max."""
        backend = await registered(MemoryStateBackend())
        config = fast(backoff_initial=0.001, backoff_max=0.004, max_failures=6)
        with watch_logs() as logs:
            async with TriggerRunner(backend, config) as runner:
                await runner.start_trigger(spec("w", Scripted([], then="raise"), ORDERS))
                await logs.wait_for("trigger_failed")
        delays = [e["delay"] for e in logs.named("trigger_backoff")]
        assert delays == [0.001, 0.002, 0.004, 0.004, 0.004]

    def test_backoff_jitter_stays_within_its_fraction(self) -> None:
        """Jitter varies each delay by at most ±backoff_jitter of it."""
        config = RunnerConfig(backoff_initial=1.0, backoff_max=8.0, backoff_jitter=0.25)
        for failures, base in [(1, 1.0), (2, 2.0), (4, 8.0), (9, 8.0)]:
            samples = {backoff_delay(failures, config) for _ in range(200)}
            assert all(base * 0.75 <= d <= base * 1.25 for d in samples)
            assert len(samples) > 1

    async def test_a_failing_trigger_does_not_disturb_the_others(self) -> None:
        """While one trigger fails for good, another keeps committing."""
        backend = await registered(MemoryStateBackend())
        ticker = Ticker()
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(max_failures=2)) as runner:
                await runner.start_trigger(spec("healthy", ticker, USERS))
                await runner.start_trigger(spec("broken", Scripted([], then="raise"), ORDERS))
                await logs.wait_for("trigger_failed", trigger_id="broken")
                with anyio.fail_after(5):
                    await ticker.reached(ticker.count + 10).wait()
                states = {s.trigger_id: s.state for s in runner.statuses()}
        assert states == {"broken": "failed", "healthy": "running"}

    async def test_an_oversize_payload_fails_only_its_watcher_and_writes_nothing(
        self, backend: BaseStateBackend
    ) -> None:
        """A payload over [events] max_payload_bytes fails its watcher's runs like any bad
        event, naming size and limit, and writes neither event, state nor dedup key; another
        watcher keeps committing."""
        await registered(backend)
        backend.max_payload_bytes = 1000
        bulky = Scripted(
            [TriggerEvent({"blob": "x" * 1000}, state={"wm": 7}, dedup_key="big")], then="hold"
        )
        ticker = Ticker()
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(max_failures=2)) as runner:
                await runner.start_trigger(spec("healthy", ticker, USERS))
                await runner.start_trigger(spec("bulky", bulky, ORDERS))
                await logs.wait_for("trigger_failed", trigger_id="bulky")
                with anyio.fail_after(10):
                    await ticker.reached(ticker.count + 10).wait()
                states = {s.trigger_id: s for s in runner.statuses()}
        failed = states["bulky"]
        assert (failed.state, failed.failures, failed.events) == ("failed", 2, 0)
        assert failed.last_error is not None
        assert failed.last_error.startswith("PayloadTooLargeError: event payload is 1011 bytes")
        assert "over the limit of 1000 bytes ([events] max_payload_bytes)" in failed.last_error
        assert (states["healthy"].state, bulky.runs) == ("running", 2)
        assert await backend.events.alist_events(asset="orders") == []
        assert await backend.aget(ORDERS.scope, "wm") is None
        assert len(await backend.events.alist_events(asset="users")) >= 10
        (event,) = await backend.events.acommit(
            EventCommit("bulky", ("orders",), '{"blob":"x"}', dedup_key="big")
        )
        assert event.dedup_key == "big"  # the key was never recorded

    async def test_a_payload_exactly_at_the_limit_commits(self, backend: BaseStateBackend) -> None:
        """The payload limit is inclusive: JSON text of exactly max_payload_bytes commits."""
        await registered(backend)
        backend.max_payload_bytes = 1011
        trigger = Scripted([TriggerEvent({"blob": "x" * 1000}, state={"wm": 7})])
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("w", trigger, ORDERS))
            with anyio.fail_after(5):
                await trigger.drained.wait()
        assert [e.payload for e in await backend.events.alist_events()] == [{"blob": "x" * 1000}]


class CleanupProbe(BaseEventTrigger):
    """Holds in run(); its cleanup awaits several times, or raises, or hangs."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.started = anyio.Event()
        self.cleaned = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.started.set()
        await anyio.sleep_forever()
        yield TriggerEvent(None)  # pragma: no cover - makes this an async generator

    async def cleanup(self) -> None:
        if self.mode == "hang":
            await anyio.sleep_forever()
        for _ in range(3):  # awaits that a cancelled, unshielded cleanup could not pass
            await anyio.lowlevel.checkpoint()
        if self.mode == "raise":
            raise OSError("connection already closed")
        self.cleaned = True


class TestCleanup:
    async def test_cleanup_completes_when_the_trigger_is_stopped(self) -> None:
        """stop_trigger cancels run() and still awaits a cleanup that awaits."""
        backend = await registered(MemoryStateBackend())
        trigger = CleanupProbe()
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("w", trigger, ORDERS))
            with anyio.fail_after(5):
                await trigger.started.wait()
            await runner.stop_trigger("w")
            assert trigger.cleaned
            assert runner.trigger_ids() == frozenset()

    async def test_cleanup_completes_when_the_runner_is_cancelled(self) -> None:
        """Cancelling the scope around the runner still lets every cleanup finish."""
        backend = await registered(MemoryStateBackend())
        triggers = [CleanupProbe(), CleanupProbe()]
        with anyio.CancelScope() as outer:
            async with TriggerRunner(backend, FAST) as runner:
                await runner.start_trigger(spec("a", triggers[0], ORDERS))
                await runner.start_trigger(spec("b", triggers[1], USERS))
                with anyio.fail_after(5):
                    for trigger in triggers:
                        await trigger.started.wait()
                outer.cancel()
                await anyio.sleep_forever()
        assert outer.cancelled_caught
        assert [t.cleaned for t in triggers] == [True, True]
        assert {s.state for s in runner.statuses()} == {"stopped"}

    async def test_cleanup_that_raises_is_logged(self) -> None:
        """A cleanup that raises is logged as trigger_cleanup_failed and stops nothing else."""
        backend = await registered(MemoryStateBackend())
        trigger = CleanupProbe("raise")
        with watch_logs() as logs:
            async with TriggerRunner(backend, FAST) as runner:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                with anyio.fail_after(5):
                    await trigger.started.wait()
                await runner.stop_trigger("w")
        [entry] = logs.named("trigger_cleanup_failed")
        assert entry["trigger_id"] == "w"
        assert entry["error"] == "OSError: connection already closed"

    async def test_cleanup_that_hangs_is_abandoned_after_its_timeout(self) -> None:
        """A cleanup that never returns is cut off after cleanup_timeout and logged."""
        backend = await registered(MemoryStateBackend())
        trigger = CleanupProbe("hang")
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(cleanup_timeout=0.05)) as runner:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                with anyio.fail_after(5):
                    await trigger.started.wait()
                await runner.stop_trigger("w")
        [entry] = logs.named("trigger_cleanup_failed")
        assert entry["timeout"] == 0.05 and "did not finish" in entry["error"]


class TestLifecycle:
    async def test_capacity(self) -> None:
        """Starting beyond capacity raises CapacityError; stopping one frees a place."""
        backend = await registered(MemoryStateBackend())
        async with TriggerRunner(backend, fast(capacity=2)) as runner:
            await runner.start_trigger(spec("a", Scripted([]), ORDERS))
            await runner.start_trigger(spec("b", Scripted([]), USERS))
            with pytest.raises(CapacityError, match="capacity of 2"):
                await runner.start_trigger(spec("c", Scripted([]), USERS))
            assert runner.trigger_ids() == {"a", "b"}
            await runner.stop_trigger("a")
            await runner.start_trigger(spec("c", Scripted([]), USERS))
            assert runner.trigger_ids() == {"b", "c"}

    async def test_duplicate_trigger_id(self) -> None:
        """A trigger_id already in the runner is a ValueError."""
        backend = await registered(MemoryStateBackend())
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("a", Scripted([]), ORDERS))
            with pytest.raises(ValueError, match="'a' is already"):
                await runner.start_trigger(spec("a", Scripted([]), USERS))

    async def test_same_instance_twice(self) -> None:
        """One trigger instance cannot run under two ids (its bound store would clash)."""
        backend = await registered(MemoryStateBackend())
        trigger = Scripted([])
        async with TriggerRunner(backend, FAST) as runner:
            await runner.start_trigger(spec("a", trigger, ORDERS))
            with pytest.raises(ValueError, match="already runs as 'a'"):
                await runner.start_trigger(spec("b", trigger, USERS))

    async def test_exception_in_the_body_propagates_unchanged(self) -> None:
        """An exception raised inside 'async with runner' is not wrapped in an ExceptionGroup."""
        backend = await registered(MemoryStateBackend())
        trigger = CleanupProbe()
        with pytest.raises(LookupError, match="from the body"):
            async with TriggerRunner(backend, FAST) as runner:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                with anyio.fail_after(5):
                    await trigger.started.wait()
                raise LookupError("from the body")
        assert trigger.cleaned

    async def test_stop_unknown_trigger(self) -> None:
        """stop_trigger with an unknown id raises KeyError naming it."""
        async with TriggerRunner(MemoryStateBackend(), FAST) as runner:
            with pytest.raises(KeyError, match="nope"):
                await runner.stop_trigger("nope")

    async def test_start_outside_the_context(self) -> None:
        """A runner that was not entered (or has exited) refuses to start triggers."""
        runner = TriggerRunner(MemoryStateBackend(), FAST)
        with pytest.raises(RuntimeError, match="async with"):
            await runner.start_trigger(spec("a", Scripted([]), ORDERS))
        async with runner:
            pass
        with pytest.raises(RuntimeError, match="async with"):
            await runner.start_trigger(spec("a", Scripted([]), ORDERS))
        with pytest.raises(RuntimeError, match="only once"):
            async with runner:
                pass

    def test_watch_spec_validation(self) -> None:
        """WatchSpec rejects a non-event trigger, no assets and non-Asset assets."""
        with pytest.raises(TypeError, match="BaseEventTrigger"):
            WatchSpec("a", object(), (ORDERS,))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="watches no asset"):
            WatchSpec("a", Scripted([]), ())
        with pytest.raises(TypeError, match="Asset objects"):
            WatchSpec("a", Scripted([]), ("orders",))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="non-empty"):
            WatchSpec("", Scripted([]), (ORDERS,))

    def test_watch_spec_has_at_most_one_watcher_name(self) -> None:
        """A WatchSpec naming two watchers is refused: a running trigger has one watcher_name."""
        with pytest.raises(ValueError, match=r"names 2 watchers.*one watcher name"):
            WatchSpec("a", Scripted([]), (ORDERS,), ("first", "second"))

    def test_config_validation(self) -> None:
        """RunnerConfig rejects a cap below the first delay and unknown fields."""
        with pytest.raises(ValueError, match="backoff_max"):
            RunnerConfig(backoff_initial=10, backoff_max=1)
        with pytest.raises(ValueError, match="capacty"):
            RunnerConfig(capacty=3)  # type: ignore[call-arg]


class StatusRecordingBackend(MemoryStateBackend):
    """Sets ``saved`` after each status save."""

    def __init__(self) -> None:
        super().__init__()
        self.saves: list[list[TriggerStatus]] = []
        self.saved = anyio.Event()

    async def _asave_trigger_status(self, statuses: list[TriggerStatus]) -> None:
        await super()._asave_trigger_status(statuses)
        self.saves.append(list(statuses))
        self.saved.set()


class NoStatusBackend(MemoryStateBackend):
    """A backend without the trigger-status service."""

    def __init__(self) -> None:
        super().__init__()
        self.services = replace(self.services, status=None)


class TestStatuses:
    async def test_running_status_counts_events(self) -> None:
        """A running trigger's status has its classpath, assets, watchers, events and owner."""
        backend = await registered(MemoryStateBackend())
        trigger = Scripted([TriggerEvent(1), TriggerEvent(2)])
        async with TriggerRunner(backend, fast(owner="daemon-1")) as runner:
            await runner.start_trigger(WatchSpec("w", trigger, (ORDERS, USERS), ("orders_w",)))
            with anyio.fail_after(5):
                await trigger.drained.wait()
            [status] = runner.statuses()
        last = (await backend.events.alist_events())[-1]
        assert status.trigger_id == "w" and status.classpath == Scripted.classpath()
        assert (status.assets, status.watchers) == (("orders", "users"), ("orders_w",))
        assert (status.state, status.events, status.failures) == ("running", 4, 0)
        assert status.last_event_at == last.created_at
        assert status.owner == "daemon-1" and status.updated_at is not None

    async def test_saved_periodically(self) -> None:
        """Statuses are saved to the backend every status_interval."""
        backend = await registered(StatusRecordingBackend())
        async with TriggerRunner(backend, fast(status_interval=0.01, owner="me")) as runner:
            await runner.start_trigger(spec("w", Scripted([]), ORDERS))
            with anyio.fail_after(5):
                await backend.saved.wait()  # type: ignore[attr-defined]
            [saved] = await backend.status.alist_trigger_status()
            assert (saved.trigger_id, saved.owner) == ("w", "me")

    async def test_saved_once_at_exit(self) -> None:
        """At exit the final statuses (stopped, failed) are saved even without a periodic save."""
        backend = await registered(StatusRecordingBackend())
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(status_interval=3600)) as runner:
                await runner.start_trigger(spec("ok", Scripted([]), ORDERS))
                await runner.start_trigger(spec("bad", Scripted([], then="raise"), USERS))
                await logs.wait_for("trigger_failed")
                assert backend.saves == []  # type: ignore[attr-defined]
        saved = {s.trigger_id: s.state for s in await backend.status.alist_trigger_status()}
        assert saved == {"bad": "failed", "ok": "stopped"}

    async def test_stop_trigger_saves_its_last_status(self) -> None:
        """A stopped trigger's final status is saved as it leaves the runner."""
        backend = await registered(StatusRecordingBackend())
        async with TriggerRunner(backend, fast(status_interval=3600)) as runner:
            await runner.start_trigger(spec("w", Scripted([]), ORDERS))
            await runner.stop_trigger("w")
            [saved] = await backend.status.alist_trigger_status()
            assert saved.state == "stopped"

    async def test_periodic_save_writes_only_changed_rows(self) -> None:
        """A periodic save writes the rows that changed, plus the slice due for a refresh."""
        backend = await registered(StatusRecordingBackend())
        rounds = 1000
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(status_interval=3600)) as runner:
                await runner.start_trigger(spec("ok", Scripted([]), ORDERS))
                due = {hash("ok") % rounds, hash("bad") % rounds}
                idle = next(phase for phase in range(rounds) if phase not in due)
                await runner._save_changed_statuses(idle, rounds)
                await runner._save_changed_statuses(idle, rounds)
                await runner.start_trigger(spec("bad", Scripted([], then="raise"), USERS))
                await logs.wait_for("trigger_failed")
                await runner._save_changed_statuses(idle, rounds)
                await runner._save_changed_statuses(hash("ok") % rounds, rounds)
                saves = [[row.trigger_id for row in rows] for rows in backend.saves]  # type: ignore[attr-defined]
        assert saves[:3] == [["ok"], ["bad"], ["ok"]]

    async def test_backend_without_status_support(self) -> None:
        """A backend without trigger status is noted once in the log and otherwise ignored."""
        backend = await registered(NoStatusBackend())
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(status_interval=0.001)) as runner:
                await runner.start_trigger(spec("w", Scripted([]), ORDERS))
                await logs.wait_for("trigger_status_unsupported")
        assert len(logs.named("trigger_status_unsupported")) == 1


class TestLogs:
    async def test_events_carry_the_bound_trigger_id_and_assets(self) -> None:
        """Supervisor logs carry trigger_id and assets bound once per trigger task."""
        backend = await registered(MemoryStateBackend())
        trigger = Scripted([TriggerEvent(1)])
        with watch_logs() as logs:
            async with TriggerRunner(backend, FAST) as runner:
                await runner.start_trigger(WatchSpec("w", trigger, (ORDERS,), ("ow",)))
                with anyio.fail_after(5):
                    await trigger.drained.wait()
        [started] = logs.named("trigger_started")
        assert started["trigger_id"] == "w" and started["assets"] == ["orders"]
        assert started["classpath"] == Scripted.classpath() and started["watchers"] == ["ow"]
        [committed] = logs.named("event_committed")
        assert committed["log_level"] == "debug" and committed["trigger_id"] == "w"


class TestSubscribe:
    async def test_subscriber_sees_commits_in_order(self) -> None:
        """A subscriber receives each committed asset event, in commit order."""
        backend = await registered(MemoryStateBackend())
        trigger = Scripted([TriggerEvent(i) for i in range(5)])
        async with TriggerRunner(backend, FAST) as runner:
            with runner.subscribe() as events:
                await runner.start_trigger(spec("w", trigger, ORDERS))
                with anyio.fail_after(5):
                    got = [await events.receive() for _ in range(5)]
        assert [e.payload for e in got] == [0, 1, 2, 3, 4]
        assert got == await backend.events.alist_events()

    async def test_slow_subscriber_does_not_hold_triggers_back(self) -> None:
        """A subscriber that never reads misses events instead of stalling the triggers."""
        backend = await registered(MemoryStateBackend())
        ticker = Ticker()
        async with TriggerRunner(backend, FAST) as runner:
            with runner.subscribe(max_buffer_size=2) as events:
                await runner.start_trigger(spec("w", ticker, ORDERS))
                with anyio.fail_after(5):
                    await ticker.reached(50).wait()
                assert runner.dropped_events >= 40
                assert [(await events.receive()).payload for _ in range(2)] == [
                    {"tick": 1},
                    {"tick": 2},
                ]

    async def test_stream_ends_when_the_runner_exits(self) -> None:
        """The subscription stream ends (EndOfStream) once the runner has exited."""
        backend = await registered(MemoryStateBackend())
        async with TriggerRunner(backend, FAST) as runner:
            events = runner.subscribe()
        with events, pytest.raises(anyio.EndOfStream):
            await events.receive()


class Blocker(BaseEventTrigger):
    """Blocks the event loop with time.sleep() on purpose, then yields."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"seconds": self.seconds}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await anyio.lowlevel.checkpoint()
        time.sleep(self.seconds)  # noqa: ASYNC251 - the deliberately blocking trigger under test
        yield TriggerEvent("unblocked")
        await anyio.sleep_forever()


class BlockingIterator:
    """An async iterator (not the trigger's own code) that blocks the loop once."""

    def __init__(self) -> None:
        self.calls = 0

    def __aiter__(self) -> BlockingIterator:
        return self

    async def __anext__(self) -> TriggerEvent:
        self.calls += 1
        if self.calls > 1:
            await anyio.sleep_forever()
        time.sleep(0.4)  # noqa: ASYNC251 - the deliberately blocking iterator under test
        return TriggerEvent("unblocked")


class DelegatingBlocker(BaseEventTrigger):
    """run() hands out an iterator object, so no frame of the trigger is on the stack."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    def run(self) -> AsyncIterator[TriggerEvent]:
        return BlockingIterator()


def lag_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "watchkeeper-loop-lag"]


class TestLoopLag:
    async def test_blocked_loop_names_the_trigger(self) -> None:
        """loop_blocked names the trigger whose time.sleep() blocked the loop, and where."""
        backend = await registered(MemoryStateBackend())
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(lag_threshold=0.1)) as runner:
                with runner.subscribe() as events:
                    await runner.start_trigger(spec("sleepy", Blocker(0.4), ORDERS))
                    await runner.start_trigger(spec("calm", Ticker(), USERS))
                    with anyio.fail_after(5):
                        while (await events.receive()).watcher != "sleepy":
                            pass
        blocked = logs.named("loop_blocked", trigger_id="sleepy")
        assert blocked, logs.named("loop_blocked")
        entry = blocked[0]
        assert entry["classpath"] == Blocker.classpath()
        assert entry["blocked_for"] > 0.1 and entry["log_level"] == "warning"
        assert "test_runner.py" in entry["location"] and "in run" in entry["location"]

    async def test_culprit_found_by_task_without_trigger_frames(self) -> None:
        """The trigger is named from the blocked task even when its own code is not on the stack."""
        backend = await registered(MemoryStateBackend())
        with watch_logs() as logs:
            async with TriggerRunner(backend, fast(lag_threshold=0.1)) as runner:
                with runner.subscribe() as events:
                    await runner.start_trigger(spec("delegating", DelegatingBlocker(), ORDERS))
                    with anyio.fail_after(5):
                        await events.receive()
        blocked = logs.named("loop_blocked", trigger_id="delegating")
        assert blocked, logs.named("loop_blocked")
        assert blocked[0]["classpath"] == DelegatingBlocker.classpath()
        assert "in __anext__" in blocked[0]["location"]

    async def test_monitor_thread_stops_with_the_runner(self) -> None:
        """The watchdog thread runs while the runner is open and is joined when it exits."""
        before = len(lag_threads())
        async with TriggerRunner(MemoryStateBackend(), fast(lag_threshold=0.2)) as runner:
            assert runner.lag_monitor is not None
            assert len(lag_threads()) == before + 1
        assert len(lag_threads()) == before

    async def test_no_monitor_when_disabled(self) -> None:
        """lag_threshold=0 starts no watchdog thread."""
        before = len(lag_threads())
        async with TriggerRunner(MemoryStateBackend(), FAST) as runner:
            assert runner.lag_monitor is None
            assert len(lag_threads()) == before


class TestWithSqlite:
    async def test_watermarks_survive_a_restart_of_the_runner(self, tmp_path: Path) -> None:
        """A second runner on the same SQLite file resumes from the committed watermark."""
        from watchkeeper.store import SqliteStateBackend

        path = tmp_path / "state.db"
        for round_ in range(2):
            async with SqliteStateBackend(path) as backend:
                await backend.events.aregister_assets([ORDERS])
                ticker = Ticker()
                async with TriggerRunner(backend, FAST) as runner:
                    await runner.start_trigger(spec("w", ticker, ORDERS))
                    with anyio.fail_after(10):
                        await ticker.reached(20 * (round_ + 1)).wait()
                events = await backend.events.alist_events()
                wm = await backend.aget(ORDERS.scope, "wm")
            ticks = [e.payload["tick"] for e in events]
            assert ticks == list(range(1, len(ticks) + 1))  # nothing lost, nothing twice
            assert wm == ticks[-1]
