"""KafkaWatcher against a real Kafka-protocol broker (Tansu, started per test)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import structlog
from watchkeeper.store import Asset, BaseStateBackend
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, KafkaWatcher

from tests.support.brokers import unique
from tests.support.daemons import free_port
from tests.support.kafka import create_topic, produce, tansu_broker

ASSET = Asset("events")
NAME = "kafka_feed"
OFFSETS = f"{NAME}.offsets"
FAST: dict[str, Any] = {"poll_timeout": 0.2, "request_timeout": 5.0}


@pytest.fixture
async def broker() -> AsyncIterator[str]:
    """The bootstrap address of a Tansu broker of this test's own."""
    async with tansu_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
async def topic(broker: str) -> str:
    """A topic of three partitions."""
    name = unique("wk-test-")
    await create_topic(broker, name, partitions=3)
    return name


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    return WatcherHarness(state, watermark_key=OFFSETS)


def body(n: int) -> bytes:
    return json.dumps({"n": n}).encode()


def numbers(payloads: list[Any]) -> list[int]:
    return [int(p["data"]["n"]) for p in payloads]


def by_partition(payloads: list[Any]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for p in payloads:
        found.setdefault(p["partition"], []).append(p["offset"])
    return found


class TestKafkaWatcherFlow:
    async def test_records_become_events_in_offset_order_with_next_offsets_as_state(
        self, broker: str, topic: str, harness: WatcherHarness
    ) -> None:
        """Each record is one event; per partition in offset order; state = next offsets."""
        await produce(broker, topic, [body(n) for n in range(9)], partitions=3)
        watcher = KafkaWatcher(topic, broker, **FAST)
        run = await harness.run(watcher, assets=ASSET, max_events=9, watcher_name=NAME)
        assert sorted(numbers(run.payloads)) == list(range(9))
        assert by_partition(run.payloads) == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}
        assert run.watermark == {topic: {"0": 3, "1": 3, "2": 3}}
        first = run.payloads[0]
        assert first["topic"] == topic and first["key"] is None and first["headers"] is None
        assert isinstance(first["timestamp"], int)
        assert {e.dedup_key for e in run.events} >= {f"{NAME}:{topic}:0:0", f"{NAME}:{topic}:2:2"}

    async def test_a_restart_resumes_after_the_stored_offsets(
        self, broker: str, topic: str, harness: WatcherHarness
    ) -> None:
        """A watcher rebuilt from serialize() emits only the records after its offsets."""
        await produce(broker, topic, [body(n) for n in range(6)], partitions=3)
        watcher = KafkaWatcher(topic, broker, batch_size=2, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        await produce(broker, topic, [body(n) for n in range(6, 9)], partitions=3)
        rest = 9 - len(first.payloads)
        second = await harness.restart(watcher, assets=ASSET, max_events=rest, watcher_name=NAME)
        assert sorted(numbers(second.all_payloads)) == list(range(9))
        assert not set(numbers(first.payloads)) & set(numbers(second.payloads))
        assert second.watermark == {topic: {"0": 3, "1": 3, "2": 3}}

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_loses_and_repeats_nothing(
        self, broker: str, topic: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed at any point of its second batch, the restarted watcher emits each record
        once."""
        await produce(broker, topic, [body(n) for n in range(8)], partition_of=1)
        watcher = KafkaWatcher(topic, broker, batch_size=2, **FAST)
        crashed = await harness.crash(watcher, assets=ASSET, at=point, event=2, watcher_name=NAME)
        rest = 8 - len(crashed.all_events)
        after = await harness.restart(watcher, assets=ASSET, max_events=rest, watcher_name=NAME)
        assert numbers(after.all_payloads) == list(range(8))

    async def test_latest_skips_what_was_there_before_the_first_start(
        self, broker: str, topic: str, harness: WatcherHarness
    ) -> None:
        """With start="latest" the first event is a record produced after the watcher
        started, never one of those already there."""
        await produce(broker, topic, [body(n) for n in range(3)], partition_of=0)
        watcher = KafkaWatcher([topic], [broker], start="latest", **FAST)
        async with anyio.create_task_group() as tg:

            async def keep_producing() -> None:
                n = 3
                while True:
                    await produce(broker, topic, [body(n)], partition_of=0)
                    n += 1
                    await anyio.sleep(0.1)

            tg.start_soon(keep_producing)
            run = await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
            tg.cancel_scope.cancel()
        assert min(numbers(run.payloads)) >= 3, numbers(run.payloads)
        assert [p["offset"] for p in run.payloads] == numbers(run.payloads)
        assert run.watermark == {topic: {"0": run.payloads[-1]["offset"] + 1}}

    async def test_group_id_receives_the_offsets_after_our_commit(
        self, broker: str, topic: str, harness: WatcherHarness
    ) -> None:
        """With group_id, the consumer group's committed offsets follow the watcher's."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        await produce(broker, topic, [body(n) for n in range(4)], partition_of=2)
        group = unique("wk-group-")
        watcher = KafkaWatcher(topic, broker, group_id=group, batch_size=2, **FAST)
        # The run stops once the second batch committed: the first one's group commit is
        # done by then (the watcher does it before fetching the next batch).
        await harness.run(watcher, assets=ASSET, max_events=4, watcher_name=NAME)
        reader = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group)
        await reader.start()
        try:
            assert await reader.committed(TopicPartition(topic, 2)) in (2, 4)
        finally:
            await reader.stop()

    async def test_a_missing_topic_is_an_error_naming_it(
        self, broker: str, harness: WatcherHarness
    ) -> None:
        """A topic the brokers do not have fails the run, naming the topic."""
        watcher = KafkaWatcher("no-such-topic", broker, reconnect_attempts=1, **FAST)
        with structlog.testing.capture_logs(), pytest.raises(BrokerSourceError) as caught:
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert "no-such-topic" in str(caught.value)


class TestKafkaWatcherSource:
    async def test_an_unreachable_broker_backs_off_then_fails_without_the_password(
        self, harness: WatcherHarness
    ) -> None:
        """Without a broker the watcher logs its reconnects, then raises BrokerSourceError;
        the SASL password is in neither."""
        watcher = KafkaWatcher(
            "t",
            f"127.0.0.1:{free_port()}",
            security_protocol="SASL_PLAINTEXT",
            sasl_username="me",
            sasl_password="hunter2",
            reconnect_attempts=1,
            **FAST,
        )
        assert "hunter2" not in repr(watcher)
        with structlog.testing.capture_logs() as logs, pytest.raises(BrokerSourceError) as caught:
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert [r["event"] for r in logs].count("kafka_reconnecting") == 1
        assert "hunter2" not in str(caught.value) and "hunter2" not in str(logs)
        assert "connecting" in str(caught.value)

    @pytest.mark.parametrize(
        ("kwargs", "error", "text"),
        [
            ({"topics": []}, TypeError, "topics"),
            ({"topics": ["a", "a"]}, ValueError, "twice"),
            ({"topics": "a", "bootstrap_servers": "kafka://h:1"}, ValueError, "host:port"),
            ({"topics": "a", "start": "middle"}, ValueError, "start"),
            ({"topics": "a", "sasl_username": "u"}, ValueError, "SASL_"),
            ({"topics": "a", "security_protocol": "SASL_SSL"}, ValueError, "sasl_password"),
            ({"topics": "a", "batch_size": 0}, ValueError, "batch_size"),
        ],
    )
    def test_bad_parameters_are_refused_naming_them(
        self, kwargs: dict[str, Any], error: type[Exception], text: str
    ) -> None:
        """A bad parameter raises naming it, and builds nothing."""
        with pytest.raises(error, match=text):
            KafkaWatcher(**kwargs)

    def test_serialize_round_trips(self) -> None:
        """serialize() gives the parameters back as JSON; a string topic becomes a list."""
        watcher = KafkaWatcher("a", "h:9092", group_id="g")
        classpath, kwargs = watcher.serialize()
        assert classpath == "watchkeeper.watchers.kafka.KafkaWatcher"
        assert kwargs["topics"] == ["a"] and kwargs["bootstrap_servers"] == ["h:9092"]
        assert KafkaWatcher(**json.loads(json.dumps(kwargs))) == watcher
