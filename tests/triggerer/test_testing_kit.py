"""The test kit itself: the harness and its crash points, the plugin fixtures, the README example.

FakeEventSource has its own module, test_testing_sources.py.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from watchkeeper.store import Asset, BaseStateBackend, MemoryStateBackend
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent, TriggerImportError
from watchkeeper.triggerer.testing import (
    CrashNotReachedError,
    CrashPoint,
    FakeEventSource,
    SimulatedCrash,
    WatcherHarness,
)
from watchkeeper.triggerer.testing import plugin as wk_plugin

# -- watchers the harness tests run (module level, so serialize() can rebuild them) --------------


class ScriptedWatcher(BaseEventTrigger):
    """Yields ``payloads`` (with ``state={"watermark": n}``), then returns, hangs or raises."""

    def __init__(self, payloads: list[int], then: str = "return") -> None:
        super().__init__()
        self.payloads = payloads
        self.then = then

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"payloads": self.payloads, "then": self.then}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            for n in self.payloads:
                yield TriggerEvent(n, state={"watermark": n})
            if self.then == "hang":
                await anyio.sleep_forever()
            if self.then.startswith("raise:"):
                raise RuntimeError(self.then.removeprefix("raise:"))
        finally:
            # A write on the way out: it lands after a normal stop, never after a crash.
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(SimulatedCrash):
                    await self.asset_state_store.aset("closed", True)


class NamedWatcher(BaseEventTrigger):
    """Yields one counter per run, kept under its watcher name's key."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        key = f"{self.watcher_name}.count"
        count = await self.asset_state_store.aget(key, 0) + 1
        yield TriggerEvent({"name": self.watcher_name, "count": count}, state={key: count})


class PollWatcher(BaseEventTrigger):
    """Polls a feed; ``pattern`` says how it keeps its watermark.

    ``state``: ``TriggerEvent(state=...)`` (atomic); ``aset_first``: the Airflow-style
    ``aset`` then a plain ``yield``; ``yield_first``: a plain ``yield`` then ``aset``.
    """

    def __init__(self, feed: str, pattern: str = "state") -> None:
        super().__init__()
        self.feed = feed
        self.pattern = pattern

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"feed": self.feed, "pattern": self.pattern}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = self.asset_state_store
        watermark: int = await store.aget("watermark", 0)
        async with FakeEventSource.connect(self.feed) as feed:
            while True:
                items = await feed.poll(after=watermark)
                for item in items:
                    if self.pattern == "state":
                        yield TriggerEvent(item.seq, state={"watermark": item.seq})
                    elif self.pattern == "aset_first":
                        await store.aset("watermark", item.seq)
                        yield TriggerEvent(item.seq)
                    else:
                        yield TriggerEvent(item.seq)
                        await store.aset("watermark", item.seq)
                    watermark = item.seq
                if not items:
                    await anyio.sleep(0.005)


class QueueWatcher(BaseEventTrigger):
    """Listens to a feed, yields each message (with a ``dedup_key`` or not), acks it after."""

    def __init__(self, feed: str, dedup: bool = True) -> None:
        super().__init__()
        self.feed = feed
        self.dedup = dedup

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"feed": self.feed, "dedup": self.dedup}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async with FakeEventSource.connect(self.feed) as feed:
            async for message in feed.listen():
                key = f"msg-{message.seq}" if self.dedup else None
                yield TriggerEvent(message.seq, dedup_key=key)
                await feed.ack(message)  # runs only once the event is durable


ORDERS = Asset("orders")


class TestWatcherHarnessRuns:
    async def test_run_stops_at_max_events(self, wk_harness: WatcherHarness) -> None:
        """run(max_events=) stops after that many commits and reports events and watermark."""
        result = await wk_harness.run(
            ScriptedWatcher([1, 2, 3, 4], then="hang"), assets=ORDERS, max_events=2
        )
        assert (result.payloads, result.watermark, result.stopped) == ([1, 2], 2, "max_events")
        assert result.state == {"orders": {"watermark": 2, "closed": True}}

    async def test_run_stops_when_idle_or_returned_or_timed_out(
        self, wk_harness: WatcherHarness
    ) -> None:
        """Quiet after a commit stops as idle, a return as returned; never committing, timeout."""
        idle = await wk_harness.run(ScriptedWatcher([1], then="hang"), assets=ORDERS, idle=0.05)
        returned = await wk_harness.run(ScriptedWatcher([2, 3]), assets=ORDERS)
        timed_out = await wk_harness.run(
            ScriptedWatcher([], then="hang"), assets=ORDERS, idle=0.01, timeout=0.1
        )
        assert [(r.payloads, r.stopped) for r in (idle, returned, timed_out)] == [
            ([1], "idle"),
            ([2, 3], "returned"),
            ([], "timeout"),
        ]
        assert timed_out.all_payloads == [1, 2, 3]
        assert len(wk_harness.runs) == 3

    async def test_restart_runs_a_new_instance_from_serialize(
        self, wk_harness: WatcherHarness
    ) -> None:
        """restart() rebuilds the trigger from serialize() and runs that new instance."""
        original = ScriptedWatcher([5])
        result = await wk_harness.restart(original, assets=ORDERS)
        assert result.trigger is not original
        assert isinstance(result.trigger, ScriptedWatcher)
        assert result.trigger.serialize() == original.serialize()
        assert result.payloads == [5]

    async def test_watcher_name_is_bound_in_runs_and_restarts(
        self, wk_harness: WatcherHarness
    ) -> None:
        """run() and restart() bind watcher_name= (default: the class name) inside run()."""
        watcher = NamedWatcher()
        first = await wk_harness.run(watcher, assets=ORDERS, watcher_name="a")
        again = await wk_harness.restart(watcher, assets=ORDERS, watcher_name="a")
        other = await wk_harness.restart(watcher, assets=ORDERS)
        assert [r.payloads for r in (first, again, other)] == [
            [{"name": "a", "count": 1}],
            [{"name": "a", "count": 2}],
            [{"name": "NamedWatcher", "count": 1}],
        ]
        assert other.state == {"orders": {"a.count": 2, "NamedWatcher.count": 1}}

    async def test_a_trigger_error_is_raised(self, wk_harness: WatcherHarness) -> None:
        """An exception from run() reaches the test, after the events before it committed."""
        with pytest.raises(RuntimeError, match="boom"):
            await wk_harness.run(ScriptedWatcher([1], then="raise:boom"), assets=ORDERS)
        result = await wk_harness.run(ScriptedWatcher([]), assets=ORDERS)
        assert result.all_payloads == [1]

    async def test_bad_arguments_are_rejected(self, wk_harness: WatcherHarness) -> None:
        """A bad crash point, event number, idle, asset or trigger is an error naming it."""
        watcher = ScriptedWatcher([1])
        with pytest.raises(ValueError, match="unknown crash point 'nowhere'"):
            await wk_harness.crash(watcher, assets=ORDERS, at="nowhere")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="crash event"):
            await wk_harness.crash(watcher, assets=ORDERS, at="after_commit", event=0)
        with pytest.raises(ValueError, match="idle"):
            await wk_harness.run(watcher, assets=ORDERS, idle=-1)
        with pytest.raises(TypeError, match="assets"):
            await wk_harness.run(watcher, assets=[])
        with pytest.raises(TypeError, match="BaseStateBackend"):
            WatcherHarness("state.db")  # type: ignore[arg-type]
        assert wk_harness.runs == []

    async def test_rebuild_needs_an_importable_class_and_json_kwargs(self) -> None:
        """A class defined in a function, or kwargs that are not JSON, cannot be rebuilt."""

        class Local(ScriptedWatcher):
            pass

        with pytest.raises(TriggerImportError, match="Local"):
            WatcherHarness.rebuild(Local([1]))
        with pytest.raises(TypeError):
            WatcherHarness.rebuild(ScriptedWatcher([{1, 2}]))  # type: ignore[list-item]


# After a crash at the given point of event 3 and a restart that runs until the feed (1..5) is
# done: the committed payloads, and the watermark. A run stopped by max_events closes the
# generator at its last yield, so "yield then aset" leaves its watermark one item behind.
CRASH_OUTCOMES: list[tuple[str, CrashPoint, list[int], int]] = [
    ("state", "before_commit", [1, 2, 3, 4, 5], 5),
    ("state", "after_commit", [1, 2, 3, 4, 5], 5),
    ("state", "between_items", [1, 2, 3, 4, 5], 5),
    ("aset_first", "before_commit", [1, 2, 4, 5], 5),  # 3 lost: its watermark landed first
    ("aset_first", "after_commit", [1, 2, 3, 4, 5], 5),
    ("aset_first", "between_items", [1, 2, 3, 5], 5),  # 4 lost: aset(4) landed, then the crash
    ("yield_first", "before_commit", [1, 2, 3, 4, 5], 4),
    ("yield_first", "after_commit", [1, 2, 3, 3, 4, 5], 4),  # 3 twice: its aset never ran
    ("yield_first", "between_items", [1, 2, 3, 4, 5], 4),
]


@pytest.mark.parametrize("wk_backend", ["memory", "sqlite"], indirect=True)
class TestWatcherHarnessCrashes:
    @pytest.mark.parametrize(("pattern", "point", "expected", "watermark"), CRASH_OUTCOMES)
    async def test_what_each_watermark_pattern_does_at_each_crash_point(
        self,
        wk_harness: WatcherHarness,
        wk_source: FakeEventSource,
        pattern: str,
        point: CrashPoint,
        expected: list[int],
        watermark: int,
    ) -> None:
        """Only state= survives every crash point; the Airflow-style patterns lose or repeat."""
        await wk_source.publish(*range(1, 6))
        watcher = PollWatcher(wk_source.address, pattern)
        crashed = await wk_harness.crash(watcher, assets=ORDERS, at=point, event=3)
        assert crashed.stopped == "crashed"
        assert crashed.crash is not None and crashed.crash.point == point
        rest = len(expected) - len(crashed.all_events)
        after = await wk_harness.restart(watcher, assets=ORDERS, max_events=rest)
        assert after.all_payloads == expected
        assert after.watermark == watermark

    async def test_nothing_the_dying_run_does_reaches_the_store(
        self, wk_harness: WatcherHarness
    ) -> None:
        """The write in the trigger's finally block lands after a stop but not after a crash."""
        crashed = await wk_harness.crash(
            ScriptedWatcher([1, 2, 3]), assets=ORDERS, at="after_commit", event=2
        )
        assert crashed.state == {"orders": {"watermark": 2}}
        assert crashed.payloads == [1, 2]

    @pytest.mark.parametrize(
        ("dedup", "expected"), [(True, [1, 2, 3, 4]), (False, [1, 2, 2, 3, 4])]
    )
    async def test_a_redelivering_queue_needs_a_dedup_key(
        self,
        wk_harness: WatcherHarness,
        wk_source: FakeEventSource,
        dedup: bool,
        expected: list[int],
    ) -> None:
        """Killed before its ack, message 2 comes back; only a dedup_key keeps it single."""
        await wk_source.publish(1, 2, 3, 4)
        watcher = QueueWatcher(wk_source.address, dedup=dedup)
        crashed = await wk_harness.crash(
            watcher, assets=ORDERS, at="after_commit", event=2, sources=[wk_source]
        )
        assert await wk_source.acked() == [1]
        rest = len(expected) - len(crashed.all_events)
        after = await wk_harness.restart(watcher, assets=ORDERS, max_events=rest)
        assert after.all_payloads == expected
        assert await wk_source.unacked() == [4]  # stopped at its yield: it will come again

    async def test_a_crash_point_never_reached_is_an_error(
        self, wk_harness: WatcherHarness
    ) -> None:
        """crash() raises CrashNotReachedError when the run ends before its crash point."""
        with pytest.raises(CrashNotReachedError, match="after 2 event"):
            await wk_harness.crash(
                ScriptedWatcher([1, 2]), assets=ORDERS, at="before_commit", event=3
            )


class TestPluginFixtures:
    async def test_default_fixtures_are_in_memory(
        self, wk_backend: BaseStateBackend, wk_source: FakeEventSource, wk_harness: WatcherHarness
    ) -> None:
        """By default wk_backend is an open MemoryStateBackend, wk_source an in-memory source."""
        assert isinstance(wk_backend, MemoryStateBackend) and wk_backend.is_open
        assert wk_source.address.startswith("memory://")
        assert wk_harness.backend is wk_backend

    @pytest.mark.parametrize("wk_backend", ["sqlite"], indirect=True)
    @pytest.mark.parametrize("wk_source", ["sqlite"], indirect=True)
    async def test_sqlite_fixtures_live_under_tmp_path(
        self, wk_backend: BaseStateBackend, wk_source: FakeEventSource, tmp_path: Path
    ) -> None:
        """Parametrized with "sqlite", both fixtures are files under the test's tmp_path."""
        assert type(wk_backend).__name__ == "SqliteStateBackend" and wk_backend.is_open
        assert wk_source.address == f"sqlite:///{tmp_path / 'wk-source.db'}"
        assert (tmp_path / "wk-state.db").exists()

    def test_an_unknown_kind_is_an_error_naming_it(self) -> None:
        """A parametrization the plugin does not know is a ValueError listing the known ones."""
        request = SimpleNamespace(param="postgres")
        with pytest.raises(ValueError, match="wk_backend is parametrized with 'postgres'"):
            wk_plugin._kind(request, "wk_backend", ("memory", "sqlite"))  # type: ignore[arg-type]


REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "testing"


def _python_blocks(markdown: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown text."""
    blocks: list[str] = []
    for chunk in markdown.split("```python\n")[1:]:
        body, _, _ = chunk.partition("```")
        blocks.append(body)
    return blocks


class TestReadmeExample:
    @pytest.mark.slow
    async def test_the_example_suite_passes(self) -> None:
        """pytest runs examples/testing (the README's complete example) and it passes."""
        result = await anyio.run_process(
            [sys.executable, "-m", "pytest", str(EXAMPLE), "-q", "-p", "no:cacheprovider"],
            cwd=REPO,
            check=False,
        )
        output = result.stdout.decode(errors="replace")
        assert result.returncode == 0, output
        assert " passed" in output and "failed" not in output

    def test_the_docs_show_the_example_files_verbatim(self) -> None:
        """The "Testing your watcher" section quotes my_watcher.py and its test as they are."""
        pages = [REPO / "README.md", REPO / "docs" / "testing.md"]
        texts = [p.read_text() for p in pages if p.exists()]
        sections = [t for t in texts if "## Testing your watcher" in t]
        assert sections, "no page has a '## Testing your watcher' section"
        for text in sections:
            blocks = _python_blocks(text)
            for name in ("my_watcher.py", "test_my_watcher.py"):
                assert (EXAMPLE / name).read_text() in blocks, f"{name} differs from the docs"
        guide = _python_blocks((REPO / "docs" / "testing.md").read_text())
        for name in ("my_task.py", "test_my_task.py"):
            assert (EXAMPLE / name).read_text() in guide, f"{name} differs from docs/testing.md"
