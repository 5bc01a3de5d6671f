"""FakeEventSource, the test kit's scripted source: polling, listening, faults, processes."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from watchkeeper.triggerer.testing import (
    FakeEventSource,
    SourceClosedError,
    SourceDisconnectedError,
    SourceItem,
    SourceUnavailableError,
)

both_sources = pytest.mark.parametrize("wk_source", ["memory", "sqlite"], indirect=True)


def seqs(items: list[SourceItem]) -> list[int]:
    return [item.seq for item in items]


@both_sources
class TestFakeEventSourcePoll:
    async def test_poll_returns_items_after_the_cursor_in_order(
        self, wk_source: FakeEventSource
    ) -> None:
        """poll(after=, limit=) returns the items past the cursor, oldest first, at most limit."""
        assert await wk_source.publish("a", "b", "c", "d") == [1, 2, 3, 4]
        assert seqs(await wk_source.poll(after=1, limit=2)) == [2, 3]
        items = await wk_source.poll(after=3)
        assert [(i.seq, i.payload, i.redelivered) for i in items] == [(4, "d", False)]
        assert await wk_source.poll(after=4) == []

    async def test_a_late_commit_hides_behind_a_cursor(self, wk_source: FakeEventSource) -> None:
        """An item published later with a lower seq is invisible to a cursor already past it."""
        await wk_source.publish("a")
        await wk_source.publish("c", seq=3)
        assert seqs(await wk_source.poll(after=0)) == [1, 3]
        await wk_source.publish("b", seq=2)
        assert seqs(await wk_source.poll(after=3)) == []
        assert seqs(await wk_source.poll(after=0)) == [1, 2, 3]

    async def test_bad_publish_changes_nothing(self, wk_source: FakeEventSource) -> None:
        """A non-JSON payload or a taken seq is an error naming it, and nothing is stored."""
        await wk_source.publish({"n": 1})
        with pytest.raises(TypeError, match="payload #1 is not JSON"):
            await wk_source.publish("ok", {1, 2})
        with pytest.raises(ValueError, match="seq 1 is already published"):
            await wk_source.publish("again", seq=1)
        with pytest.raises(ValueError, match="takes one payload"):
            await wk_source.publish("x", "y", seq=9)
        assert [(i.seq, i.payload) for i in await wk_source.items()] == [(1, {"n": 1})]

    async def test_bad_arguments_are_rejected(self, wk_source: FakeEventSource) -> None:
        """A limit below 1, a negative cursor or a zero count is a ValueError naming it."""
        with pytest.raises(ValueError, match="limit"):
            await wk_source.poll(limit=0)
        with pytest.raises(ValueError, match="after"):
            await wk_source.poll(after=-1)
        with pytest.raises(ValueError, match="times"):
            await wk_source.fail(times=0)
        with pytest.raises(ValueError, match="count"):
            await wk_source.reorder(1)

    async def test_fail_raises_on_the_next_polls_only(self, wk_source: FakeEventSource) -> None:
        """fail(times=2) makes the next two polls raise SourceUnavailableError, then it heals."""
        await wk_source.publish("a")
        await wk_source.fail("api down", times=2)
        for _ in range(2):
            with pytest.raises(SourceUnavailableError, match="api down"):
                await wk_source.poll()
        assert seqs(await wk_source.poll()) == [1]

    async def test_hang_blocks_until_cancelled(self, wk_source: FakeEventSource) -> None:
        """hang() makes the next poll wait until it is cancelled; the one after answers."""
        await wk_source.publish("a")
        await wk_source.hang()
        with anyio.move_on_after(0.05) as scope:
            await wk_source.poll()
        assert scope.cancelled_caught
        assert seqs(await wk_source.poll()) == [1]

    async def test_duplicate_repeats_items_in_the_batch(self, wk_source: FakeEventSource) -> None:
        """duplicate(2) delivers the next two items twice; the copies are marked redelivered."""
        await wk_source.publish("a", "b", "c")
        await wk_source.duplicate(2)
        items = await wk_source.poll()
        assert [(i.seq, i.redelivered) for i in items] == [
            (1, False),
            (1, True),
            (2, False),
            (2, True),
            (3, False),
        ]
        assert seqs(await wk_source.poll()) == [1, 2, 3]

    async def test_reorder_reverses_the_next_items(self, wk_source: FakeEventSource) -> None:
        """reorder(3) returns the next three items newest first; later polls are in order."""
        await wk_source.publish("a", "b", "c", "d")
        await wk_source.reorder(3)
        assert seqs(await wk_source.poll()) == [3, 2, 1, 4]
        assert seqs(await wk_source.poll()) == [1, 2, 3, 4]

    async def test_redeliver_replays_from_the_oldest_unacked(
        self, wk_source: FakeEventSource
    ) -> None:
        """redeliver() makes the next poll ignore its cursor and start at the oldest unacked."""
        await wk_source.publish("a", "b", "c")
        first = await wk_source.poll()
        await wk_source.ack(first[0])
        await wk_source.redeliver()
        replay = await wk_source.poll(after=3)
        assert [(i.seq, i.delivery) for i in replay] == [(2, 2), (3, 2)]
        assert await wk_source.poll(after=3) == []

    async def test_disconnect_fails_the_next_poll_once(self, wk_source: FakeEventSource) -> None:
        """After disconnect() the handle's next poll raises SourceDisconnectedError once."""
        await wk_source.publish("a")
        assert seqs(await wk_source.poll()) == [1]
        await wk_source.disconnect()
        with pytest.raises(SourceDisconnectedError):
            await wk_source.poll()
        assert seqs(await wk_source.poll()) == [1]


async def receive(subscription: object, count: int) -> list[SourceItem]:
    """The next ``count`` items of a subscription, bounded in time."""
    received: list[SourceItem] = []
    with anyio.fail_after(5):
        async for item in subscription:  # type: ignore[attr-defined]
            received.append(item)
            if len(received) == count:
                break
    return received


@both_sources
class TestFakeEventSourceListen:
    async def test_listen_waits_for_new_items(self, wk_source: FakeEventSource) -> None:
        """A subscription delivers published items in order and waits for later ones."""
        await wk_source.publish("a")
        got: list[SourceItem] = []
        first = anyio.Event()

        async def consume() -> None:
            async for item in wk_source.listen():
                got.append(item)
                first.set()
                if len(got) == 3:
                    return

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await first.wait()
                await wk_source.publish("b", "c")
        assert [(i.seq, i.payload) for i in got] == [(1, "a"), (2, "b"), (3, "c")]

    async def test_a_new_subscription_gets_only_unacked_items(
        self, wk_source: FakeEventSource
    ) -> None:
        """Acknowledged items are never delivered again; the rest come back, marked redelivered."""
        await wk_source.publish("a", "b", "c")
        items = await receive(wk_source.listen(), 3)
        await wk_source.ack(items[0])
        await wk_source.ack(items[2])
        again = await receive(wk_source.listen(), 1)
        assert [(i.seq, i.redelivered) for i in again] == [(2, True)]
        assert await wk_source.acked() == [1, 3]
        assert await wk_source.unacked() == [2]

    async def test_redeliver_rewinds_an_open_subscription(self, wk_source: FakeEventSource) -> None:
        """redeliver() replays everything since the oldest unacked item to the open session."""
        await wk_source.publish("a", "b", "c")
        subscription = wk_source.listen()
        items = await receive(subscription, 2)
        await wk_source.ack(items[0])
        await wk_source.redeliver()
        replay = await receive(subscription, 2)
        assert [(i.seq, i.redelivered) for i in replay] == [(2, True), (3, False)]

    async def test_disconnect_ends_the_session_and_refuses_its_acks(
        self, wk_source: FakeEventSource
    ) -> None:
        """After disconnect() the session raises, its items cannot be acked, and come back."""
        await wk_source.publish("a", "b")
        subscription = wk_source.listen()
        items = await receive(subscription, 1)
        await wk_source.disconnect()
        with pytest.raises(SourceDisconnectedError):
            await receive(subscription, 1)
        with pytest.raises(SourceDisconnectedError, match="seq 1"):
            await wk_source.ack(items[0])
        assert seqs(await receive(wk_source.listen(), 2)) == [1, 2]

    async def test_duplicate_and_reorder_in_a_session(self, wk_source: FakeEventSource) -> None:
        """duplicate() sends an item twice in a row and reorder(3) reverses the next three."""
        await wk_source.publish("a", "b", "c", "d", "e")
        await wk_source.duplicate(1)
        await wk_source.reorder(3)
        got = await receive(wk_source.listen(), 6)
        assert [(i.seq, i.redelivered) for i in got] == [
            (1, False),
            (1, True),
            (4, False),
            (3, False),
            (2, False),
            (5, False),
        ]

    async def test_fail_and_hang_in_a_session(self, wk_source: FakeEventSource) -> None:
        """A scripted failure raises from the receive; a hang blocks it until cancelled."""
        await wk_source.publish("a")
        subscription = wk_source.listen()
        await wk_source.fail("broker down")
        with pytest.raises(SourceUnavailableError, match="broker down"):
            await receive(subscription, 1)
        await wk_source.hang()
        with anyio.move_on_after(0.05) as scope:
            await receive(subscription, 1)
        assert scope.cancelled_caught
        assert seqs(await receive(subscription, 1)) == [1]

    async def test_bad_acks_are_rejected(self, wk_source: FakeEventSource) -> None:
        """Acking something that is not a delivered item of this source is an error."""
        with pytest.raises(TypeError, match="SourceItem"):
            await wk_source.ack(1)  # type: ignore[arg-type]
        with pytest.raises(KeyError, match="seq 7"):
            await wk_source.ack(SourceItem(7, "x"))
        assert await wk_source.acked() == []


class TestFakeEventSourceAddresses:
    async def test_connect_reaches_the_same_memory_source(self) -> None:
        """A handle from connect(address) sees what another handle published."""
        source = FakeEventSource()
        other = FakeEventSource.connect(source.address)
        await source.publish("a")
        assert seqs(await other.poll()) == [1]
        assert repr(other).startswith("<FakeEventSource address='memory://fake-")

    async def test_bad_addresses_are_errors(self) -> None:
        """An unknown or malformed address raises an error naming it."""
        with pytest.raises(LookupError, match="memory://nope"):
            FakeEventSource.connect("memory://nope")
        with pytest.raises(ValueError, match="kafka://x"):
            FakeEventSource.connect("kafka://x")
        named = FakeEventSource("orders-test-name")
        with pytest.raises(ValueError, match="already exists"):
            FakeEventSource("orders-test-name")
        assert named.address == "memory://orders-test-name"

    async def test_sqlite_handle_must_be_opened(self, tmp_path: Path) -> None:
        """Using a SQLite-backed handle outside ``async with`` raises SourceClosedError."""
        source = FakeEventSource.at(tmp_path / "s.db")
        with pytest.raises(SourceClosedError, match="async with"):
            await source.publish("a")
        async with source:
            await source.publish("a")
        with pytest.raises(SourceClosedError):
            await source.poll()

    @pytest.mark.slow
    async def test_producer_and_consumer_in_different_processes(self, tmp_path: Path) -> None:
        """A subprocess publishes into the SQLite file and reads the acks the test made."""
        path = tmp_path / "s.db"
        script = textwrap.dedent(
            f"""
            import anyio, sys
            from watchkeeper.triggerer.testing import FakeEventSource

            async def main():
                async with FakeEventSource.at({str(path)!r}) as source:
                    if sys.argv[1] == "publish":
                        await source.publish(*range(10))
                    else:
                        print(await source.acked())

            anyio.run(main)
            """
        )
        await anyio.run_process([sys.executable, "-c", script, "publish"])
        async with FakeEventSource.at(path) as source:
            items = await receive(source.listen(), 10)
            assert [i.payload for i in items] == list(range(10))
            for item in items[:4]:
                await source.ack(item)
        result = await anyio.run_process([sys.executable, "-c", script, "acked"])
        assert result.stdout.decode().strip() == "[1, 2, 3, 4]"
