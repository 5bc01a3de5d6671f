"""kill -9 of a real ``watchkeeper triggerer`` listing an S3 prefix: each object exactly once.

A daemon runs ``S3PrefixWatcher`` on a bucket of ``moto_server`` (its pages small, so a life
commits many batches) while 600 objects with distinct keys are put, each group of 50 in a
shuffled order and several at a time, so objects also land behind the watermark (inside the
lag window), and is SIGKILLed at least 5 times at random points (see ``_broker_chaos.py``).
The events committed are then read with plain ``sqlite3`` and their keys compared with the
keys put: none may be missing and none may be there twice.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import uuid
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from tests.chaos._broker_chaos import ASSET, BrokerChaos, BrokerPlan, BrokerResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
PLAN = BrokerPlan(items=600, kills=5, seed=SEED, round_timeout=180.0, settle=30.0, window=100)
"""moto_server answers one call at a time, tens of puts per second on a loaded machine: a
few hundred objects, and patience before a round counts as stalled. At most 100 objects are
put ahead of the events committed, so puts and listings interleave and objects land behind
the watermark."""
PREFIX = "chaos/"


def object_key(n: int) -> str:
    return f"{PREFIX}{n:06d}.json"


def committed_keys(database: Path) -> list[int]:
    """The number in the key of every event of the chaos asset, in commit order, by SQL."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        rows = connection.execute(
            "SELECT payload FROM asset_events WHERE asset_name = ? ORDER BY id", (ASSET,)
        ).fetchall()
    return [int(json.loads(payload)["key"][len(PREFIX) : -len(".json")]) for (payload,) in rows]


class S3Chaos(BrokerChaos):
    """The broker kill test's lives and kills, with the objects' keys as their numbers, and
    the objects the lag window caught late in place of the redeliveries suppressed."""

    async def _result(self) -> BrokerResult:
        numbers = await anyio.to_thread.run_sync(committed_keys, self.database)
        return BrokerResult(self.broker, self.plan.items, self.kills, numbers, late(numbers))


def late(numbers: list[int]) -> int:
    """How many objects committed after one with a greater key: those the lag window caught."""
    greatest, count = 0, 0
    for n in numbers:
        if n < greatest:
            count += 1
        greatest = max(greatest, n)
    return count


class TestS3KillNine:
    async def test_s3_prefix_commits_every_object_once(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], moto_endpoint: str
    ) -> None:
        """After 5+ SIGKILLs, the S3 watcher committed each of 600 objects once, though
        objects were put out of key order."""
        from aiobotocore.session import get_session

        shuffle = random.Random(SEED)
        async with get_session().create_client(
            "s3", region_name="us-east-1", endpoint_url=moto_endpoint
        ) as s3:
            bucket = f"wk-chaos-{uuid.uuid4().hex[:10]}"
            await s3.create_bucket(Bucket=bucket)

            async def publish(numbers: list[int]) -> None:
                order = list(numbers)
                shuffle.shuffle(order)
                for start in range(0, len(order), 5):
                    async with anyio.create_task_group() as tg:
                        for n in order[start : start + 5]:
                            body = json.dumps({"n": n}).encode()
                            tg.start_soon(
                                lambda key, data: s3.put_object(Bucket=bucket, Key=key, Body=data),
                                object_key(n),
                                body,
                            )

            watcher = (
                f"S3PrefixWatcher({bucket!r}, {PREFIX!r}, endpoint_url={moto_endpoint!r}, "
                "page_size=20, poll_interval=0.2, lag_window=60)"
            )
            name = f"chaos_{uuid.uuid4().hex[:10]}"
            chaos = S3Chaos("s3", watcher, publish, tmp_path, PLAN, watcher_name=name)
            result = await chaos.run()
        with capsys.disabled():
            print(f"\n{result.summary()} (redelivered: objects caught late) seed={SEED}")
        assert result.kills >= PLAN.kills
        assert (result.lost, result.duplicated) == (0, 0)
        assert sorted(result.numbers) == list(range(1, PLAN.items + 1))
