"""kill -9 of a real ``watchkeeper triggerer`` reading Kafka: each record exactly once.

A daemon runs ``KafkaWatcher`` on a three-partition topic of a Tansu broker (the Kafka
protocol, in memory, started for this test) while 5,000 records with distinct ids are
produced with ``acks="all"``, and is SIGKILLed at least 10 times at random points (see
``_broker_chaos.py``). The events committed are then read with plain ``sqlite3`` and compared
with the ids produced: none may be missing and none may be there twice. The offsets commit
with each batch of events, so a killed daemon's successor seeks to where the last committed
batch ended.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from pathlib import Path

import pytest

from tests.chaos._broker_chaos import BrokerChaos, BrokerPlan
from tests.support.kafka import create_topic, tansu_broker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
# A life that commits nothing for ``settle`` seconds is ended (and counted as a kill): the
# daemon's own start (interpreter, imports, the watchers file read in a child) must fit in it
# on a machine shared with other test runs.
PLAN = BrokerPlan(items=5_000, kills=10, seed=SEED, settle=30.0, round_timeout=90.0)
PARTITIONS = 3


def body(n: int) -> bytes:
    return json.dumps({"id": f"c-{n}", "n": n}).encode()


class TestKafkaKillNine:
    async def test_kafka_commits_every_record_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """After 10+ SIGKILLs, the Kafka watcher committed each of 5,000 records once."""
        from aiokafka import AIOKafkaProducer

        async with tansu_broker() as bootstrap:
            topic = f"wk-chaos-{uuid.uuid4().hex[:10]}"
            await create_topic(bootstrap, topic, partitions=PARTITIONS)
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
            await producer.start()
            try:

                async def publish(numbers: list[int]) -> None:
                    sent = [
                        await producer.send(topic, body(n), partition=n % PARTITIONS)
                        for n in numbers
                    ]
                    for future in sent:
                        await future

                watcher = (
                    f"KafkaWatcher({topic!r}, {bootstrap!r}, batch_size=100, poll_timeout=0.2)"
                )
                name = f"chaos_{uuid.uuid4().hex[:10]}"
                chaos = BrokerChaos("kafka", watcher, publish, tmp_path, PLAN, watcher_name=name)
                result = await chaos.run()
            finally:
                await producer.stop()
        with capsys.disabled():
            print(f"\n{result.summary()} seed={SEED}")
        assert result.kills >= 10
        assert result.items >= 5_000
        assert (result.lost, result.duplicated) == (0, 0)
        assert sorted(result.numbers) == list(range(1, result.items + 1))
