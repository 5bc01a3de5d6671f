"""RabbitMQWatcher against the real RabbitMQ server on 127.0.0.1:5672 (guest/guest)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import anyio
import pytest
import structlog
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from watchkeeper.store import Asset
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, RabbitMQWatcher

from tests.support.brokers import (
    RABBITMQ_PORT,
    Observed,
    crash_in_a_batch,
    crash_then_restart,
    numbers,
    publish_without_message_id,
    require_server,
    run_through_a_break,
    unique,
)

URL = f"amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}/"
ASSET = Asset("events")
NAME = "queue_feed"


@pytest.fixture
async def channel() -> AsyncIterator[AbstractChannel]:
    """A channel on the test server (skips, or fails in CI, when it is down)."""
    require_server("RabbitMQ", RABBITMQ_PORT)
    connection = await aio_pika.connect(URL)
    async with connection:
        yield await connection.channel()


@pytest.fixture
async def queue(channel: AbstractChannel) -> AsyncIterator[str]:
    """A durable queue of this test's own, deleted afterwards."""
    name = unique("wk-test-")
    await channel.declare_queue(name, durable=True)
    try:
        yield name
    finally:
        await channel.queue_delete(name)


async def publish(
    channel: AbstractChannel, queue: str, *numbers: int, with_id: bool = True, **extra: Any
) -> None:
    """Publish ``{"n": n}`` per number, with the message id ``m-<n>`` (or none at all)."""
    if not with_id:
        await publish_without_message_id(queue, [json.dumps({"n": n}).encode() for n in numbers])
        return
    for n in numbers:
        message = aio_pika.Message(
            json.dumps({"n": n}).encode(),
            message_id=f"m-{n}",
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **extra,
        )
        await channel.default_exchange.publish(message, routing_key=queue)


async def ready(channel: AbstractChannel, queue: str) -> int:
    """Messages of ``queue`` waiting to be delivered (not the delivered, unacknowledged ones)."""
    declared = await channel.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    assert count is not None
    return count


async def take_without_ack(queue: str, count: int, *, within: float) -> list[int]:
    """The numbers of the messages a consumer of its own gets from ``queue`` (no bound on
    its deliveries, none acknowledged) until it has ``count`` or ``within`` seconds passed;
    closing its connection then puts them back in the queue."""
    got: list[int] = []
    enough = anyio.Event()

    async def take(message: AbstractIncomingMessage) -> None:
        got.append(json.loads(message.body)["n"])
        if len(got) >= count:
            enough.set()

    async with await aio_pika.connect(URL) as connection:
        own = await connection.channel()
        declared = await own.declare_queue(queue, passive=True)
        await declared.consume(take)
        with anyio.move_on_after(within):
            await enough.wait()
    return got


async def close_connections(name: str) -> int:
    """Close, from the server, the connections named ``name``; return how many."""
    listed = await anyio.run_process(
        ["rabbitmqctl", "list_connections", "pid", "client_properties", "-q", "--no-table-headers"]
    )
    closed = 0
    for line in listed.stdout.decode().splitlines():
        pid, _, properties = line.partition("\t")
        if f'{{"connection_name","{name}"}}' in properties:
            await anyio.run_process(["rabbitmqctl", "close_connection", pid, "test: dropped"])
            closed += 1
    return closed


class TestRabbitMQWatcherFlow:
    async def test_messages_become_events_keyed_by_their_message_id(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """Each message is one event with its body and properties, keyed by its message_id."""
        await publish(channel, queue, 1, 2, headers={"source": "test"})
        run = await harness.run(
            RabbitMQWatcher(queue, URL, batch_size=1), assets=ASSET, max_events=2, watcher_name=NAME
        )
        assert numbers(run.payloads) == [1, 2]
        first = run.payloads[0]
        assert first["message_id"] == "m-1"
        assert first["routing_key"] == queue
        assert first["headers"] == {"source": "test"}
        assert first["content_type"] == "application/json"
        assert [e.dedup_key for e in run.events] == [f"{NAME}:amqp:{queue}:m-{n}" for n in (1, 2)]

    async def test_a_restart_resumes_with_what_the_queue_still_holds(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """A watcher rebuilt from serialize() gets the messages not acknowledged before."""
        await publish(channel, queue, 1, 2, 3)
        watcher = RabbitMQWatcher(queue, URL, batch_size=1)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        await publish(channel, queue, 4)
        second = await harness.restart(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert numbers(first.payloads) == [1, 2]
        assert numbers(second.all_payloads) == [1, 2, 3, 4]

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_is_redelivered_and_nothing_is_repeated(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed at any point of its third message, the restarted watcher gets the unacked
        messages again from the broker and commits each exactly once."""
        await publish(channel, queue, 1, 2, 3, 4, 5)
        after, logs = await crash_then_restart(
            harness,
            RabbitMQWatcher(queue, URL, batch_size=1),
            point,
            asset=ASSET,
            watcher_name=NAME,
        )
        assert sorted(numbers(after.all_payloads)) == [1, 2, 3, 4, 5]
        assert len(after.all_payloads) == 5
        if point == "after_commit":
            suppressed = [e["dedup_key"] for e in logs if e["event"] == "event_deduplicated"]
            assert suppressed[:1] == [f"{NAME}:amqp:{queue}:m-3"]

    async def test_prefetch_bounds_the_unacknowledged_deliveries(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """With prefetch=2, a watcher held after its first event has only two messages out:
        a second consumer started then gets the other eight (it would get none, the broker
        having sent them all to the watcher, were there no bound)."""
        await publish(channel, queue, *range(1, 11))
        first, resume = anyio.Event(), anyio.Event()
        witnessed: list[int] = []

        async def check_then_resume() -> None:
            await first.wait()
            with anyio.fail_after(10):
                while True:  # the second delivery is on its way: wait until it left the queue
                    if await ready(channel, queue) <= 8:
                        break
                    await anyio.sleep(0.05)
            witnessed.extend(await take_without_ack(queue, 8, within=10))
            resume.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(check_then_resume)
            run = await harness.run(
                Observed(
                    RabbitMQWatcher(queue, URL, batch_size=1, prefetch=2), {1: first}, {1: resume}
                ),
                assets=ASSET,
                max_events=10,
                watcher_name=NAME,
            )
        assert witnessed == list(range(3, 11))
        assert numbers(run.payloads) == list(range(1, 11))


class TestRabbitMQWatcherMissingId:
    async def test_hash_keys_a_message_by_body_and_headers(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """Without a message_id, equal body and headers are one event; a different body is not."""
        await publish(channel, queue, 1, 1, 2, with_id=False)
        run = await harness.run(
            RabbitMQWatcher(queue, URL, batch_size=1), assets=ASSET, max_events=2, watcher_name=NAME
        )
        assert numbers(run.payloads) == [1, 2]
        assert all(":amqp:" in (e.dedup_key or "") for e in run.events)

    async def test_emit_gives_no_key_and_keeps_every_message(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """missing_id="emit": messages without an id are events without a dedup_key, each one."""
        await publish(channel, queue, 1, 1, with_id=False)
        run = await harness.run(
            RabbitMQWatcher(queue, URL, batch_size=1, missing_id="emit"),
            assets=ASSET,
            max_events=2,
            watcher_name=NAME,
        )
        assert numbers(run.payloads) == [1, 1]
        assert [e.dedup_key for e in run.events] == [None, None]

    async def test_reject_drops_messages_without_an_id_from_the_queue(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """missing_id="reject": a message without an id is rejected (not requeued), no event."""
        await publish(channel, queue, 1, with_id=False)
        await publish(channel, queue, 2)
        with structlog.testing.capture_logs() as logs:
            run = await harness.run(
                RabbitMQWatcher(queue, URL, batch_size=1, missing_id="reject"),
                assets=ASSET,
                max_events=1,
                watcher_name=NAME,
            )
        assert numbers(run.payloads) == [2]
        assert [e["event"] for e in logs].count("rabbitmq_message_rejected") == 1
        # What is left is the second message (committed, its ack cut short by max_events):
        # the first is gone, not requeued.
        left = await (await channel.get_queue(queue)).get(no_ack=True)
        assert left is not None and left.message_id == "m-2"
        assert await ready(channel, queue) == 0


class TestRabbitMQWatcherTrouble:
    async def test_a_connection_closed_by_the_server_is_survived(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """rabbitmqctl close_connection after two events: the watcher reconnects in the same
        run, and every message is one event."""
        name = unique("queue_feed_")
        await publish(channel, queue, 1, 2)
        closed: list[int] = []

        async def close_then_publish() -> None:
            closed.append(await close_connections(f"watchkeeper:{name}"))
            await publish(channel, queue, 3, 4)

        with structlog.testing.capture_logs() as logs:
            run = await run_through_a_break(
                harness,
                RabbitMQWatcher(queue, URL, batch_size=1),
                close_then_publish,
                asset=ASSET,
                watcher_name=name,
                timeout=60,
            )
        assert closed == [1]
        assert "rabbitmq_reconnecting" in [e["event"] for e in logs]
        assert numbers(run.all_payloads) == [1, 2, 3, 4]

    async def test_a_missing_queue_raises_a_broker_error(
        self, channel: AbstractChannel, harness: WatcherHarness
    ) -> None:
        """A queue that does not exist (and declare=False) ends run() naming the queue."""
        missing = unique("wk-missing-")
        with pytest.raises(BrokerSourceError, match=missing):
            await harness.run(
                RabbitMQWatcher(missing, URL, batch_size=1),
                assets=ASSET,
                max_events=1,
                watcher_name=NAME,
            )

    async def test_refused_credentials_raise_without_the_password(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness
    ) -> None:
        """A wrong password ends run() with BrokerSourceError at once; the password is not shown."""
        url = f"amqp://guest:wr0ng-pw@127.0.0.1:{RABBITMQ_PORT}/"
        with pytest.raises(BrokerSourceError) as caught:
            await harness.run(
                RabbitMQWatcher(queue, url, batch_size=1),
                assets=ASSET,
                max_events=1,
                watcher_name=NAME,
            )
        assert "wr0ng-pw" not in str(caught.value)


class TestBatches:
    @pytest.mark.parametrize("point", ["before_commit", "after_commit"])
    async def test_a_crash_inside_a_batch_loses_and_repeats_nothing(
        self, channel: AbstractChannel, queue: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed inside a batch (before its commit, after its commit and before the acks),
        the restarted watcher commits each message exactly once: a batch committed but never
        acknowledged comes again and each of its messages is suppressed by its dedup_key."""
        await publish(channel, queue, 1, 2, 3, 4, 5)
        crashed, after, suppressed = await crash_in_a_batch(
            harness,
            RabbitMQWatcher(queue, URL, batch_linger=0.2),
            point,
            lambda: publish(channel, queue, 6, 7),
            asset=ASSET,
            watcher_name=NAME,
            total=7,
        )
        assert numbers(after.all_payloads) == list(range(1, 8))
        if point == "after_commit":
            assert len(crashed.all_events) == 5  # one batch, one commit
            assert suppressed == 5
