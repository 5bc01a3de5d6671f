"""NatsJetStreamWatcher against the real NATS server (JetStream) on 127.0.0.1:4222."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.js.client import JetStreamContext
from watchkeeper.store import Asset, BaseStateBackend
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, NatsJetStreamWatcher

from tests.support.brokers import (
    NATS_PORT,
    crash_in_a_batch,
    crash_then_restart,
    numbers,
    require_server,
    run_through_a_break,
    unique,
)
from tests.support.proxy import open_proxy

URL = f"nats://127.0.0.1:{NATS_PORT}"
ASSET = Asset("events")
NAME = "jetstream_feed"
SEQUENCE = f"{NAME}.sequence"
FAST: dict[str, Any] = {"fetch_timeout": 0.5, "ack_wait": 1.0, "batch_size": 1}
"""The per-message path (``batch_size=1``), whose steps these tests count one by one; the
batch path has its own tests (``TestBatches``)."""


@pytest.fixture
async def js() -> AsyncIterator[JetStreamContext]:
    """A JetStream context on the test server (skips, or fails in CI, when it is down)."""
    require_server("NATS", NATS_PORT)
    client = await nats.connect(URL)
    try:
        yield client.jetstream()
    finally:
        await client.close()


@pytest.fixture
async def stream(js: JetStreamContext) -> AsyncIterator[str]:
    """A stream of this test's own on the subjects ``<stream>.>``, deleted afterwards."""
    name = unique("WK_TEST_")
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        yield name
    finally:
        await js.delete_stream(name)


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    return WatcherHarness(state, watermark_key=SEQUENCE)


async def publish(js: JetStreamContext, stream: str, *numbers: int) -> None:
    for n in numbers:
        await js.publish(f"{stream}.items", json.dumps({"n": n}).encode())


class TestNatsJetStreamWatcherFlow:
    async def test_messages_become_events_keyed_by_their_stream_sequence(
        self, js: JetStreamContext, stream: str, harness: WatcherHarness
    ) -> None:
        """Each message is one event with its sequence, subject and JSON body; keyed by sequence."""
        await publish(js, stream, 1, 2, 3)
        watcher = NatsJetStreamWatcher(stream, URL, **FAST)
        run = await harness.run(watcher, assets=ASSET, max_events=3, watcher_name=NAME)
        assert numbers(run.payloads) == [1, 2, 3]
        assert [p["sequence"] for p in run.payloads] == [1, 2, 3]
        assert run.payloads[0]["subject"] == f"{stream}.items"
        assert [e.dedup_key for e in run.events] == [f"{NAME}:nats:{stream}:{n}" for n in (1, 2, 3)]
        assert run.watermark == 3

    async def test_a_restart_resumes_at_the_consumers_position(
        self, js: JetStreamContext, stream: str, harness: WatcherHarness
    ) -> None:
        """A watcher rebuilt from serialize() gets only what its durable consumer has not acked."""
        await publish(js, stream, 1, 2, 3)
        watcher = NatsJetStreamWatcher(stream, URL, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        await publish(js, stream, 4)
        second = await harness.restart(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert numbers(first.payloads) == [1, 2]
        assert numbers(second.all_payloads) == [1, 2, 3, 4]
        info = await js.consumer_info(stream, f"watchkeeper-{NAME}")
        assert info.num_pending == 0

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_is_redelivered_and_nothing_is_repeated(
        self, js: JetStreamContext, stream: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed at any point of its third message, the restarted watcher gets the unacked
        message again from the server and commits each message exactly once."""
        await publish(js, stream, 1, 2, 3, 4, 5)
        after, logs = await crash_then_restart(
            harness,
            NatsJetStreamWatcher(stream, URL, **FAST),
            point,
            asset=ASSET,
            watcher_name=NAME,
        )
        # Each once; a message redelivered after a crash may come after later ones.
        assert sorted(numbers(after.all_payloads)) == [1, 2, 3, 4, 5]
        assert len(after.all_payloads) == 5
        if point == "after_commit":
            # The third was committed but not acked: the server redelivered it, and its
            # dedup_key made it write nothing.
            suppressed = [e for e in logs if e["event"] == "event_deduplicated"]
            assert [e["dedup_key"] for e in suppressed][:1] == [f"{NAME}:nats:{stream}:3"]

    async def test_a_subject_filter_limits_the_consumer(
        self, js: JetStreamContext, stream: str, harness: WatcherHarness
    ) -> None:
        """With subject set, only the stream's messages on matching subjects become events."""
        await js.publish(f"{stream}.other", b'{"n": 0}')
        await publish(js, stream, 1)
        watcher = NatsJetStreamWatcher(stream, URL, subject=f"{stream}.items", **FAST)
        run = await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert numbers(run.payloads) == [1]


class TestNatsJetStreamWatcherTrouble:
    async def test_a_dropped_connection_is_survived_without_loss_or_repeat(
        self, js: JetStreamContext, stream: str, harness: WatcherHarness
    ) -> None:
        """The link to the server is cut after two events: nats-py reconnects and the watcher
        goes on in the same run, emitting each message once."""
        await publish(js, stream, 1, 2)
        async with open_proxy(NATS_PORT) as proxy:

            async def cut_then_publish() -> None:
                await proxy.drop()
                await publish(js, stream, 3, 4)

            watcher = NatsJetStreamWatcher(stream, f"nats://127.0.0.1:{proxy.port}", **FAST)
            run = await run_through_a_break(
                harness, watcher, cut_then_publish, asset=ASSET, watcher_name=NAME
            )
            assert proxy.accepted >= 2  # it did reconnect
        assert numbers(run.all_payloads) == [1, 2, 3, 4]

    async def test_a_missing_stream_raises_a_broker_error(
        self, js: JetStreamContext, harness: WatcherHarness
    ) -> None:
        """A stream that does not exist ends run() with BrokerSourceError naming the stream."""
        watcher = NatsJetStreamWatcher(unique("WK_MISSING_"), URL, **FAST)
        with pytest.raises(BrokerSourceError, match="WK_MISSING_"):
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)

    async def test_an_unreachable_server_raises_without_the_token(
        self, harness: WatcherHarness
    ) -> None:
        """A server that does not answer ends run() with BrokerSourceError; no secret shown."""
        watcher = NatsJetStreamWatcher("S", "nats://t0ken@127.0.0.1:1", connect_timeout=1.0, **FAST)
        with pytest.raises(BrokerSourceError) as caught:
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert "t0ken" not in str(caught.value)


class TestBatches:
    @pytest.mark.parametrize("point", ["before_commit", "after_commit"])
    async def test_a_crash_inside_a_batch_loses_and_repeats_nothing(
        self, js: JetStreamContext, stream: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed inside a batch (before its commit, after its commit and before the acks),
        the restarted watcher commits each message exactly once: a batch committed but never
        acknowledged comes again and each of its messages is suppressed by its dedup_key."""
        await publish(js, stream, 1, 2, 3, 4, 5)
        watcher = NatsJetStreamWatcher(stream, URL, fetch_timeout=0.5, ack_wait=1.0)
        crashed, after, suppressed = await crash_in_a_batch(
            harness,
            watcher,
            point,
            lambda: publish(js, stream, 6, 7),
            asset=ASSET,
            watcher_name=NAME,
            total=7,
        )
        assert sorted(numbers(after.all_payloads)) == list(range(1, 8))
        assert len(after.all_payloads) == 7
        if point == "after_commit":
            assert len(crashed.all_events) == 5  # one batch, one commit
            assert suppressed == 5
