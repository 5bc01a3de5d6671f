"""DirectoryWatcher against real files under tmp_path, driven through the real runtime."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from watchkeeper.store import Asset, BaseStateBackend, MemoryStateBackend
from watchkeeper.triggerer.testing import run_trigger
from watchkeeper.watchers import DirectoryWatcher

from tests.support.runtime import Signalling, rebuilt

T0 = 1_700_000_000 * 1_000_000_000  # a fixed modification time, in ns
MS = 1_000_000
S = 1_000_000_000
OpenBackend = Callable[[], contextlib.AbstractAsyncContextManager[BaseStateBackend]]
ASSET = Asset("inbox")
NAME = "inbox_feed"
WATERMARK = f"{NAME}.watermark"
RECENT = f"{NAME}.recent"
POLL = 0.01


def make_file(directory: Path, name: str, mtime_ns: int, content: str = "x") -> Path:
    path = directory / name
    path.write_text(content)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


async def names(
    trigger: DirectoryWatcher,
    backend: BaseStateBackend,
    max_events: int | None,
    *,
    limit: float = 10.0,
    assets: Asset | list[Asset] = ASSET,
    name: str = NAME,
) -> list[str]:
    events = await run_trigger(
        trigger,
        assets=assets,
        backend=backend,
        max_events=max_events,
        timeout=limit,
        watcher_name=name,
    )
    return [event.payload["name"] for event in events]


class SignallingWatcher(Signalling, DirectoryWatcher):
    """The DirectoryWatcher that signals its committed events (see :class:`Signalling`)."""


class SignalOn:
    """A structlog processor that sets ``seen`` when an event of that name is logged."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen = anyio.Event()
        self.count = 0

    def __call__(self, _logger: object, _method: str, event: MutableMapping[str, Any]) -> Any:
        if event["event"] == self.name:
            self.count += 1
            self.seen.set()
        raise structlog.DropEvent


@pytest.fixture
def backend() -> MemoryStateBackend:
    return MemoryStateBackend()


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    path = tmp_path / "inbox"
    path.mkdir()
    return path


class TestDirectoryWatcherEvents:
    async def test_existing_files_come_in_mtime_then_name_order(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """Files already present are emitted once each, ordered by (mtime, name), with stat facts."""
        make_file(inbox, "b.txt", T0, "hello")
        make_file(inbox, "c.txt", T0 + MS)
        make_file(inbox, "a.txt", T0 + MS)
        watcher = DirectoryWatcher(str(inbox), poll_interval=POLL)
        events = await run_trigger(
            watcher, assets=ASSET, backend=backend, max_events=3, timeout=10, watcher_name=NAME
        )
        assert [e.payload["name"] for e in events] == ["b.txt", "a.txt", "c.txt"]
        assert events[0].payload == {
            "path": str(inbox / "b.txt"),
            "name": "b.txt",
            "size": 5,
            "mtime": T0 / S,
            "mtime_ns": T0,
        }
        assert await backend.aget(ASSET.scope, WATERMARK) == {
            "kind": "int",
            "cursor": T0 + MS,
            "key": "c.txt",
        }

    async def test_files_sharing_an_mtime_are_each_emitted_once_across_restarts(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """Three files with one mtime, split by a restart after the first, each come exactly once."""
        for name in ("a", "b", "c"):
            make_file(inbox, name, T0)
        watcher = DirectoryWatcher(str(inbox), poll_interval=POLL, batch_size=1)
        assert await names(watcher, backend, 1) == ["a"]
        assert await names(rebuilt(watcher), backend, 2) == ["b", "c"]
        make_file(inbox, "d", T0 + S)
        assert await names(rebuilt(watcher), backend, 1) == ["d"]

    async def test_a_scan_commits_its_files_in_batches(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """Five new files with batch_size=2 commit as three batches: three state writes."""
        for index, name in enumerate("abcde"):
            make_file(inbox, name, T0 + index * MS)
        watcher = DirectoryWatcher(str(inbox), poll_interval=POLL, batch_size=2)
        assert await names(watcher, backend, 5) == list("abcde")
        entry = await backend.aget_entry(ASSET.scope, WATERMARK)
        assert entry is not None
        assert (entry.value["key"], entry.version) == ("e", 3)
        make_file(inbox, "f", T0 + 9 * MS)
        assert await names(rebuilt(watcher), backend, 1) == ["f"]

    async def test_a_restarted_watcher_emits_nothing_twice(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """A new instance built from serialize() resumes after the stored watermark."""
        make_file(inbox, "one", T0)
        make_file(inbox, "two", T0 + MS)
        watcher = DirectoryWatcher(str(inbox), poll_interval=POLL)
        assert await names(watcher, backend, 2) == ["one", "two"]
        make_file(inbox, "three", T0 + 2 * MS)
        assert await names(rebuilt(watcher), backend, 1) == ["three"]

    async def test_a_file_created_while_running_is_picked_up(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """A file that appears after the first scan is emitted by the same run."""
        make_file(inbox, "first", T0)
        watcher = SignallingWatcher(str(inbox), poll_interval=POLL)
        watcher.committed = anyio.Event()
        result: list[str] = []

        async def drive() -> None:
            result.extend(await names(watcher, backend, 2))

        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            with anyio.fail_after(10):
                await watcher.committed.wait()
            make_file(inbox, "second", T0 + S)
        assert result == ["first", "second"]

    async def test_a_late_file_inside_the_lag_window_is_emitted_once(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """A file appearing with an mtime below the watermark but inside the window comes once."""
        make_file(inbox, "a", T0)
        make_file(inbox, "b", T0 + 10 * S)
        watcher = DirectoryWatcher(str(inbox), lag_window=60, poll_interval=POLL)
        assert await names(watcher, backend, 2) == ["a", "b"]
        make_file(inbox, "copied-with-old-mtime", T0 + 5 * S)
        assert await names(rebuilt(watcher), backend, 1) == ["copied-with-old-mtime"]
        make_file(inbox, "sentinel", T0 + 20 * S)
        assert await names(rebuilt(watcher), backend, 1) == ["sentinel"]

    async def test_a_late_file_in_the_watermark_tick_is_caught_without_a_lag_window(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """With lag_window=0 a file written in the watermark's timestamp tick still comes once."""
        make_file(inbox, "m", T0)
        watcher = DirectoryWatcher(str(inbox), lag_window=0, poll_interval=POLL)
        assert await names(watcher, backend, 1) == ["m"]
        make_file(inbox, "a", T0)  # sorts before the watermark's name, same mtime
        make_file(inbox, "z", T0 + S)
        assert await names(rebuilt(watcher), backend, 2) == ["a", "z"]
        make_file(inbox, "sentinel", T0 + 2 * S)
        assert await names(rebuilt(watcher), backend, 1) == ["sentinel"]

    async def test_a_file_older_than_the_lag_window_is_never_emitted(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """A file more than lag_window seconds behind the watermark is skipped, by design."""
        make_file(inbox, "a", T0 + 100 * S)
        watcher = DirectoryWatcher(str(inbox), lag_window=5, poll_interval=POLL)
        assert await names(watcher, backend, 1) == ["a"]
        make_file(inbox, "ancient", T0)
        make_file(inbox, "sentinel", T0 + 200 * S)
        assert await names(rebuilt(watcher), backend, 1) == ["sentinel"]

    async def test_only_regular_files_matching_the_pattern_are_emitted(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """The glob filters names, and directories are never emitted even when they match."""
        make_file(inbox, "x.csv", T0)
        make_file(inbox, "y.txt", T0 + MS)
        (inbox / "z.csv").mkdir()
        os.utime(inbox / "z.csv", ns=(T0 + 2 * MS, T0 + 2 * MS))
        make_file(inbox, "w.csv", T0 + 3 * MS)
        watcher = DirectoryWatcher(str(inbox), pattern="*.csv", poll_interval=POLL)
        assert await names(watcher, backend, 2) == ["x.csv", "w.csv"]

    async def test_a_missing_directory_is_waited_for(
        self, tmp_path: Path, backend: MemoryStateBackend
    ) -> None:
        """A directory that does not exist yet is logged once and watched once it appears."""
        later = tmp_path / "later"
        result: list[str] = []

        async def drive() -> None:
            result.extend(await names(DirectoryWatcher(str(later), poll_interval=POLL), backend, 1))

        signal = SignalOn("directory_missing")
        structlog.configure(processors=[signal])
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            with anyio.fail_after(10):
                await signal.seen.wait()
            later.mkdir()
            make_file(later, "arrived", T0)
        assert result == ["arrived"]
        assert signal.count == 1

    async def test_min_age_defers_a_file_until_it_has_settled(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """A file modified less than min_age seconds ago is left for a later scan."""
        make_file(inbox, "settled", T0)
        fresh = make_file(inbox, "fresh", time.time_ns() + 3600 * S)
        watcher = DirectoryWatcher(str(inbox), min_age=1.0, poll_interval=POLL)
        assert await names(watcher, backend, None, limit=0.3) == ["settled"]
        os.utime(fresh, ns=(T0 + S, T0 + S))
        assert await names(rebuilt(watcher), backend, 1) == ["fresh"]

    async def test_every_watched_asset_gets_the_event_and_the_state(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """Watching two assets commits each file to both, with the watermark on both."""
        make_file(inbox, "a", T0)
        other = Asset("mirror")
        events = await run_trigger(
            DirectoryWatcher(str(inbox), poll_interval=POLL),
            assets=[ASSET, other],
            backend=backend,
            max_events=2,
            timeout=10,
            watcher_name=NAME,
        )
        assert sorted(e.asset for e in events) == ["inbox", "mirror"]
        for asset in (ASSET, other):
            assert await backend.aget(asset.scope, WATERMARK) == {
                "kind": "int",
                "cursor": T0,
                "key": "a",
            }

    async def test_a_burst_past_the_recent_limit_shrinks_the_window(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """Over recent_limit names, the oldest are forgotten and late files below them skipped."""

        class SmallWatcher(DirectoryWatcher):
            recent_limit = 2

        for index, name in enumerate("abcd"):
            make_file(inbox, name, T0 + index * MS)
        watcher = SmallWatcher(str(inbox), lag_window=60, poll_interval=POLL)
        assert await names(watcher, backend, 4) == ["a", "b", "c", "d"]
        recent = await backend.aget(ASSET.scope, RECENT)
        assert recent == {
            "floor": T0 + MS,
            "cursors": [T0 + 2 * MS, T0 + 3 * MS],
            "keys": ["c", "d"],
        }
        make_file(inbox, "below-floor", T0 + MS // 2)
        make_file(inbox, "above-floor", T0 + 2 * MS + MS // 2)
        make_file(inbox, "sentinel", T0 + S)
        assert await names(
            SmallWatcher(str(inbox), lag_window=60, poll_interval=POLL), backend, 2
        ) == [
            "above-floor",
            "sentinel",
        ]

    async def test_a_corrupt_stored_watermark_is_a_clear_error(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """A stored watermark that is not this watcher's raises ValueError instead of re-emitting."""
        await backend.events.aregister_assets([ASSET])
        await backend.aset(ASSET.scope, WATERMARK, {"cursor": 3})
        make_file(inbox, "a", T0)
        with pytest.raises(ValueError, match="not a DirectoryWatcher watermark"):
            await names(DirectoryWatcher(str(inbox), poll_interval=POLL), backend, 1)


class TestDirectoryWatcherArguments:
    def test_serialize_rebuilds_an_equal_trigger(self, tmp_path: Path) -> None:
        """serialize() gives an importable classpath and JSON kwargs that rebuild an equal one."""
        watcher = DirectoryWatcher(tmp_path, "*.csv", 0.5, lag_window=30, min_age=2, batch_size=9)
        classpath, kwargs = watcher.serialize()
        assert classpath == "watchkeeper.watchers.directory.DirectoryWatcher"
        assert kwargs == {
            "path": str(tmp_path),
            "pattern": "*.csv",
            "poll_interval": 0.5,
            "lag_window": 30,
            "min_age": 2,
            "batch_size": 9,
        }
        copy = rebuilt(watcher)
        assert copy == watcher
        assert hash(copy) == hash(watcher)
        assert copy != DirectoryWatcher(tmp_path, "*.txt", 0.5, lag_window=30, min_age=2)

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"path": 3}, TypeError, "path must be a str"),
            ({"path": ""}, ValueError, "path must not be empty"),
            ({"pattern": None}, TypeError, "pattern must be a str"),
            ({"pattern": ""}, ValueError, "pattern must not be empty"),
            ({"pattern": "sub/*.csv"}, ValueError, "pattern 'sub/\\*.csv' must match file names"),
            ({"poll_interval": 0}, ValueError, "poll_interval must be greater than 0"),
            ({"poll_interval": -1.0}, ValueError, "poll_interval must be greater than 0"),
            ({"poll_interval": math.nan}, ValueError, "poll_interval must be finite"),
            ({"poll_interval": True}, TypeError, "poll_interval must be a number"),
            ({"poll_interval": "1"}, TypeError, "poll_interval must be a number"),
            ({"lag_window": -1}, ValueError, "lag_window must be 0 or more"),
            ({"lag_window": math.inf}, ValueError, "lag_window must be finite"),
            ({"min_age": -0.5}, ValueError, "min_age must be 0 or more"),
            ({"batch_size": 0}, ValueError, "batch_size must be at least 1"),
            ({"batch_size": 2.5}, TypeError, "batch_size must be an int"),
        ],
    )
    def test_bad_arguments_are_rejected_by_name(
        self, tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
    ) -> None:
        """Each invalid argument raises a TypeError or ValueError that names it."""
        arguments: dict[str, Any] = {"path": str(tmp_path), **kwargs}
        with pytest.raises(error, match=match):
            DirectoryWatcher(**arguments)

    def test_asset_state_store_is_unavailable_outside_run(self, tmp_path: Path) -> None:
        """Constructing and serializing never touch the asset state store."""
        watcher = DirectoryWatcher(str(tmp_path))
        assert not hasattr(watcher, "asset_state_store")
        assert "DirectoryWatcher" in repr(watcher)


class TestDirectoryWatcherDurableState:
    async def test_restart_on_a_reopened_store_emits_nothing_twice(
        self, inbox: Path, reopenable_backend: OpenBackend
    ) -> None:
        """The watermark and recent names survive closing the store; a rebuilt watcher resumes."""
        make_file(inbox, "a", T0)
        make_file(inbox, "b", T0 + 10 * S)
        make_file(inbox, "c", T0 + 10 * S)
        watcher = DirectoryWatcher(str(inbox), lag_window=60, poll_interval=POLL, batch_size=1)
        async with reopenable_backend() as first:
            assert await names(watcher, first, 2) == ["a", "b"]
        make_file(inbox, "late", T0 + 5 * S)
        make_file(inbox, "sentinel", T0 + 20 * S)
        async with reopenable_backend() as second:
            assert await names(rebuilt(watcher), second, 3) == ["late", "c", "sentinel"]
            assert await second.aget(ASSET.scope, WATERMARK) == {
                "kind": "int",
                "cursor": T0 + 20 * S,
                "key": "sentinel",
            }


class TestDirectoryWatcherStateKeys:
    async def test_two_watchers_on_one_asset_keep_their_own_watermarks(
        self, tmp_path: Path, backend: MemoryStateBackend
    ) -> None:
        """Two watchers of one asset each resume from their own keys, neither skipping the other's."""
        first, second = tmp_path / "first", tmp_path / "second"
        first.mkdir()
        second.mkdir()
        make_file(first, "a1", T0 + 100 * S)
        make_file(second, "b1", T0)  # far behind a1: a shared watermark would skip it
        a = DirectoryWatcher(str(first), lag_window=60, poll_interval=POLL)
        b = DirectoryWatcher(str(second), lag_window=60, poll_interval=POLL)
        assert await names(a, backend, 1, name="a_feed") == ["a1"]
        assert await names(b, backend, 1, name="b_feed") == ["b1"]
        make_file(first, "a2", T0 + 101 * S)
        make_file(second, "b2", T0 + S)
        assert await names(rebuilt(a), backend, 1, name="a_feed") == ["a2"]
        assert await names(rebuilt(b), backend, 1, name="b_feed") == ["b2"]
        state = {e.key: e.value for e in await backend.alist(ASSET.scope)}
        assert state["a_feed.watermark"] == {"kind": "int", "cursor": T0 + 101 * S, "key": "a2"}
        assert state["b_feed.watermark"] == {"kind": "int", "cursor": T0 + S, "key": "b2"}
        assert sorted(state) == [
            "a_feed.recent",
            "a_feed.watermark",
            "b_feed.recent",
            "b_feed.watermark",
        ]

    async def test_the_old_keys_are_adopted_and_nothing_is_emitted_twice(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """State saved under the old 'watermark'/'recent' keys resumes there, then moves over."""
        make_file(inbox, "a", T0)
        make_file(inbox, "b", T0 + 10 * S)
        make_file(inbox, "late", T0 + 5 * S)
        await backend.events.aregister_assets([ASSET])
        # What the previous version committed after emitting a, b and then the late file.
        await backend.aset(ASSET.scope, "watermark", {"mtime_ns": T0 + 10 * S, "name": "b"})
        old_recent = {
            "floor": None,
            "names": ["a", "b", "late"],
            "mtimes_ns": [T0, T0 + 10 * S, T0 + 5 * S],
        }
        await backend.aset(ASSET.scope, "recent", old_recent)
        make_file(inbox, "late-but-new", T0 + 6 * S)
        make_file(inbox, "c", T0 + 20 * S)
        watcher = DirectoryWatcher(str(inbox), lag_window=60, poll_interval=POLL)
        assert await names(watcher, backend, 2) == ["late-but-new", "c"]
        assert await backend.aget(ASSET.scope, WATERMARK) == {
            "kind": "int",
            "cursor": T0 + 20 * S,
            "key": "c",
        }
        recent = await backend.aget(ASSET.scope, RECENT)
        assert recent["keys"] == ["a", "late", "b", "late-but-new", "c"]
        # The old keys stay (other watchers of the asset may still need them) but are not read
        # again: resuming from them would emit c a second time.
        assert await backend.aget(ASSET.scope, "recent") == old_recent
        make_file(inbox, "sentinel", T0 + 30 * S)
        assert await names(rebuilt(watcher), backend, 1) == ["sentinel"]

    async def test_an_old_watermark_of_another_kind_is_left_alone(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """An old 'watermark' that is not a directory watcher's (a task's) is ignored and kept."""
        await backend.events.aregister_assets([ASSET])
        await backend.aset(ASSET.scope, "watermark", "2024-06-01T00:00:00Z")
        make_file(inbox, "a", T0)
        make_file(inbox, "b", T0 + S)
        watcher = DirectoryWatcher(str(inbox), poll_interval=POLL)
        assert await names(watcher, backend, 2) == ["a", "b"]
        assert await backend.aget(ASSET.scope, "watermark") == "2024-06-01T00:00:00Z"
        assert (await backend.aget(ASSET.scope, WATERMARK))["key"] == "b"

    async def test_the_documented_rewind_emits_the_files_after_the_given_one(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """Setting the watermark, and a recent whose floor is its mtime, resumes right after it."""
        for index, name in enumerate("abcd"):
            make_file(inbox, name, T0 + index * S)
        watcher = DirectoryWatcher(str(inbox), lag_window=60, poll_interval=POLL)
        assert await names(watcher, backend, 4) == ["a", "b", "c", "d"]
        await backend.aset(ASSET.scope, WATERMARK, {"kind": "int", "cursor": T0 + S, "key": "b"})
        await backend.aset(ASSET.scope, RECENT, {"floor": T0 + S, "cursors": [], "keys": []})
        assert await names(rebuilt(watcher), backend, 2) == ["c", "d"]
        make_file(inbox, "sentinel", T0 + 10 * S)
        assert await names(rebuilt(watcher), backend, 1) == ["sentinel"]

    async def test_the_state_keys_follow_the_bound_watcher_name(
        self, inbox: Path, backend: MemoryStateBackend
    ) -> None:
        """Without a name given, run_trigger binds the class name, and the keys carry it."""
        make_file(inbox, "a", T0)
        watcher = DirectoryWatcher(str(inbox), poll_interval=POLL)
        await run_trigger(watcher, assets=ASSET, backend=backend, max_events=1, timeout=10)
        keys = sorted(e.key for e in await backend.alist(ASSET.scope))
        assert keys == ["DirectoryWatcher.recent", "DirectoryWatcher.watermark"]
