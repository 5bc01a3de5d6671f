"""``TriggerEventBatch``: several events and one state committed by the runtime in one go.

Run through ``run_trigger`` (the supervisor's own commit path) on memory, SQLite and PostgreSQL,
and through the test kit's harness, whose crash points treat a batch as one yielded event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
from watchkeeper.store import Asset, MemoryStateBackend, ValueTypeError
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer import (
    BaseEventTrigger,
    InvalidEventError,
    TriggerEvent,
    TriggerEventBatch,
)
from watchkeeper.triggerer.testing import (
    CrashPoint,
    FakeEventSource,
    WatcherHarness,
    run_trigger,
)

ALSO_ON_UVLOOP = True  # the runner on asyncio's loop and on uvloop (see tests/conftest.py)
ORDERS = Asset("orders")
USERS = Asset("users")


class Batches(BaseEventTrigger):
    """Yields each item of ``script`` (batches or events), noting what it saw after each yield.

    After a yield it reads, from ``backend``, the events and the ``w`` state committed so far:
    what the code after ``yield`` (an acknowledgement, say) can rely on.
    """

    def __init__(self, script: Sequence[object], backend: BaseStateBackend) -> None:
        super().__init__()
        self.script = list(script)
        self.backend = backend
        self.seen_after_yield: list[tuple[int, Any]] = []
        self.closed = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        try:
            for item in self.script:
                yield item  # type: ignore[misc] # the tests yield wrong things on purpose too
                events = await self.backend.events.alist_events()
                watermark = await self.backend.aget(ORDERS.scope, "w")
                self.seen_after_yield.append((len(events), watermark))
        finally:
            self.closed = True


def batch(*payloads: object, keys: Sequence[str | None] = (), **state: Any) -> TriggerEventBatch:
    """A batch of ``payloads`` (with ``keys`` as their dedup keys) and ``state``."""
    dedup = list(keys) or [None] * len(payloads)
    return TriggerEventBatch(
        [TriggerEvent(p, dedup_key=k) for p, k in zip(payloads, dedup, strict=True)],
        state=state or None,
    )


async def committed(backend: BaseStateBackend) -> list[Any]:
    return [event.payload for event in await backend.events.alist_events()]


class TestBatchCommits:
    async def test_a_batch_commits_every_event_and_its_state_once(
        self, backend: BaseStateBackend
    ) -> None:
        """Each event becomes one asset event per asset; the state is written once, after all."""
        events = await run_trigger(
            Batches([batch(1, 2, 3, w=3)], backend), assets=[ORDERS, USERS], backend=backend
        )
        assert [(e.payload, e.asset) for e in events] == [
            (1, "orders"),
            (1, "users"),
            (2, "orders"),
            (2, "users"),
            (3, "orders"),
            (3, "users"),
        ]
        for asset in (ORDERS, USERS):
            entry = await backend.aget_entry(asset.scope, "w")
            assert entry is not None and (entry.value, entry.version) == (3, 1)

    async def test_the_generator_resumes_once_the_whole_batch_committed(
        self, backend: BaseStateBackend
    ) -> None:
        """The code after the batch's yield sees all its events and its state durable."""
        trigger = Batches(
            [batch(1, 2, w=2), TriggerEvent(3, state={"w": 3}), batch(4, 5, w=5)], backend
        )
        await run_trigger(trigger, assets=ORDERS, backend=backend)
        assert trigger.seen_after_yield == [(2, 2), (3, 3), (5, 5)]

    async def test_a_bad_event_fails_the_whole_batch(self, backend: BaseStateBackend) -> None:
        """An event that cannot be stored fails the run; nothing of its batch is written."""
        trigger = Batches([batch(1, w=1), batch(2, {3}, 4, w=4)], backend)
        with pytest.raises(ValueTypeError) as caught:
            await run_trigger(trigger, assets=ORDERS, backend=backend)
        assert any("event 1 of a TriggerEventBatch of 3" in note for note in caught.value.__notes__)
        assert await committed(backend) == [1]
        assert await backend.aget(ORDERS.scope, "w") == 1
        assert trigger.closed

    @pytest.mark.parametrize(
        ("item", "match"),
        [
            (TriggerEventBatch([]), "empty TriggerEventBatch"),
            (TriggerEventBatch([TriggerEvent(1, state={"w": 1})]), "has a state of its own"),
            (TriggerEventBatch([{"not": "an event"}]), "holding a dict"),  # type: ignore[list-item]
            (TriggerEventBatch([TriggerEvent(1, dedup_key="")]), "dedup_key is ''"),
            (TriggerEventBatch([TriggerEvent(1)], state=[("w", 1)]), "state is a list"),  # type: ignore[arg-type]
            ([TriggerEvent(1), TriggerEvent(2)], "wrap a list of events in TriggerEventBatch"),
        ],
        ids=["empty", "own-state", "not-an-event", "bad-key", "bad-state", "plain-list"],
    )
    async def test_a_malformed_batch_is_refused_and_writes_nothing(
        self, item: object, match: str
    ) -> None:
        """A batch of the wrong shape raises InvalidEventError naming the fault; nothing lands."""
        backend = MemoryStateBackend()
        with pytest.raises(InvalidEventError, match=match):
            await run_trigger(Batches([item], backend), assets=ORDERS, backend=backend)
        assert await committed(backend) == []
        assert await backend.aget(ORDERS.scope, "w") is None

    async def test_redelivered_events_are_suppressed_one_by_one(
        self, backend: BaseStateBackend
    ) -> None:
        """Known keys are dropped alone; a batch redelivered in full leaves the state alone."""
        first = await run_trigger(
            Batches([batch("a", "b", keys=["m1", "m2"], w=2)], backend),
            assets=ORDERS,
            backend=backend,
        )
        partly = await run_trigger(
            Batches([batch("a", "b", "c", keys=["m1", "m2", "m3"], w=3)], backend),
            assets=ORDERS,
            backend=backend,
        )
        fully = await run_trigger(
            Batches([batch("a", "b", keys=["m1", "m2"], w=0)], backend),
            assets=ORDERS,
            backend=backend,
        )
        assert [[e.payload for e in run] for run in (first, partly, fully)] == [
            ["a", "b"],
            ["c"],
            [],
        ]
        assert await backend.aget(ORDERS.scope, "w") == 3

    async def test_max_events_counts_events_and_never_splits_a_batch(
        self, backend: BaseStateBackend
    ) -> None:
        """The run stops after the batch that reaches max_events and returns all of it."""
        trigger = Batches([batch(1, 2, 3, w=3), batch(4, 5, 6, w=6), batch(7, w=7)], backend)
        events = await run_trigger(trigger, assets=ORDERS, backend=backend, max_events=4)
        assert [e.payload for e in events] == [1, 2, 3, 4, 5, 6]
        assert await backend.aget(ORDERS.scope, "w") == 6
        assert trigger.closed and len(trigger.seen_after_yield) == 1  # closed at its yield

    async def test_the_committed_payloads_share_nothing_with_the_yielded_ones(
        self, backend: BaseStateBackend
    ) -> None:
        """A trigger that reuses and changes its payload object after the yield does not
        change the events already committed and returned."""

        class Reusing(BaseEventTrigger):
            def serialize(self) -> tuple[str, dict[str, Any]]:
                return self.classpath(), {}

            async def run(self) -> AsyncIterator[TriggerEventBatch]:
                row: dict[str, Any] = {"n": 1, "tags": ["a"]}
                yield TriggerEventBatch([TriggerEvent(row)], state={"w": 1})
                row["n"] = 2
                row["tags"].append("b")
                yield TriggerEventBatch([TriggerEvent(row)], state={"w": 2})

        events = await run_trigger(Reusing(), assets=ORDERS, backend=backend)
        assert [e.payload for e in events] == [
            {"n": 1, "tags": ["a"]},
            {"n": 2, "tags": ["a", "b"]},
        ]
        assert await committed(backend) == [e.payload for e in events]

    def test_repr_and_equality(self) -> None:
        """A batch shows its size and state, and equals another with the same events and state."""
        assert repr(batch(1, 2, w=2)) == "TriggerEventBatch(<2 events>, state={'w': 2})"
        assert batch(1, 2, w=2) == batch(1, 2, w=2)
        assert batch(1, 2, w=2) != batch(1, 2, w=3)
        assert len(batch(1, 2, 3)) == 3


class BatchPollWatcher(BaseEventTrigger):
    """Polls a feed two items at a time and commits each poll as one batch with its watermark."""

    def __init__(self, feed: str) -> None:
        super().__init__()
        self.feed = feed

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"feed": self.feed}

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        watermark: int = await self.asset_state_store.aget("watermark", 0)
        async with FakeEventSource.connect(self.feed) as feed:
            while True:
                items = await feed.poll(after=watermark, limit=2)
                if not items:
                    await anyio.sleep(0.005)
                    continue
                watermark = items[-1].seq
                yield TriggerEventBatch(
                    [TriggerEvent(item.seq) for item in items], state={"watermark": watermark}
                )


@pytest.mark.parametrize("wk_backend", ["memory", "sqlite"], indirect=True)
class TestBatchesInTheHarness:
    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_at_a_batch_loses_and_repeats_nothing(
        self, wk_harness: WatcherHarness, wk_source: FakeEventSource, point: CrashPoint
    ) -> None:
        """Killed at any point of its second batch, the restarted watcher commits 1..5 once."""
        await wk_source.publish(*range(1, 6))
        watcher = BatchPollWatcher(wk_source.address)
        crashed = await wk_harness.crash(watcher, assets=ORDERS, at=point, event=2)
        expected_before = {"before_commit": [1, 2], "after_commit": [1, 2, 3, 4]}
        assert crashed.all_payloads == expected_before.get(point, [1, 2, 3, 4])
        rest = 5 - len(crashed.all_events)
        after = await wk_harness.restart(watcher, assets=ORDERS, max_events=rest)
        assert after.all_payloads == [1, 2, 3, 4, 5]
        assert after.watermark == 5

    async def test_a_run_stops_after_the_batch_that_reached_max_events(
        self, wk_harness: WatcherHarness, wk_source: FakeEventSource
    ) -> None:
        """max_events=3 over batches of two stops after the second batch, with four events."""
        await wk_source.publish(*range(1, 6))
        result = await wk_harness.run(
            BatchPollWatcher(wk_source.address), assets=ORDERS, max_events=3
        )
        assert result.payloads == [1, 2, 3, 4]
        assert result.stopped == "max_events"
        assert result.watermark == 4
