"""S3PrefixWatcher against a real S3 endpoint: ``moto_server`` on a free port of 127.0.0.1."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import structlog
from aiobotocore.session import get_session
from hypothesis import given, settings
from hypothesis import strategies as st
from watchkeeper.store import Asset, BaseStateBackend, SqliteStateBackend
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness
from watchkeeper.watchers import BrokerSourceError, S3PrefixWatcher, SqsWatcher
from watchkeeper.watchers._window import LagWindow
from watchkeeper.watchers._window_state import WindowState
from watchkeeper.watchers.s3_prefix import _advance, _size_of, _whole_window

from tests.support.aws import AWS_ENV
from tests.support.brokers import crash_then_restart, unique
from tests.support.proxy import open_proxy
from tests.watchers.test_black_hole import assert_survived, through_a_black_hole

ASSET = Asset("objects")
NAME = "s3_feed"
WATERMARK = f"{NAME}.watermark"
RECENT = f"{NAME}.recent"
FAST: dict[str, Any] = {"poll_interval": 0.2, "call_timeout": 5.0}
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

Client = Any
"""An aiobotocore S3 client (aiobotocore ships no types)."""


@pytest.fixture
async def s3(moto_endpoint: str) -> AsyncIterator[Client]:
    async with get_session().create_client(
        "s3", region_name="us-east-1", endpoint_url=moto_endpoint
    ) as client:
        yield client


@pytest.fixture
async def bucket(s3: Client) -> str:
    name = unique("wk-test-")
    await s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[BaseStateBackend]:
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        yield backend


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    return WatcherHarness(state, watermark_key=WATERMARK)


async def put(s3: Client, bucket: str, *keys: str, body: bytes = b'{"n": 1}') -> None:
    for key in keys:
        await s3.put_object(Bucket=bucket, Key=key, Body=body)


def keys(payloads: list[Any]) -> list[str]:
    return [p["key"] for p in payloads]


class TestS3PrefixWatcherFlow:
    async def test_each_new_object_once_with_key_size_etag_and_time(
        self, s3: Client, bucket: str, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        """Objects already there come first, in key order, with their size, ETag and time;
        a restarted watcher emits only the objects put since, and nothing outside the
        prefix."""
        await put(s3, bucket, "in/b.json", "in/a.json", "out/x.json")
        await put(s3, bucket, "in/c.json", body=b"12345")
        watcher = S3PrefixWatcher(bucket, "in/", endpoint_url=moto_endpoint, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=3, watcher_name=NAME)
        assert keys(first.payloads) == ["in/a.json", "in/b.json", "in/c.json"]
        head = await s3.head_object(Bucket=bucket, Key="in/c.json")
        c = first.payloads[2]
        assert c["size"] == 5
        assert c["etag"] == head["ETag"].strip('"')
        assert c["uri"] == f"s3://{bucket}/in/c.json"
        assert c["bucket"] == bucket
        assert c["last_modified"] == head["LastModified"].isoformat()
        assert first.watermark["cursor"] == "in/c.json"

        await put(s3, bucket, "in/d.json", "in/e.json")
        second = await harness.restart(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(second.payloads) == ["in/d.json", "in/e.json"]
        assert len(second.all_payloads) == 5

    async def test_a_listing_of_many_pages_is_committed_page_by_page(
        self, s3: Client, bucket: str, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        """With 7 keys per listing call, 40 objects come in order as batches of at most 7,
        each object once."""
        names = [f"p/{n:03d}" for n in range(40)]
        await put(s3, bucket, *names)
        watcher = S3PrefixWatcher(bucket, "p/", endpoint_url=moto_endpoint, page_size=7, **FAST)
        with structlog.testing.capture_logs() as logs:
            run = await harness.run(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(run.payloads) == names
        batches = [e["count"] for e in logs if e["event"] == "batch_committed"]
        if batches:  # the runtime logs each batch at debug level when it is enabled
            assert max(batches) <= 7

    async def test_a_late_object_inside_the_window_is_emitted_once(
        self, s3: Client, bucket: str, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        """An object whose key sorts before the watermark, put after the watcher passed it,
        is emitted once; the runs after it emit it no more."""
        await put(s3, bucket, "l/2026-01-02", "l/2026-01-03")
        watcher = S3PrefixWatcher(bucket, "l/", endpoint_url=moto_endpoint, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert keys(first.payloads) == ["l/2026-01-02", "l/2026-01-03"]
        await put(s3, bucket, "l/2026-01-01")  # late: before the watermark
        with structlog.testing.capture_logs() as logs:
            second = await harness.restart(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert keys(second.payloads) == ["l/2026-01-01"]
        assert [e["key"] for e in logs if e["event"] == "late_object"] == ["l/2026-01-01"]
        await put(s3, bucket, "l/2026-01-04")
        third = await harness.restart(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(third.payloads) == ["l/2026-01-04"]
        assert sorted(keys(third.all_payloads)) == [f"l/2026-01-0{d}" for d in range(1, 5)]

    async def test_an_object_below_the_floor_is_not_emitted(
        self, s3: Client, bucket: str, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        """With lag_window=0, once a newer object lands the window's floor rises past the
        older keys: an object put behind the floor is too late and never emitted, while one
        after the watermark is."""
        await put(s3, bucket, "f/b")
        await anyio.sleep(1.1)  # S3's LastModified counts whole seconds
        await put(s3, bucket, "f/c")
        watcher = S3PrefixWatcher(bucket, "f/", endpoint_url=moto_endpoint, lag_window=0, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        assert keys(first.payloads) == ["f/b", "f/c"]
        assert first.state[ASSET.name][RECENT]["floor"] == "f/b"
        await put(s3, bucket, "f/a", "f/d")
        second = await harness.restart(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(second.payloads) == ["f/d"]

    async def test_a_rewritten_object_inside_the_window_is_a_new_version(
        self, s3: Client, bucket: str, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        """The same key with new content (a new ETag) inside the window is emitted again;
        the same bytes put again a second later (a retry) are not, whether the key is behind
        the watermark or is the watermark."""
        await put(s3, bucket, "v/a", "v/b", body=b"one")
        watcher = S3PrefixWatcher(bucket, "v/", endpoint_url=moto_endpoint, **FAST)
        first = await harness.run(watcher, assets=ASSET, max_events=2, watcher_name=NAME)
        await anyio.sleep(1.1)  # a later LastModified (whole seconds)
        await put(s3, bucket, "v/a", "v/b", body=b"one")
        retried = await harness.restart(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert retried.payloads == []
        await put(s3, bucket, "v/a", body=b"two")
        second = await harness.restart(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(second.payloads) == ["v/a"]
        assert second.payloads[0]["etag"] != first.payloads[0]["etag"]
        assert second.payloads[0]["size"] == 3

    async def test_filters_pattern_size_and_folder_markers(
        self, s3: Client, bucket: str, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        """Only keys matching the glob, at least min_size bytes, and no folder marker."""
        await put(s3, bucket, "d/a.csv", "d/sub/b.csv", "d/c.json")
        await put(s3, bucket, "d/empty.csv", "d/folder/", body=b"")
        watcher = S3PrefixWatcher(
            bucket, "d/", endpoint_url=moto_endpoint, pattern="d/*.csv", min_size=1, **FAST
        )
        run = await harness.run(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(run.payloads) == ["d/a.csv", "d/sub/b.csv"]

    async def test_start_after_skips_the_keys_before_it_on_the_first_run(
        self, s3: Client, bucket: str, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        await put(s3, bucket, "s/1", "s/2", "s/3")
        watcher = S3PrefixWatcher(
            bucket, "s/", endpoint_url=moto_endpoint, start_after="s/2", **FAST
        )
        run = await harness.run(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(run.payloads) == ["s/3"]
        await put(s3, bucket, "s/0", "s/4")
        again = await harness.restart(watcher, assets=ASSET, idle=1.5, watcher_name=NAME)
        assert keys(again.payloads) == ["s/4"]

    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_anywhere_loses_and_repeats_nothing(
        self,
        s3: Client,
        bucket: str,
        moto_endpoint: str,
        harness: WatcherHarness,
        point: CrashPoint,
    ) -> None:
        """Killed at any point of its second page, the restarted watcher commits each of
        nine objects exactly once."""
        names = [f"k/{n}" for n in range(1, 10)]
        await put(s3, bucket, *names)
        after, _ = await crash_then_restart(
            harness,
            S3PrefixWatcher(bucket, "k/", endpoint_url=moto_endpoint, page_size=3, **FAST),
            point,
            asset=ASSET,
            watcher_name=NAME,
            messages=9,
            at=2,
        )
        assert keys(after.all_payloads) == names


class TestS3PrefixWatcherErrors:
    async def test_a_missing_bucket_raises_a_source_error(
        self, moto_endpoint: str, harness: WatcherHarness
    ) -> None:
        missing = unique("wk-missing-")
        watcher = S3PrefixWatcher(missing, endpoint_url=moto_endpoint, **FAST)
        with pytest.raises(BrokerSourceError, match="NoSuchBucket") as caught:
            await harness.run(watcher, assets=ASSET, max_events=1, watcher_name=NAME)
        assert missing in str(caught.value)

    async def test_an_unreachable_endpoint_backs_off_with_the_reason_then_recovers(
        self, s3: Client, bucket: str, moto_endpoint: str
    ) -> None:
        """Through a proxy that black-holes its links and refuses new ones for 3 s (moto
        closes each connection after its answer, so the refusal is what the next listing
        meets): the status is backing_off naming the endpoint (and never the secret key),
        and the objects put meanwhile still arrive, each once, in order."""
        proxy_box: list[Any] = []

        async def send(numbers: tuple[int, ...]) -> None:
            if numbers[0] != 1:  # the objects put once the link is holed
                proxy_box[0].refuse(3.0)
            await put(s3, bucket, *(f"h/{n:04d}" for n in numbers))

        port = urlsplit(moto_endpoint).port
        assert port is not None
        async with open_proxy(port) as proxy:
            proxy_box.append(proxy)
            endpoint = f"http://{proxy.dsn_host}"
            watcher = S3PrefixWatcher(
                bucket, "h/", endpoint_url=endpoint, poll_interval=0.2, call_timeout=1.0
            )
            outcome = await through_a_black_hole(
                watcher, proxy, send, lambda payload: int(payload["key"][-4:]), timeout=90
            )
        assert_survived(outcome, proxy, proxy.dsn_host, "retrying")
        secret = AWS_ENV["AWS_SECRET_ACCESS_KEY"]
        assert all(secret not in (reason or "") for reason in outcome.backing_off)

    async def test_no_secret_in_repr_serialize_or_the_reasons(self, moto_endpoint: str) -> None:
        """The secret key (from the environment) and an endpoint's password show nowhere."""
        watcher = S3PrefixWatcher(
            unique("wk-none-"),
            "p/",
            endpoint_url="http://user:hunter2pass@127.0.0.1:1",
            call_timeout=0.5,
        )
        reports: list[str | None] = []
        watcher.bind_source_status(reports.append)
        watcher.bind_watcher_name(NAME)
        secret = AWS_ENV["AWS_SECRET_ACCESS_KEY"]
        assert "hunter2pass" not in repr(watcher)
        assert secret not in json.dumps(watcher.serialize())
        assert "hunter2pass" in json.dumps(watcher.serialize())  # a URL is a parameter
        failures = watcher._failed(OSError(f"refused {secret} hunter2pass"), 0, watcher._secrets())
        assert failures == 1
        assert reports and all(
            secret not in str(r) and "hunter2pass" not in str(r) for r in reports
        )

    def test_bad_parameters_are_refused_by_name(self) -> None:
        with pytest.raises(ValueError, match="not a URL"):
            S3PrefixWatcher("s3://bucket/in/")
        with pytest.raises(ValueError, match="goes in prefix"):
            S3PrefixWatcher("bucket/in")
        with pytest.raises(ValueError, match="not a bucket name"):
            S3PrefixWatcher("b")
        with pytest.raises(ValueError, match="page_size"):
            S3PrefixWatcher("bucket", page_size=1001)
        with pytest.raises(ValueError, match="min_size"):
            S3PrefixWatcher("bucket", min_size=-1)
        with pytest.raises(ValueError, match="lag_window"):
            S3PrefixWatcher("bucket", lag_window=-1)
        with pytest.raises(ValueError, match="no key under prefix"):
            S3PrefixWatcher("bucket", "in/", pattern="out/*.csv")
        with pytest.raises(ValueError, match="1024 bytes"):
            S3PrefixWatcher("bucket", "x" * 1025)
        with pytest.raises(TypeError, match="prefix"):
            S3PrefixWatcher("bucket", 3)
        with pytest.raises(TypeError, match="at most 2 positional"):
            S3PrefixWatcher("bucket", "in/", "us-east-1")

    def test_serialize_round_trips_and_keeps_its_order(self) -> None:
        watcher = S3PrefixWatcher("bucket", "in/", pattern="in/*.csv", min_size=1)
        classpath, kwargs = watcher.serialize()
        assert classpath == "watchkeeper.watchers.s3_prefix.S3PrefixWatcher"
        assert list(kwargs)[:2] == ["bucket", "prefix"]
        assert WatcherHarness.rebuild(watcher) == watcher


# -- the window, without S3 ---------------------------------------------------------------------


def window_state(max_keys: int = 1000) -> WindowState[str, str]:
    return WindowState(
        "S3PrefixWatcher('b', '')",
        "S3PrefixWatcher",
        NAME,
        lower=_whole_window,
        size_of=_size_of,
        max_keys=max_keys,
        kinds=("str",),
        key_types=(str,),
    )


def item(key: str, second: int, etag: str = "e") -> tuple[str, str]:
    return key, f"{second * 1000} {etag} {key}"


class TestS3Window:
    def test_the_floor_rises_below_the_keys_of_the_last_lag_seconds(self) -> None:
        state = window_state()
        w = _advance(state, state.new_window(), [item("a", 0), item("b", 10)], 5, "b")
        assert (w.floor, w.watermark) == ("a", item("b", 10))
        assert w.accepts(*item("a2", 11)) and not w.accepts(*item("a", 11))
        assert not w.accepts(*item("b", 10))

    def test_the_floor_never_passes_the_last_key_listed(self) -> None:
        """Keys beyond what this pass listed were not read yet: the floor stops there. A late
        object with an old LastModified (a long multipart upload) listed at "c" must not
        lift the floor to "m", past "d", which this pass has not reached. (With one
        lag_window throughout, "m" would have been below the floor already; a window kept
        under a larger lag_window, then read with a smaller one, is such a state.)"""
        state = window_state()
        w = state.new_window(item("z", 100), [item("m", 0), item("z", 100)])
        w = _advance(state, w, [item("c", 0)], 5, "c")
        assert w.floor == "c"
        assert w.accepts(*item("d", 100))
        assert not w.accepts(*item("c", 0))

    def test_an_overflow_keeps_the_newest_keys_within_the_limit(self) -> None:
        state = window_state(max_keys=10)
        emitted = [item(f"k{n:03d}", 0) for n in range(30)]
        w = _advance(state, state.new_window(), emitted, 60, "k029")
        assert len(w.keys()) == 10
        assert w.floor == "k019"
        assert w.overflowed
        assert not w.accepts(*item("k019", 0, "other"))
        assert w.accepts(*item("k020", 0, "other"))

    def test_state_round_trips_through_the_window_state(self) -> None:
        state = window_state()
        w = _advance(state, state.new_window(), [item("a", 0), item("b", 10)], 5, "b")
        saved = state.state(w)
        again = state._decode(saved[state.watermark_key], saved[state.recent_key])
        assert (again.watermark, again.floor, again.items()) == (w.watermark, w.floor, w.items())


# -- the notification path of docs/s3-watchers.md ----------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "s3-watchers.md"


def docs_block(marker: str) -> dict[str, Any]:
    """Run the python block of the S3 page that holds ``marker``; its names."""
    text = DOCS.read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if marker in b]
    assert len(blocks) == 1, f"expected one python block with {marker!r} in {DOCS.name}"
    names: dict[str, Any] = {}
    exec(compile(blocks[0], str(DOCS), "exec"), names)  # noqa: S102 - the page's own example
    return names


class TestNotificationPath:
    async def test_the_documented_setup_delivers_new_objects_to_an_sqs_watcher(
        self, s3: Client, bucket: str, moto_endpoint: str, state: BaseStateBackend
    ) -> None:
        """The page's setup makes S3 notify a queue; an SqsWatcher on it emits the object,
        and the page's reader finds its key, size and ETag in the event."""
        setup = docs_block("async def send_new_objects_to_queue(")["send_new_objects_to_queue"]
        reader = docs_block("def created_objects(")["created_objects"]
        async with get_session().create_client(
            "sqs", region_name="us-east-1", endpoint_url=moto_endpoint
        ) as sqs:
            queue = await setup(s3, sqs, bucket, "in/", unique("wk-notify-"))
            await put(s3, bucket, "in/one.csv", "out/other.csv", body=b"a,b\n")
            watcher = SqsWatcher(queue, endpoint_url=moto_endpoint, wait_time=1, call_timeout=5.0)
            harness = WatcherHarness(state, watermark_key="notified.message_id")
            run = await harness.run(
                watcher, assets=ASSET, idle=2, timeout=30, watcher_name="notified"
            )
        found = [obj for payload in run.payloads for obj in reader(payload)]
        head = await s3.head_object(Bucket=bucket, Key="in/one.csv")
        assert found == [
            {
                "bucket": bucket,
                "key": "in/one.csv",
                "size": 4,
                "etag": head["ETag"].strip('"'),
            }
        ]


# -- the listing loop over a model bucket, with restarts ----------------------------------------

Bucket = dict[str, tuple[int, str]]
"""A model bucket: ``{key: (LastModified in seconds, ETag)}``."""


def listing_pass(
    state: WindowState[str, str],
    window: LagWindow[str, str],
    bucket: Bucket,
    page_size: int,
    lag: float,
    restart_after: int | None,
) -> tuple[list[tuple[str, str]], LagWindow[str, str]]:
    """One poll of the watcher over ``bucket``: the pages from the floor on, each page's
    accepted objects committed; the window rebuilt from its committed state (a restart)
    after page ``restart_after``. The ``(key, ETag)`` emitted, and the window after."""
    watcher = S3PrefixWatcher("bucket")
    keys = sorted(k for k in bucket if window.floor is None or k > window.floor)
    emitted: list[tuple[str, str]] = []
    for number, start in enumerate(range(0, len(keys), page_size)):
        page = keys[start : start + page_size]
        contents = [
            {
                "Key": key,
                "LastModified": EPOCH + timedelta(seconds=bucket[key][0]),
                "ETag": f'"{bucket[key][1]}"',
                "Size": 1,
            }
            for key in page
        ]
        found = watcher._accepted(window, contents)
        if found:
            window = _advance(state, window, [i for i, _ in found], lag, page[-1])
            emitted += [(obj["Key"], obj["ETag"].strip('"')) for _, obj in found]
            if number == restart_after:
                saved = state.state(window)
                window = state._decode(saved[state.watermark_key], saved[state.recent_key])
    return emitted, window


PUT = st.tuples(
    st.sampled_from([f"k{n:02d}" for n in range(30)]),  # key
    st.integers(0, 8),  # how many seconds before now its LastModified lies
    st.sampled_from(["e1", "e2"]),  # content
)


class TestS3ListingModel:
    @settings(max_examples=300, deadline=None)
    @given(
        steps=st.lists(
            st.tuples(st.lists(PUT, max_size=6), st.one_of(st.none(), st.integers(0, 3))),
            min_size=1,
            max_size=12,
        ),
        page_size=st.integers(1, 5),
        lag=st.sampled_from([0, 2, 5, 60]),
        max_keys=st.sampled_from([3, 1000]),
    )
    def test_each_content_once_and_nothing_above_the_floor_missed(
        self,
        steps: list[tuple[list[tuple[str, int, str]], int | None]],
        page_size: int,
        lag: int,
        max_keys: int,
    ) -> None:
        """Objects put between polls, some stamped seconds earlier (a long upload), some
        written over; restarts between pages. No key and content is emitted twice, and every
        object present when a poll starts whose key is above that poll's floor is emitted
        by the end of it (or was, with that content, before)."""
        state = window_state(max_keys)
        window = state.new_window()
        bucket: Bucket = {}
        seen: list[tuple[str, str]] = []
        for now, (puts, restart_after) in enumerate(steps, start=10):
            for key, age, etag in puts:
                bucket[key] = (now - age, etag)
            floor = window.floor
            due = {(k, e) for k, (_, e) in bucket.items() if floor is None or k > floor}
            emitted, window = listing_pass(state, window, bucket, page_size, lag, restart_after)
            seen += emitted
            assert len(seen) == len(set(seen)), f"emitted twice: {seen}"
            assert due <= set(seen), f"missed {due - set(seen)}"
