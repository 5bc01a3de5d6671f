"""kill -9 of a real ``watchkeeper triggerer`` reading Google Pub/Sub: each message exactly once.

A daemon runs ``PubSubWatcher`` on a subscription of the Pub/Sub emulator (started for the test
session) while 2,000 messages with distinct ids are published, and is SIGKILLed at least 5
times at random points (see ``_broker_chaos.py``). The events committed are then read with
plain ``sqlite3`` and compared with the ids published: none may be missing and none may be
there twice, though the emulator hands out again what a killed daemon had committed but not
acknowledged (its leases run out after 10 s).

A pull in flight when a daemon is killed leases its batch to the dead process: it comes back
once that lease runs out (10 s), to the next daemon.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tests.chaos._broker_chaos import BrokerChaos, BrokerPlan
from tests.support.pubsub import make_subscription, publish

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
PLAN = BrokerPlan(items=2_000, kills=5, seed=SEED, settle=30.0, round_timeout=180.0)


def body(n: int) -> bytes:
    return json.dumps({"id": f"c-{n}", "n": n}).encode()


class TestPubSubKillNine:
    async def test_pubsub_commits_every_message_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], pubsub_host: str
    ) -> None:
        """After 5+ SIGKILLs, the Pub/Sub watcher committed each of 2,000 messages once."""
        topic, subscription = await make_subscription(pubsub_host, ack_deadline=10)

        async def send(numbers: list[int]) -> None:
            await publish(pubsub_host, topic, [body(n) for n in numbers])

        watcher = f"PubSubWatcher({subscription!r}, emulator_host={pubsub_host!r}, ack_deadline=10)"
        name = f"chaos_{os.urandom(5).hex()}"
        chaos = BrokerChaos("pubsub", watcher, send, tmp_path, PLAN, watcher_name=name)
        result = await chaos.run()
        with capsys.disabled():
            print(f"\n{result.summary()} seed={SEED}")
        assert result.kills >= PLAN.kills
        assert result.items >= PLAN.items
        assert (result.lost, result.duplicated) == (0, 0)
        assert sorted(result.numbers) == list(range(1, result.items + 1))
