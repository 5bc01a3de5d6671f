"""SqsWatcher against a real SQS endpoint: ``moto_server`` on a free port of 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import structlog
from aiobotocore.session import get_session
from watchkeeper.store import Asset, BaseStateBackend
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, SqsWatcher

from tests.support.aws import AWS_ENV
from tests.support.brokers import crash_then_restart, numbers, unique

ASSET = Asset("events")
NAME = "sqs_feed"
MESSAGE_ID = f"{NAME}.message_id"
FAST: dict[str, Any] = {"wait_time": 1, "visibility_timeout": 1, "call_timeout": 5.0}

Client = Any
"""An aiobotocore SQS client (aiobotocore ships no types)."""


@pytest.fixture
async def sqs(moto_endpoint: str) -> AsyncIterator[Client]:
    async with get_session().create_client(
        "sqs", region_name="us-east-1", endpoint_url=moto_endpoint
    ) as client:
        yield client


@pytest.fixture
def make_queue(sqs: Client) -> Callable[..., Any]:
    async def make(fifo: bool = False) -> str:
        name = unique("wk-test-") + (".fifo" if fifo else "")
        attributes = {"FifoQueue": "true"} if fifo else {}
        answer = await sqs.create_queue(QueueName=name, Attributes=attributes)
        return str(answer["QueueUrl"])

    return make


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    return WatcherHarness(state, watermark_key=MESSAGE_ID)


async def send(sqs: Client, queue: str, *ns: int, group: str | None = None) -> list[str]:
    ids = []
    for n in ns:
        extra = {} if group is None else {"MessageGroupId": group, "MessageDeduplicationId": str(n)}
        answer = await sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"n": n}), **extra)
        ids.append(str(answer["MessageId"]))
    return ids


async def in_queue(sqs: Client, queue: str) -> tuple[int, int]:
    """(visible, in flight) messages of ``queue``."""
    answer = await sqs.get_queue_attributes(
        QueueUrl=queue,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )
    attributes = answer["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


async def until(condition: Callable[[tuple[int, int]], bool], sqs: Client, queue: str) -> None:
    """Poll the queue's counts (an SQS queue has no change notification) until ``condition``."""
    while True:
        if condition(await in_queue(sqs, queue)):
            return
        await anyio.sleep(0.1)


class TestSqsWatcherFlow:
    async def test_batches_commit_in_order_and_are_deleted_after_the_commit(
        self,
        sqs: Client,
        make_queue: Callable[..., Any],
        moto_endpoint: str,
        harness: WatcherHarness,
    ) -> None:
        """15 messages come as batches of at most 10, in order, keyed by MessageId; each batch
        is deleted from the queue once it committed."""
        queue = await make_queue()
        ids = await send(sqs, queue, *range(1, 16))
        watcher = SqsWatcher(queue, endpoint_url=moto_endpoint, **FAST)
        run = await harness.run(watcher, assets=ASSET, idle=2, watcher_name=NAME)
        assert numbers(run.payloads) == list(range(1, 16))
        name = queue.rsplit("/", 1)[-1]
        assert [e.dedup_key for e in run.events] == [f"{NAME}:sqs:{name}:{i}" for i in ids]
        assert run.payloads[0]["message_id"] == ids[0]
        assert run.payloads[0]["receive_count"] == 1
        assert run.payloads[0]["queue"] == name
        assert run.watermark == ids[-1]
        assert await in_queue(sqs, queue) == (0, 0)

    async def test_a_batch_committed_but_not_deleted_is_suppressed_when_redelivered(
        self,
        sqs: Client,
        make_queue: Callable[..., Any],
        moto_endpoint: str,
        harness: WatcherHarness,
    ) -> None:
        """A run killed after its batch committed leaves the messages in the queue; once their
        visibility timeout passed they come back and write nothing: one event each."""
        queue = await make_queue()
        ids = await send(sqs, queue, 1, 2, 3)
        watcher = SqsWatcher(queue, endpoint_url=moto_endpoint, **FAST)
        crashed = await harness.crash(
            watcher, assets=ASSET, at="after_commit", event=1, watcher_name=NAME
        )
        assert numbers(crashed.payloads) == [1, 2, 3]
        assert sum(await in_queue(sqs, queue)) == 3  # committed, not deleted
        with anyio.fail_after(10):
            await until(lambda counts: counts[0] == 3, sqs, queue)  # visible again after 1 s

        async def send_once_the_redelivery_is_deleted() -> None:
            await until(lambda counts: counts == (0, 0), sqs, queue)
            await send(sqs, queue, 4)

        with structlog.testing.capture_logs() as logs, anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(send_once_the_redelivery_is_deleted)
                after = await harness.restart(
                    watcher, assets=ASSET, max_events=1, watcher_name=NAME
                )
        assert numbers(after.payloads) == [4]
        assert numbers(after.all_payloads) == [1, 2, 3, 4]
        suppressed = [e["count"] for e in logs if e["event"] == "batch_deduplicated"]
        assert suppressed == [3]
        assert len(ids) == 3

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_loses_and_repeats_nothing(
        self,
        sqs: Client,
        make_queue: Callable[..., Any],
        moto_endpoint: str,
        harness: WatcherHarness,
        point: CrashPoint,
    ) -> None:
        """Killed at any point of its second batch, the restarted watcher commits each of
        five messages exactly once: a FIFO queue holds back the rest of the group until the
        batch in flight comes back (after its visibility timeout), so the restarted run sees
        the redelivery before it stops."""
        queue = await make_queue(fifo=True)
        await send(sqs, queue, 1, 2, 3, 4, 5, group="g")
        after, _ = await crash_then_restart(
            harness,
            SqsWatcher(queue, endpoint_url=moto_endpoint, batch_size=2, **FAST),
            point,
            asset=ASSET,
            watcher_name=NAME,
            at=2,
        )
        # Not in order: moto hands a redelivered batch's later messages out before its first.
        assert sorted(numbers(after.all_payloads)) == [1, 2, 3, 4, 5]
        assert len(after.all_payloads) == 5

    async def test_a_fifo_queue_keeps_its_order_and_its_deduplication(
        self,
        sqs: Client,
        make_queue: Callable[..., Any],
        moto_endpoint: str,
        harness: WatcherHarness,
    ) -> None:
        """A FIFO queue's messages commit in send order with their group and sequence number;
        a producer's retry with the same deduplication id is one event."""
        queue = await make_queue(fifo=True)
        await send(sqs, queue, *range(1, 26), group="g")
        await send(sqs, queue, 7, group="g")  # a retry: SQS drops it
        watcher = SqsWatcher(queue, endpoint_url=moto_endpoint, **FAST)
        run = await harness.run(watcher, assets=ASSET, idle=2, watcher_name=NAME)
        assert numbers(run.payloads) == list(range(1, 26))
        assert {p["group_id"] for p in run.payloads} == {"g"}
        # (moto draws FIFO sequence numbers at random, so only their presence is checked)
        assert all(p["sequence_number"] for p in run.payloads)
        assert await in_queue(sqs, queue) == (0, 0)


class TestSqsWatcherErrors:
    async def test_a_missing_queue_raises_a_broker_error(
        self, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        """A queue that does not exist ends run() at once with BrokerSourceError naming it."""
        url = f"{moto_endpoint}/123456789012/{unique('wk-missing-')}"
        watcher = SqsWatcher(url, endpoint_url=moto_endpoint, **FAST)
        with pytest.raises(BrokerSourceError, match="wk-missing-"):
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)

    async def test_an_unreachable_endpoint_backs_off_with_the_reason_then_raises(
        self, moto_endpoint: str
    ) -> None:
        """While the endpoint does not answer, the watcher reports why (backing off), then
        gives up after reconnect_attempts; the secret key shows nowhere."""
        dead = "http://127.0.0.1:1"
        watcher = SqsWatcher(
            f"{dead}/123456789012/q", endpoint_url=dead, reconnect_attempts=2, **FAST
        )
        reports: list[str | None] = []
        watcher.bind_source_status(reports.append)
        watcher.bind_watcher_name(NAME)
        with pytest.raises(BrokerSourceError, match="3 failures in a row") as caught:
            with anyio.fail_after(60):
                async for _ in watcher.run():
                    pass
        assert len(reports) == 2
        assert all(r is not None and "127.0.0.1:1" in r and "retrying" in r for r in reports)
        secret = AWS_ENV["AWS_SECRET_ACCESS_KEY"]
        assert secret not in str(caught.value)
        assert all(secret not in str(r) for r in reports)
        assert secret not in repr(watcher)

    def test_bad_parameters_are_refused_by_name(self) -> None:
        with pytest.raises(ValueError, match="batch_size"):
            SqsWatcher("https://sqs.eu-west-1.amazonaws.com/1/q", batch_size=11)
        with pytest.raises(ValueError, match="wait_time"):
            SqsWatcher("https://sqs.eu-west-1.amazonaws.com/1/q", wait_time=21)
        with pytest.raises(TypeError):
            SqsWatcher("https://sqs.eu-west-1.amazonaws.com/1/q", "eu-west-1")

    def test_the_region_comes_from_the_queue_url(self) -> None:
        watcher = SqsWatcher("https://sqs.eu-west-1.amazonaws.com/1/q")
        assert watcher._region() == "eu-west-1"
        assert SqsWatcher("https://example.test/1/q", region="ap-south-1")._region() == "ap-south-1"
