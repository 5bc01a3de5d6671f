"""kill -9 of a real ``watchkeeper triggerer`` reading a real broker: each message exactly once.

For each push source (NATS JetStream, RabbitMQ, MQTT, SQS on ``moto_server``) a daemon runs
the ready-made watcher on a stream/queue/topic of its own, committing in batches (its default
``batch_size``), while 5,000 messages with distinct ids are published (SQS: fewer, see its
plan), and is SIGKILLed at least 10 times at random points, inside batches too (see
``_broker_chaos.py``). The events committed
are then read with plain ``sqlite3`` and compared with the ids published: none may be missing
and none may be there twice, though the brokers redeliver what a killed daemon had committed
but not yet acknowledged. How many redeliveries were suppressed is printed: whether a random
kill lands between a commit and its acknowledgement is chance, so the suppression itself is
asserted where a kill is placed there on purpose (``tests/watchers/brokers``' kill tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from tests.chaos._broker_chaos import BrokerChaos, BrokerPlan, BrokerResult, Publish
from tests.support.brokers import require_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
PLAN = BrokerPlan(items=5_000, kills=10, seed=SEED)
SQS_PLAN = BrokerPlan(items=600, kills=5, seed=SEED, round_timeout=180.0, settle=30.0)
"""moto_server answers SQS calls one at a time at tens of messages per second on a loaded
machine: fewer messages, and more patience before a round counts as stalled."""


def body(n: int) -> bytes:
    return json.dumps({"id": f"c-{n}", "n": n}).encode()


def check(
    result: BrokerResult, capsys: pytest.CaptureFixture[str], plan: BrokerPlan = PLAN
) -> None:
    with capsys.disabled():
        print(f"\n{result.summary()} seed={SEED}")
    assert result.kills >= plan.kills
    assert result.items >= plan.items
    assert (result.lost, result.duplicated) == (0, 0)
    assert sorted(result.numbers) == list(range(1, result.items + 1))


async def run_chaos(
    broker: str, watcher: str, publish: Publish, work: Path, plan: BrokerPlan = PLAN
) -> BrokerResult:
    name = f"chaos_{uuid.uuid4().hex[:10]}"
    return await BrokerChaos(broker, watcher, publish, work, plan, watcher_name=name).run()


class TestBrokerKillNine:
    async def test_nats_jetstream_commits_every_message_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """After 10+ SIGKILLs, the JetStream watcher committed each of 5,000 messages once."""
        require_server("NATS", 4222)
        import nats

        url = "nats://127.0.0.1:4222"
        stream = f"WK_CHAOS_{uuid.uuid4().hex[:10]}"
        client = await nats.connect(url)
        js = client.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        try:

            async def publish(numbers: list[int]) -> None:
                for n in numbers:
                    await js.publish(f"{stream}.items", body(n))

            watcher = f"NatsJetStreamWatcher({stream!r}, {url!r}, ack_wait=2.0, fetch_timeout=0.5)"
            result = await run_chaos("nats", watcher, publish, tmp_path)
        finally:
            await js.delete_stream(stream)
            await client.close()
        check(result, capsys)

    async def test_rabbitmq_commits_every_message_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """After 10+ SIGKILLs, the RabbitMQ watcher committed each of 5,000 messages once."""
        require_server("RabbitMQ", 5672)
        import aio_pika

        url = "amqp://guest:guest@127.0.0.1:5672/"
        queue = f"wk-chaos-{uuid.uuid4().hex[:10]}"
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(queue, durable=True)
            try:

                async def publish(numbers: list[int]) -> None:
                    for n in numbers:
                        message = aio_pika.Message(
                            body(n),
                            message_id=f"c-{n}",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        )
                        await channel.default_exchange.publish(message, routing_key=queue)

                watcher = f"RabbitMQWatcher({queue!r}, {url!r}, prefetch=100)"
                result = await run_chaos("rabbitmq", watcher, publish, tmp_path)
            finally:
                await channel.queue_delete(queue)
        check(result, capsys)

    async def test_mqtt_commits_every_message_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """After 10+ SIGKILLs, the MQTT watcher committed each of 5,000 QoS 1 messages once."""
        require_server("Mosquitto", 1883)
        name = f"chaos_{uuid.uuid4().hex[:10]}"
        base = f"wk-chaos/{uuid.uuid4().hex[:10]}"
        url = "mqtt://127.0.0.1:1883"
        async with mqtt_session(f"watchkeeper-{name}", f"{base}/#") as publisher:

            async def publish(numbers: list[int]) -> None:
                await anyio.to_thread.run_sync(publisher, f"{base}/items", numbers)

            watcher = (
                f"MqttWatcher({base + '/#'!r}, {url!r}, dedup_field='id', "
                "session_expiry=600, reconnect_max=1)"
            )
            chaos = BrokerChaos("mqtt", watcher, publish, tmp_path, PLAN, watcher_name=name)
            result = await chaos.run()
        check(result, capsys)

    async def test_sqs_commits_every_message_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], moto_endpoint: str
    ) -> None:
        """After 5+ SIGKILLs, the SQS watcher committed each of 600 messages once, though
        SQS redelivers every batch a killed daemon committed but had not deleted."""
        from aiobotocore.session import get_session

        async with get_session().create_client(
            "sqs", region_name="us-east-1", endpoint_url=moto_endpoint
        ) as sqs:
            answer = await sqs.create_queue(QueueName=f"wk-chaos-{uuid.uuid4().hex[:10]}")
            queue = answer["QueueUrl"]

            async def publish(numbers: list[int]) -> None:
                for start in range(0, len(numbers), 10):
                    entries = [
                        {"Id": str(n), "MessageBody": body(n).decode()}
                        for n in numbers[start : start + 10]
                    ]
                    sent = await sqs.send_message_batch(QueueUrl=queue, Entries=entries)
                    assert not sent.get("Failed"), sent

            watcher = (
                f"SqsWatcher({queue!r}, endpoint_url={moto_endpoint!r}, wait_time=1, "
                "visibility_timeout=2)"
            )
            result = await run_chaos("sqs", watcher, publish, tmp_path, SQS_PLAN)
            await sqs.delete_queue(QueueUrl=queue)
        check(result, capsys, SQS_PLAN)


Publisher = Callable[[str, list[int]], None]


@contextlib.asynccontextmanager
async def mqtt_session(client_id: str, topics: str) -> AsyncIterator[Publisher]:
    """The watcher's MQTT session made beforehand (so no message is published before it
    exists), a QoS 1 publisher, and the session removed at the end."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    def session(expiry: int) -> None:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        subscribed = threading.Event()
        client.on_subscribe = lambda *_: subscribed.set()
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = expiry
        client.connect("127.0.0.1", 1883, clean_start=expiry == 0, properties=properties)
        client.loop_start()
        try:
            if expiry:
                client.subscribe(topics, qos=1)
                assert subscribed.wait(10), "no SUBACK from the broker"
        finally:
            client.disconnect()
            client.loop_stop()

    publisher = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    publisher.max_inflight_messages_set(100)

    def publish(topic: str, numbers: list[int]) -> None:
        infos = [publisher.publish(topic, body(n), qos=1) for n in numbers]
        for info in infos:
            info.wait_for_publish(30)

    def start() -> None:
        publisher.connect("127.0.0.1", 1883)
        publisher.loop_start()

    def stop() -> None:
        publisher.disconnect()
        publisher.loop_stop()

    await anyio.to_thread.run_sync(session, 600)
    await anyio.to_thread.run_sync(start)
    try:
        yield publish
    finally:
        with anyio.move_on_after(30, shield=True):
            await anyio.to_thread.run_sync(stop)
            await anyio.to_thread.run_sync(session, 0)
