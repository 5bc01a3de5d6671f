"""PubSubWatcher against a real Pub/Sub endpoint: Google's emulator on a free port of 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
import pytest
import structlog
from watchkeeper.store import Asset, BaseStateBackend
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent, TriggerEventBatch
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, PubSubWatcher

from tests.conftest import EVENT_LOOPS
from tests.support.brokers import Observed, crash_in_a_batch, numbers, suppressed_count
from tests.support.proxy import open_proxy
from tests.support.pubsub import make_subscription, publish, subscriber

ASSET = Asset("events")
NAME = "pubsub_feed"
MESSAGE_ID = f"{NAME}.message_id"


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    return WatcherHarness(state, watermark_key=MESSAGE_ID)


def bodies(*ns: int) -> list[bytes]:
    return [json.dumps({"n": n}).encode() for n in ns]


async def left_over(host: str, subscription: str, wait: float = 2.0) -> list[str]:
    """The ids of the messages the subscription hands out to another puller within ``wait``
    seconds (given back at once, so the watcher may still take them)."""
    from google.api_core.exceptions import DeadlineExceeded

    async with subscriber(host) as client:
        try:
            answer = await client.pull(
                subscription=subscription, max_messages=100, timeout=wait, retry=None
            )
        except DeadlineExceeded:
            return []
        received = list(answer.received_messages)
        if received:
            await client.modify_ack_deadline(
                subscription=subscription,
                ack_ids=[m.ack_id for m in received],
                ack_deadline_seconds=0,
            )
    return [m.message.message_id for m in received]


async def publish_only(host: str, topic: str, data: list[bytes]) -> None:
    await publish(host, topic, data)


class Batches(BaseEventTrigger):
    """Runs ``inner`` and records the size of each batch it yields."""

    def __init__(self, inner: BaseEventTrigger, sizes: list[int]) -> None:
        super().__init__()
        self.inner = inner
        self.sizes = sizes

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.inner.serialize()

    async def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        self.inner.bind_asset_state_store(self.asset_state_store)
        self.inner.bind_watcher_name(self.watcher_name)
        events = self.inner.run()
        assert isinstance(events, AsyncGenerator)
        async with contextlib.aclosing(events):
            async for item in events:
                self.sizes.append(len(item) if isinstance(item, TriggerEventBatch) else 1)
                yield item

    async def cleanup(self) -> None:
        await self.inner.cleanup()


class TestPubSubWatcherFlow:
    @pytest.mark.parametrize("anyio_backend", EVENT_LOOPS)
    async def test_batches_commit_in_order_with_attributes_and_are_acknowledged(
        self, pubsub_host: str, harness: WatcherHarness
    ) -> None:
        """25 messages of one ordering key come as batches of at most 10, in publish order,
        keyed by message id, with their attributes and ordering key; each batch is
        acknowledged once it committed, so nothing is left in the subscription (on asyncio's
        loop and on uvloop)."""
        topic, subscription = await make_subscription(pubsub_host, ordering=True)
        ids = await publish(
            pubsub_host, topic, bodies(*range(1, 26)), ordering_key="k1", attributes={"a": "b"}
        )
        sizes: list[int] = []
        watcher = PubSubWatcher(subscription, emulator_host=pubsub_host, batch_size=10)
        run = await harness.run(Batches(watcher, sizes), assets=ASSET, idle=2, watcher_name=NAME)
        assert numbers(run.payloads) == list(range(1, 26))
        assert sum(sizes) == 25 and max(sizes) <= 10 and len(sizes) >= 3
        assert [e.dedup_key for e in run.events] == [
            f"{NAME}:pubsub:{subscription}:{i}" for i in ids
        ]
        first = run.payloads[0]
        assert first["subscription"] == subscription
        assert first["message_id"] == ids[0]
        assert first["ordering_key"] == "k1"
        assert first["attributes"] == {"a": "b"}
        assert first["delivery_attempt"] is None
        assert first["published"].startswith("20")
        assert run.watermark == ids[-1]
        assert await left_over(pubsub_host, subscription) == []

    async def test_a_batch_committed_but_not_acknowledged_is_suppressed_when_redelivered(
        self, pubsub_host: str, harness: WatcherHarness
    ) -> None:
        """Killed after its batch committed and before the acknowledgement, the watcher gives
        the messages back; they come again to the restarted run and write nothing."""
        topic, subscription = await make_subscription(pubsub_host)
        await publish(pubsub_host, topic, bodies(1, 2, 3))
        watcher = PubSubWatcher(subscription, emulator_host=pubsub_host)
        crashed, after, suppressed = await crash_in_a_batch(
            harness,
            watcher,
            "after_commit",
            lambda: publish_only(pubsub_host, topic, bodies(4)),
            asset=ASSET,
            watcher_name=NAME,
            total=4,
        )
        assert numbers(crashed.all_payloads) == [1, 2, 3]
        assert numbers(after.payloads) == [4]
        assert numbers(after.all_payloads) == [1, 2, 3, 4]
        assert suppressed == 3

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_loses_and_repeats_nothing(
        self, pubsub_host: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed at any point of its first batch, the restarted watcher commits each of
        seven messages exactly once."""
        topic, subscription = await make_subscription(pubsub_host)
        await publish(pubsub_host, topic, bodies(1, 2, 3, 4, 5))
        watcher = PubSubWatcher(subscription, emulator_host=pubsub_host, batch_size=2)
        _, after, _ = await crash_in_a_batch(
            harness,
            watcher,
            point,
            lambda: publish_only(pubsub_host, topic, bodies(6, 7)),
            asset=ASSET,
            watcher_name=NAME,
            total=7,
        )
        assert sorted(numbers(after.all_payloads)) == list(range(1, 8))
        assert len(after.all_payloads) == 7

    async def test_a_stopped_watcher_gives_back_what_it_holds_at_once(
        self, pubsub_host: str, harness: WatcherHarness
    ) -> None:
        """Stopped after its first batch of two, the watcher gives back (ack deadline 0) the
        messages it held: a restart gets them well within their 600 s lease, and the
        given-back first batch, already committed, is suppressed."""
        topic, subscription = await make_subscription(pubsub_host, ack_deadline=600)
        await publish(pubsub_host, topic, bodies(1, 2, 3, 4, 5))
        watcher = PubSubWatcher(
            subscription, emulator_host=pubsub_host, batch_size=2, ack_deadline=600
        )
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert numbers(first.payloads) == [1, 2]
        with structlog.testing.capture_logs() as logs:
            after = await harness.restart(
                watcher, assets=ASSET, max_events=3, timeout=20, watcher_name=NAME
            )
        assert after.stopped == "max_events"
        assert sorted(numbers(after.all_payloads)) == [1, 2, 3, 4, 5]
        assert suppressed_count(logs) <= 2

    async def test_the_lease_is_extended_while_a_batch_is_in_flight(
        self, pubsub_host: str, harness: WatcherHarness
    ) -> None:
        """A batch held after its commit for longer than its 10 s lease is not handed out
        again (another puller gets nothing, the watcher sees no redelivery): the watcher
        extends the leases of what it holds."""
        topic, subscription = await make_subscription(pubsub_host, ack_deadline=10)
        await publish(pubsub_host, topic, bodies(1, 2, 3))
        watcher = PubSubWatcher(subscription, emulator_host=pubsub_host, ack_deadline=10)
        committed, release = anyio.Event(), anyio.Event()
        stolen: list[str] = []

        async def hold_past_the_lease() -> None:
            await committed.wait()
            await anyio.sleep(13)
            stolen.extend(await left_over(pubsub_host, subscription, wait=2))
            release.set()
            await publish(pubsub_host, topic, bodies(4))

        with structlog.testing.capture_logs() as logs, anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(hold_past_the_lease)
                run = await harness.run(
                    Observed(watcher, {1: committed}, {1: release}),
                    assets=ASSET,
                    max_events=4,
                    timeout=50,
                    watcher_name=NAME,
                )
        assert stolen == []
        assert numbers(run.payloads) == [1, 2, 3, 4]
        assert suppressed_count(logs) == 0
        assert any(e["event"] == "pubsub_leases_extended" for e in logs)


class TestPubSubWatcherTrouble:
    async def test_cleanup_stops_the_lease_keeper_of_an_abandoned_run(
        self, pubsub_host: str
    ) -> None:
        """A run abandoned at its yield (never finalized) leaves its lease keeper's thread
        running; cleanup() stops it and closes the clients."""
        topic, subscription = await make_subscription(pubsub_host)
        await publish(pubsub_host, topic, bodies(1))
        watcher = PubSubWatcher(subscription, emulator_host=pubsub_host)
        watcher.bind_watcher_name(NAME)
        events = watcher.run()
        assert isinstance(events, AsyncGenerator)
        with anyio.fail_after(30):
            batch = await events.__anext__()
        assert isinstance(batch, TriggerEventBatch) and len(batch) == 1
        assert any(t.name == "pubsub-leases" for t in threading.enumerate())
        await watcher.cleanup()
        assert not any(t.name == "pubsub-leases" for t in threading.enumerate())
        with anyio.move_on_after(10, shield=True):
            await events.aclose()

    async def test_an_unreachable_service_backs_off_with_the_reason_then_recovers(
        self, pubsub_host: str
    ) -> None:
        """While the emulator cannot be reached the watcher says why (backing off, retrying);
        once it can, the status clears and the messages come."""
        topic, subscription = await make_subscription(pubsub_host)
        await publish(pubsub_host, topic, bodies(1, 2))
        port = int(pubsub_host.rsplit(":", 1)[1])
        reports: list[str | None] = []
        twice = anyio.Event()

        def report(trouble: str | None) -> None:
            reports.append(trouble)
            if len(reports) >= 2:
                twice.set()

        async with open_proxy(port) as proxy:
            proxy.refuse()
            watcher = PubSubWatcher(subscription, emulator_host=proxy.dsn_host, call_timeout=5.0)
            watcher.bind_source_status(report)
            watcher.bind_watcher_name(NAME)

            async def reopen_after_two_reports() -> None:
                await twice.wait()
                proxy.accept()

            received: list[Any] = []
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(reopen_after_two_reports)
                    events = watcher.run()
                    assert isinstance(events, AsyncGenerator)
                    async with contextlib.aclosing(events):
                        async for batch in events:
                            assert isinstance(batch, TriggerEventBatch)
                            received.extend(event.payload for event in batch.events)
                            if len(received) >= 2:
                                break
        assert numbers(received) == [1, 2]
        troubles = [r for r in reports if r is not None]
        assert len(troubles) >= 2
        assert all("retrying" in r and proxy.dsn_host in r for r in troubles)
        assert reports[-1] is None  # running again

    async def test_a_dropped_connection_is_survived_without_loss_or_repeat(
        self, pubsub_host: str, harness: WatcherHarness
    ) -> None:
        """The link to the emulator is cut after two events: the watcher reconnects
        and goes on in the same run, emitting each message once."""
        topic, subscription = await make_subscription(pubsub_host)
        await publish(pubsub_host, topic, bodies(1, 2))
        port = int(pubsub_host.rsplit(":", 1)[1])
        async with open_proxy(port) as proxy:
            reached = anyio.Event()

            async def cut_then_publish() -> None:
                await reached.wait()
                await proxy.drop()
                await publish(pubsub_host, topic, bodies(3, 4))

            watcher = PubSubWatcher(
                subscription, emulator_host=proxy.dsn_host, batch_size=1, ack_deadline=10
            )
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(cut_then_publish)
                    run = await harness.run(
                        Observed(watcher, {2: reached}),
                        assets=ASSET,
                        max_events=4,
                        timeout=50,
                        watcher_name=NAME,
                    )
            assert proxy.accepted >= 2  # it did reconnect
        assert sorted(numbers(run.all_payloads)) == [1, 2, 3, 4]
        assert len(run.all_payloads) == 4

    async def test_an_unreachable_service_raises_after_the_attempts(self) -> None:
        """A service that never answers ends run() with BrokerSourceError after
        reconnect_attempts reports, each with the reason."""
        watcher = PubSubWatcher(
            "projects/p/subscriptions/s",
            emulator_host="127.0.0.1:1",
            reconnect_attempts=2,
            call_timeout=5.0,
        )
        reports: list[str | None] = []
        watcher.bind_source_status(reports.append)
        watcher.bind_watcher_name(NAME)
        with pytest.raises(BrokerSourceError, match="3 failures in a row"):
            with anyio.fail_after(60):
                async for _ in watcher.run():
                    pass
        assert len(reports) == 2
        assert all(r is not None and "127.0.0.1:1" in r and "retrying" in r for r in reports)

    async def test_a_missing_subscription_raises_a_broker_error(
        self, pubsub_host: str, harness: WatcherHarness
    ) -> None:
        """A subscription that does not exist ends run() at once, naming it."""
        watcher = PubSubWatcher(
            "projects/wk-test/subscriptions/wk-missing", emulator_host=pubsub_host
        )
        with pytest.raises(BrokerSourceError, match="wk-missing") as caught:
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert "NotFound" in str(caught.value)

    def test_bad_parameters_are_refused_by_name(self) -> None:
        good = "projects/p/subscriptions/s"
        with pytest.raises(ValueError, match="subscription must be projects/"):
            PubSubWatcher("my-subscription")
        with pytest.raises(ValueError, match="batch_size"):
            PubSubWatcher(good, batch_size=1001)
        with pytest.raises(ValueError, match="ack_deadline"):
            PubSubWatcher(good, ack_deadline=5)
        with pytest.raises(ValueError, match="emulator_host must be host:port"):
            PubSubWatcher(good, emulator_host="http://localhost:8085")
        with pytest.raises(ValueError, match="not both"):
            PubSubWatcher(good, emulator_host="localhost:8085", endpoint="x.example:443")
        with pytest.raises(TypeError, match="batch_size must be an int"):
            PubSubWatcher(good, batch_size="10")
        with pytest.raises(TypeError):
            PubSubWatcher(good, "localhost:8085")

    def test_it_serializes_its_parameters_and_shows_no_credentials(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.secret-token")
        watcher = PubSubWatcher("projects/p/subscriptions/s", batch_size=5)
        classpath, kwargs = watcher.serialize()
        assert classpath == "watchkeeper.watchers.pubsub.PubSubWatcher"
        assert kwargs["subscription"] == "projects/p/subscriptions/s"
        assert kwargs["batch_size"] == 5
        assert "ya29" not in repr(watcher) and "ya29" not in json.dumps(kwargs)
