"""RedisStreamWatcher against the real Redis server on 127.0.0.1:6379."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
import structlog
from watchkeeper.store import Asset, BaseStateBackend
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, RedisStreamWatcher
from watchkeeper.watchers.redis_stream import parse_id

from tests.support.brokers import (
    REDIS_PORT,
    crash_in_a_batch,
    crash_then_restart,
    require_server,
    run_through_a_break,
    unique,
)

URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
ASSET = Asset("events")
NAME = "stream_feed"
WATERMARK = f"{NAME}.watermark"
FAST: dict[str, Any] = {"block": 0.2, "batch_size": 1}
"""The per-message path (``batch_size=1``), whose steps these tests count one by one; the
batch path has its own tests (``TestBatches``)."""


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    """A client of the test server (skips, or fails in CI, when it is down)."""
    require_server("Redis", REDIS_PORT)
    client = aioredis.Redis.from_url(URL)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def stream(redis: aioredis.Redis) -> AsyncIterator[str]:
    """A stream name of this test's own, deleted afterwards."""
    name = unique("wk-test-")
    try:
        yield name
    finally:
        await redis.delete(name)


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    return WatcherHarness(state, watermark_key=WATERMARK)


async def add(redis: aioredis.Redis, stream: str, *numbers: int) -> list[str]:
    """Append one entry ``{"n": n}`` per number; return their ids."""
    ids = []
    for n in numbers:
        entry_id = await redis.xadd(stream, {"n": str(n)})
        ids.append(entry_id.decode() if isinstance(entry_id, bytes) else entry_id)
    return ids


async def wait_blocked(redis: aioredis.Redis, name: str = NAME) -> None:
    """Return once the watcher's connection is waiting in a blocking XREAD (its position is
    taken); CLIENT LIST shows the command each connection runs."""
    with anyio.fail_after(10):
        while True:
            for client in await redis.client_list():
                if client.get("name") == f"watchkeeper:{name}" and client.get("cmd") == "xread":
                    return
            await anyio.sleep(0.02)


def numbers(payloads: list[Any]) -> list[int]:
    return [int(p["fields"]["n"]) for p in payloads]


class TestRedisStreamWatcherFlow:
    async def test_entries_become_events_in_order_with_the_last_id_as_watermark(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """Each entry is one event carrying its id and fields; the watermark is the last id."""
        ids = await add(redis, stream, 1, 2, 3)
        await redis.xadd(stream, {"raw": b"\xff\x00"})
        watcher = RedisStreamWatcher(stream, URL, **FAST)
        run = await harness.run(watcher, assets=ASSET, max_events=4, watcher_name=NAME)
        assert [p["id"] for p in run.payloads][:3] == ids
        assert numbers(run.payloads[:3]) == [1, 2, 3]
        assert run.payloads[3]["fields"] == {"raw": {"base64": "/wA="}}
        assert run.payloads[0]["stream"] == stream
        assert run.watermark == {"id": run.payloads[3]["id"], "entries_read": 4}

    async def test_a_restart_resumes_after_the_watermark(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """A watcher rebuilt from serialize() emits only the entries after its watermark."""
        await add(redis, stream, 1, 2, 3)
        watcher = RedisStreamWatcher(stream, URL, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        await add(redis, stream, 4)
        second = await harness.restart(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert numbers(first.payloads) == [1, 2]
        assert numbers(second.payloads) == [3, 4]
        assert numbers(second.all_payloads) == [1, 2, 3, 4]

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_loses_and_repeats_nothing(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness, point: CrashPoint
    ) -> None:
        """Killed at any point of its third entry, the restarted watcher emits each entry once."""
        await add(redis, stream, 1, 2, 3, 4, 5)
        watcher = RedisStreamWatcher(stream, URL, **FAST)
        after, _ = await crash_then_restart(harness, watcher, point, asset=ASSET, watcher_name=NAME)
        assert numbers(after.all_payloads) == [1, 2, 3, 4, 5]

    async def test_ids_compare_as_numbers_not_as_text(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """After the entry 9-0 the entry 10-0 is new (as text, "10-0" sorts before "9-0")."""
        await redis.xadd(stream, {"n": "9"}, id="9-0")
        watcher = RedisStreamWatcher(stream, URL, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        await redis.xadd(stream, {"n": "10"}, id="10-0")
        second = await harness.restart(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert [p["id"] for p in first.payloads + second.payloads] == ["9-0", "10-0"]
        assert parse_id("10-0") > parse_id("9-0")

    async def test_a_stream_created_later_is_waited_for(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """A watcher started before its stream exists emits the entries once it appears."""

        async def later() -> None:
            await anyio.sleep(0.3)
            await add(redis, stream, 1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            run = await harness.run(
                RedisStreamWatcher(stream, URL, **FAST),
                assets=ASSET,
                max_events=1,
                watcher_name=NAME,
            )
        assert numbers(run.payloads) == [1]

    async def test_start_dollar_skips_the_entries_already_there(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """With start="$" a new watcher emits only the entries added after it started."""
        await add(redis, stream, 1, 2)

        async def publish_when_waiting() -> None:
            await wait_blocked(redis)
            await add(redis, stream, 3)

        async with anyio.create_task_group() as tg:
            tg.start_soon(publish_when_waiting)
            run = await harness.run(
                RedisStreamWatcher(stream, URL, start="$", **FAST),
                assets=ASSET,
                max_events=1,
                watcher_name=NAME,
            )
        assert numbers(run.payloads) == [3]

    async def test_two_watchers_on_one_asset_keep_their_own_watermarks(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """Two watcher names on one asset each emit every entry and each keep a watermark."""
        await add(redis, stream, 1, 2)
        watcher = RedisStreamWatcher(stream, URL, **FAST)
        a = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name="a")
        b = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name="b")
        assert numbers(a.payloads) == numbers(b.payloads) == [1, 2]
        assert b.state[ASSET.name]["a.watermark"] == b.state[ASSET.name]["b.watermark"]


class TestRedisStreamWatcherTrouble:
    async def test_a_killed_connection_is_survived_without_loss_or_repeat(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """CLIENT KILL of the watcher's connection mid-stream: it reconnects and goes on."""
        await add(redis, stream, 1, 2)
        killed: list[int] = []

        async def kill_then_publish() -> None:
            await wait_blocked(redis)
            ours = [c for c in await redis.client_list() if c.get("name") == f"watchkeeper:{NAME}"]
            for client in ours:
                killed.append(await redis.client_kill_filter(_id=client["id"]))  # noqa: PERF401
            await add(redis, stream, 3, 4)

        run = await run_through_a_break(
            harness,
            RedisStreamWatcher(stream, URL, **FAST),
            kill_then_publish,
            asset=ASSET,
            watcher_name=NAME,
            timeout=20,
        )
        assert killed and sum(killed) >= 1
        assert numbers(run.all_payloads) == [1, 2, 3, 4]

    async def test_entries_trimmed_before_being_read_are_reported_as_a_gap(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """Entries removed by MAXLEN while the watcher was down are logged as a gap of that size."""
        await add(redis, stream, 1, 2)
        watcher = RedisStreamWatcher(stream, URL, **FAST)
        await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        await add(redis, stream, 3, 4, 5, 6, 7)
        await redis.xtrim(stream, maxlen=2, approximate=False)
        with structlog.testing.capture_logs() as logs:
            after = await harness.restart(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert numbers(after.payloads) == [6, 7]
        gaps = [entry for entry in logs if entry["event"] == "redis_stream_gap"]
        assert [gap["lost"] for gap in gaps] == [3]
        assert after.watermark["entries_read"] == 7

    async def test_entries_trimmed_after_being_read_are_no_gap(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """Trimming only entries the watcher already emitted reports nothing."""
        await add(redis, stream, 1, 2, 3)
        watcher = RedisStreamWatcher(stream, URL, **FAST)
        await harness.run(watcher, assets=ASSET, max_events=3, watcher_name=NAME)
        await redis.xtrim(stream, maxlen=0, approximate=False)
        await add(redis, stream, 4)
        with structlog.testing.capture_logs() as logs:
            after = await harness.restart(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert numbers(after.payloads) == [4]
        assert [entry for entry in logs if entry["event"] == "redis_stream_gap"] == []

    async def test_an_unreachable_server_raises_a_broker_error_without_the_password(
        self, stream: str, harness: WatcherHarness
    ) -> None:
        """A server that does not answer ends run() with BrokerSourceError; no password shown."""
        watcher = RedisStreamWatcher(
            stream, "redis://:s3cret@127.0.0.1:1/0", reconnect_attempts=1, **FAST
        )
        with pytest.raises(BrokerSourceError) as caught:
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert "s3cret" not in str(caught.value)
        assert "RedisStreamWatcher" in str(caught.value)


class TestRedisStreamWatcherGroup:
    async def test_a_group_acknowledges_after_the_commit_and_skips_committed_pending(
        self, redis: aioredis.Redis, stream: str, harness: WatcherHarness
    ) -> None:
        """Crashed after committing its third entry, the group member re-reads its pending
        entries on restart, only acknowledges the committed one, and emits the rest once."""
        await add(redis, stream, 1, 2, 3, 4, 5)
        watcher = RedisStreamWatcher(stream, URL, group="g", **FAST)
        crashed = await harness.crash(
            watcher, assets=ASSET, at="after_commit", event=3, watcher_name=NAME
        )
        pending = await redis.xpending(stream, "g")
        assert numbers(crashed.payloads) == [1, 2, 3]
        assert pending["pending"] >= 1  # the third was committed but never acknowledged
        after = await harness.restart(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert numbers(after.all_payloads) == [1, 2, 3, 4, 5]
        # The last event of a stopped run is committed, not acknowledged: one at most.
        assert (await redis.xpending(stream, "g"))["pending"] <= 1


class TestBatches:
    @pytest.mark.parametrize("group", [None, "g"])
    @pytest.mark.parametrize("point", ["before_commit", "after_commit"])
    async def test_a_crash_inside_a_batch_loses_and_repeats_nothing(
        self,
        redis: aioredis.Redis,
        stream: str,
        harness: WatcherHarness,
        point: CrashPoint,
        group: str | None,
    ) -> None:
        """Killed inside a batch (before its commit, after its commit and before the XACK),
        the restarted watcher commits each entry exactly once: the watermark committed with
        the batch says where to go on, and, in a group, which pending entries only need
        their XACK."""
        await add(redis, stream, 1, 2, 3, 4, 5)

        later: list[str] = []

        async def more() -> None:
            later.extend(await add(redis, stream, 6, 7))

        crashed, after, _ = await crash_in_a_batch(
            harness,
            RedisStreamWatcher(stream, URL, block=0.2, group=group),
            point,
            more,
            asset=ASSET,
            watcher_name=NAME,
            total=7,
        )
        assert numbers(after.all_payloads) == list(range(1, 8))
        if point == "after_commit":
            assert len(crashed.all_events) == 5  # one batch, one commit
        if group is not None:
            # Every batch acknowledged after its commit, but the last: the run stopped at
            # max_events, right after that commit.
            pending = await redis.xpending_range(stream, group, min="-", max="+", count=10)
            assert [_text(entry["message_id"]) for entry in pending] == later


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
