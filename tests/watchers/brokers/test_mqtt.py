"""MqttWatcher against the real Mosquitto broker on 127.0.0.1:1883 (MQTT 5, QoS 1)."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from watchkeeper.store import Asset
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, MqttWatcher

from tests.support.brokers import (
    MQTT_PORT,
    crash_in_a_batch,
    crash_then_restart,
    numbers,
    require_server,
    run_through_a_break,
    unique,
)
from tests.support.proxy import open_proxy

URL = f"mqtt://127.0.0.1:{MQTT_PORT}"
ASSET = Asset("events")
FAST: dict[str, Any] = {
    "session_expiry": 300,
    "connect_timeout": 10.0,
    "reconnect_max": 1,
    "batch_size": 1,
}
"""The per-message path (``batch_size=1``), whose steps these tests count one by one; the
batch path has its own tests (``TestBatches``)."""


def _client(client_id: str = "") -> paho.Client:
    return paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)


def _session(client_id: str, topic: str | None, expiry: int) -> None:
    """Connect as ``client_id`` (the watcher's id) and leave a session behind (subscribed
    to ``topic`` at QoS 1, kept ``expiry`` s), or, with ``expiry=0``, remove its session."""
    client = _client(client_id)
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    properties.SessionExpiryInterval = expiry
    client.connect("127.0.0.1", MQTT_PORT, clean_start=expiry == 0, properties=properties)
    client.loop_start()
    try:
        if topic is not None:
            client.subscribe(topic, qos=1)
            assert subscribed.wait(10), "no SUBACK from the broker"
    finally:
        client.disconnect()
        client.loop_stop()


def _publish(topic: str, messages: list[tuple[bytes, dict[str, str] | None]]) -> None:
    client = _client()
    client.connect("127.0.0.1", MQTT_PORT)
    client.loop_start()
    try:
        for payload, user in messages:
            properties = None
            if user:
                properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                properties.UserProperty = list(user.items())
            client.publish(topic, payload, qos=1, properties=properties).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


async def publish(topic: str, *numbers: int, with_id: bool = True) -> None:
    """Publish ``{"id": "i-<n>", "n": n}`` per number at QoS 1 (without ``id`` if asked)."""
    bodies = [
        json.dumps({"id": f"i-{n}", "n": n} if with_id else {"n": n}).encode() for n in numbers
    ]
    messages: list[tuple[bytes, dict[str, str] | None]] = [(body, None) for body in bodies]
    await anyio.to_thread.run_sync(_publish, topic, messages)


@pytest.fixture
def name() -> str:
    """The watcher's name: its own, so its MQTT session is its own."""
    require_server("Mosquitto", MQTT_PORT)
    return unique("mqtt_feed_")


@pytest.fixture
async def topic(name: str) -> AsyncIterator[str]:
    """A topic of this test's own. The watcher's session is made first (published messages
    are kept for it from then on, as for a watcher that ran before), removed afterwards."""
    base = unique("wk-test/")
    await anyio.to_thread.run_sync(_session, f"watchkeeper-{name}", f"{base}/#", 300)
    try:
        yield f"{base}/items"
    finally:
        with anyio.move_on_after(10, shield=True):
            await anyio.to_thread.run_sync(_session, f"watchkeeper-{name}", None, 0)


def watcher_of(topic: str, url: str = URL, **options: Any) -> MqttWatcher:
    return MqttWatcher(
        f"{topic.rpartition('/')[0]}/#", url, **{"dedup_field": "id", **FAST, **options}
    )


class TestMqttWatcherFlow:
    async def test_messages_become_events_keyed_by_their_id_field(
        self, topic: str, name: str, harness: WatcherHarness
    ) -> None:
        """Each QoS 1 message is one event with its topic and JSON body, keyed by its id field."""
        await publish(topic, 1, 2, 3)
        run = await harness.run(watcher_of(topic), assets=ASSET, max_events=3, watcher_name=name)
        assert numbers(run.payloads) == [1, 2, 3]
        assert run.payloads[0]["topic"] == topic
        assert run.payloads[0]["qos"] == 1
        assert [e.dedup_key for e in run.events] == [
            f"{name}:mqtt:{topic}:i-{n}" for n in (1, 2, 3)
        ]

    async def test_messages_published_while_it_is_down_come_on_the_next_start(
        self, topic: str, name: str, harness: WatcherHarness
    ) -> None:
        """The broker keeps the session: a restarted watcher gets what was published meanwhile."""
        await publish(topic, 1, 2)
        watcher = watcher_of(topic)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=name)
        await publish(topic, 3, 4)
        second = await harness.restart(watcher, assets=ASSET, max_events=2, watcher_name=name)
        assert numbers(first.payloads) == [1, 2]
        assert numbers(second.all_payloads) == [1, 2, 3, 4]

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_is_resent_and_nothing_is_repeated(
        self, topic: str, name: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed at any point of its third message, the watcher had not acknowledged it: the
        broker resends it, and each message is committed exactly once."""
        await publish(topic, 1, 2, 3, 4, 5)
        after, logs = await crash_then_restart(
            harness, watcher_of(topic), point, asset=ASSET, watcher_name=name
        )
        assert numbers(after.all_payloads) == [1, 2, 3, 4, 5]
        if point == "after_commit":
            suppressed = [e["dedup_key"] for e in logs if e["event"] == "event_deduplicated"]
            assert f"{name}:mqtt:{topic}:i-3" in suppressed

    async def test_a_user_property_can_be_the_identity(
        self, topic: str, name: str, harness: WatcherHarness
    ) -> None:
        """With dedup_property, the MQTT 5 user property names the message; repeats are one."""
        body = b'{"n": 7}'
        messages: list[tuple[bytes, dict[str, str] | None]] = [
            (body, {"msg-id": "a"}),
            (body, {"msg-id": "a"}),
            (body, {"msg-id": "b"}),
        ]
        await anyio.to_thread.run_sync(_publish, topic, messages)
        run = await harness.run(
            watcher_of(topic, dedup_field=None, dedup_property="msg-id"),
            assets=ASSET,
            max_events=2,
            watcher_name=name,
        )
        assert [e.dedup_key for e in run.events] == [
            f"{name}:mqtt:{topic}:a",
            f"{name}:mqtt:{topic}:b",
        ]
        assert run.payloads[0]["user_properties"] == {"msg-id": "a"}


class TestMqttWatcherMissingId:
    async def test_hash_makes_identical_messages_one_event(
        self, topic: str, name: str, harness: WatcherHarness
    ) -> None:
        """Without an id, equal bytes on one topic are one event (the documented trade-off)."""
        await publish(topic, 1, 1, 2, with_id=False)
        run = await harness.run(watcher_of(topic), assets=ASSET, max_events=2, watcher_name=name)
        assert numbers(run.payloads) == [1, 2]

    async def test_emit_keeps_every_message_without_a_key(
        self, topic: str, name: str, harness: WatcherHarness
    ) -> None:
        """missing_id="emit": messages without an id are events without a dedup_key."""
        await publish(topic, 1, 1, with_id=False)
        run = await harness.run(
            watcher_of(topic, missing_id="emit"), assets=ASSET, max_events=2, watcher_name=name
        )
        assert numbers(run.payloads) == [1, 1]
        assert [e.dedup_key for e in run.events] == [None, None]


class TestMqttWatcherTrouble:
    async def test_a_dropped_connection_is_survived_without_loss_or_repeat(
        self, topic: str, name: str, harness: WatcherHarness
    ) -> None:
        """The link to the broker is cut after two events: paho reconnects to the session,
        and every message is one event."""
        await publish(topic, 1, 2)
        async with open_proxy(MQTT_PORT) as proxy:

            async def cut_then_publish() -> None:
                await proxy.drop()
                await publish(topic, 3, 4)

            watcher = watcher_of(topic, f"mqtt://127.0.0.1:{proxy.port}")
            run = await run_through_a_break(
                harness, watcher, cut_then_publish, asset=ASSET, watcher_name=name
            )
            assert proxy.accepted >= 2  # it did reconnect
        assert numbers(run.all_payloads) == [1, 2, 3, 4]

    async def test_an_unreachable_broker_raises_without_the_password(
        self, name: str, harness: WatcherHarness
    ) -> None:
        """No connection within connect_timeout ends run() with BrokerSourceError, no password."""
        watcher = MqttWatcher("t/#", "mqtt://user:pa55word@127.0.0.1:1", connect_timeout=0.5)
        with pytest.raises(BrokerSourceError) as caught:
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=name)
        assert "pa55word" not in str(caught.value)
        assert "no connection within 0.5 s" in str(caught.value)


class TestBatches:
    @pytest.mark.parametrize("point", ["before_commit", "after_commit"])
    async def test_a_crash_inside_a_batch_loses_and_repeats_nothing(
        self, topic: str, name: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed inside a batch (before its commit, after its commit and before the acks),
        the restarted watcher commits each message exactly once: a batch committed but never
        acknowledged comes again and each of its messages is suppressed by its dedup_key."""
        await publish(topic, 1, 2, 3, 4, 5)
        crashed, after, suppressed = await crash_in_a_batch(
            harness,
            watcher_of(topic, batch_size=100, batch_linger=0.2),
            point,
            lambda: publish(topic, 6, 7),
            asset=ASSET,
            watcher_name=name,
            total=7,
        )
        assert numbers(after.all_payloads) == list(range(1, 8))
        if point == "after_commit":
            assert len(crashed.all_events) == 5  # one batch, one commit
            assert suppressed == 5
