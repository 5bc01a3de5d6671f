"""Apache Airflow's event triggers under watchkeeper: loaded from Airflow's own asset types,
refused by name when they cannot run, and their state writes held until the next event.

The watcher files are Airflow code (no watchkeeper import), read by the daemon's loader in a
child process and rebuilt in this one, as the daemon does; one load serves the module (Airflow's
first import costs seconds).
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
import structlog
from watchkeeper.store import AssetNotFoundError, AssetScope, SqliteStateBackend
from watchkeeper.triggerer.daemon import LoadResult, WatcherGroup
from watchkeeper.triggerer.daemon._evaluate import aload_watchers
from watchkeeper.triggerer.testing import run_trigger

from tests.support.daemons import wait_until

AIRFLOW_WATCHERS = '''
"""Airflow triggers, written as Airflow's documentation shows them."""

import asyncio
from datetime import timedelta
from pathlib import Path

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class CountingTrigger(BaseEventTrigger):
    """Sets the watermark, reads it back, then yields: one event per number up to ``stop``."""

    def __init__(self, stop, pause=timedelta(0), mark=None):
        super().__init__()
        self.stop = stop
        self.pause = pause
        self.mark = mark

    def serialize(self):
        kwargs = {"stop": self.stop, "pause": self.pause}
        return (f"{__name__}.CountingTrigger", kwargs | ({"mark": self.mark} if self.mark else {}))

    async def run(self):
        state = self.asset_state_store[Asset(name="counted")]
        n = state.get("watermark") or 0
        while n < self.stop:
            n += 1
            state.set("watermark", n)
            seen = await state.aget("watermark")
            if self.mark:  # the test's sign that the watermark is set and the yield to come
                Path(self.mark).write_text(str(n))
            await asyncio.sleep(self.pause.total_seconds())
            yield TriggerEvent({"n": n, "seen": seen})


class PollOnlyTrigger(BaseEventTrigger):
    """Writes its last poll and never yields."""

    def serialize(self):
        return (f"{__name__}.PollOnlyTrigger", {})

    async def run(self):
        await self.asset_state_store.aset("last_poll", 1)
        await asyncio.sleep(3600)
        yield TriggerEvent(None)


class SharedTrigger(BaseEventTrigger):
    """Reads a stream Airflow would share among triggers of one key; cleans up in a file."""

    def __init__(self, items, done):
        super().__init__()
        self.items = items
        self.done = done

    def serialize(self):
        return (f"{__name__}.SharedTrigger", {"items": self.items, "done": self.done})

    def shared_stream_key(self):
        return ("numbers", self.items)

    @classmethod
    async def open_shared_stream(cls, kwargs):
        for i in range(kwargs["items"]):
            yield i

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            if raw % 2 == 0:
                yield TriggerEvent({"even": raw})

    async def run(self):
        raise AssertionError("a trigger with a shared stream key is run through its stream")
        yield

    async def cleanup(self):
        Path(self.done).write_text("cleaned")


counted = Asset(
    name="counted",
    uri="s3://data/counted/",
    watchers=[AssetWatcher(name="counter", trigger=CountingTrigger(5, timedelta(seconds=0)))],
)
polled = Asset(name="polled", watchers=[AssetWatcher(name="poller", trigger=PollOnlyTrigger())])
shared = Asset(
    name="shared", watchers=[AssetWatcher(name="evens", trigger=SharedTrigger(6, "DONE"))]
)
'''

REFUSED_WATCHERS = '''
"""What cannot run here, each refused by name."""

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class SetTrigger(BaseEventTrigger):
    def __init__(self, tags):
        super().__init__()
        self.tags = tags

    def serialize(self):
        return (f"{__name__}.SetTrigger", {"tags": self.tags})

    async def run(self):
        yield TriggerEvent(None)


class AckTrigger(BaseEventTrigger):
    def serialize(self):
        return (f"{__name__}.AckTrigger", {})

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        raise NotImplementedError

    async def run(self):
        yield TriggerEvent(None)


class DriftingTrigger(BaseEventTrigger):
    def __init__(self, n=0):
        super().__init__()
        self.n = n + 1

    def serialize(self):
        return (f"{__name__}.DriftingTrigger", {"n": self.n})

    async def run(self):
        yield TriggerEvent(None)


class NotATrigger:
    def serialize(self):
        return ("x.NotATrigger", {})


class Watcher:
    name = "odd"
    trigger = NotATrigger()


bad = Asset(
    name="bad",
    watchers=[
        AssetWatcher(name="with_set", trigger=SetTrigger({"a"})),
        AssetWatcher(name="ack", trigger=AckTrigger()),
        AssetWatcher(name="drifting", trigger=DriftingTrigger()),
    ],
)
class OddAsset:
    name = "odd"
    uri = None
    watchers = [Watcher()]


odd = OddAsset()
'''


@dataclass(frozen=True)
class Loading:
    """A load, and the process's logging set-up before and after it."""

    result: LoadResult
    before: tuple[object, ...]
    after: tuple[object, ...]


def _logging_setup() -> tuple[object, ...]:
    config = structlog.get_config()
    root = logging.getLogger()
    return (tuple(root.handlers), root.level, tuple(config["processors"]), config["logger_factory"])


@pytest.fixture(scope="module")
def loading(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loading]:
    """The two files above, loaded as the daemon loads them (Airflow's home in a temporary
    directory: importing Airflow creates its logs directory there)."""
    root = tmp_path_factory.mktemp("airflow")
    watchers = root / "watchers"
    watchers.mkdir()
    (watchers / "counting.py").write_text(textwrap.dedent(AIRFLOW_WATCHERS))
    (watchers / "refused.py").write_text(textwrap.dedent(REFUSED_WATCHERS))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_HOME", os.environ.get("AIRFLOW_HOME", str(root / "home")))
        before = _logging_setup()
        # Airflow's first import in the reading child takes seconds, more on a loaded machine.
        result = anyio.run(functools.partial(aload_watchers, watchers, import_timeout=120))
        yield Loading(result, before, _logging_setup())


@pytest.fixture
def loaded(loading: Loading) -> LoadResult:
    return loading.result


def _group(loaded: LoadResult, asset: str) -> WatcherGroup:
    (group,) = [g for g in loaded.groups if any(a.name == asset for a in g.assets)]
    return group


class TestLoading:
    def test_airflow_assets_and_watchers_load(self, loaded: LoadResult) -> None:
        """An Airflow Asset's watcher runs as an AirflowTrigger carrying the Airflow trigger's
        classpath and kwargs (a timedelta tagged), its asset's URI as Airflow normalises it."""
        group = _group(loaded, "counted")
        assert group.classpath == "watchkeeper.airflow.AirflowTrigger"
        assert group.watchers == ("counter",)
        assert group.assets[0].uri == "s3://data/counted"
        assert group.kwargs == {
            "classpath": "watchkeeper_watchers.counting.CountingTrigger",
            "kwargs": {"stop": 5, "pause": {"__watchkeeper_type__": "timedelta", "value": 0.0}},
        }
        inner = group.trigger.airflow_trigger  # type: ignore[attr-defined]
        assert type(inner).__mro__[1].__module__ == "airflow.triggers.base"

    def test_importing_airflow_keeps_our_logging(self, loading: Loading) -> None:
        """Airflow, imported to rebuild its triggers, leaves structlog's configuration and the
        root logger's handlers as they were (it would print every record to stdout)."""
        assert "airflow.triggers.base" in sys.modules
        assert loading.after == loading.before

    def test_what_cannot_run_is_refused_by_name(self, loaded: LoadResult) -> None:
        """A kwarg that is no JSON, Airflow's ack mode, a serialize() that does not rebuild
        the same trigger, and a trigger that is nobody's are each refused, saying why."""
        reasons = {e.watcher: e.reason for e in loaded.errors if e.file == "refused.py"}
        assert "is a set, which cannot be kept as JSON" in reasons["with_set"]
        assert "create_shared_stream_producer" in reasons["ack"]
        assert "serializes differently" in reasons["drifting"]
        assert "not a watchkeeper BaseEventTrigger" in reasons["odd"]
        assert not [g for g in loaded.groups if g.watchers[0] in reasons]


def _raw_rows(path: Path, asset: str) -> tuple[tuple[str, str], str]:
    """The watermark's (value, updated_at) and the last event's created_at, as stored."""
    with sqlite3.connect(path) as conn:
        watermark = conn.execute(
            "SELECT s.value, s.updated_at FROM asset_state s JOIN assets a ON a.id = s.asset_id "
            "WHERE a.name = ? AND s.key = 'watermark'",
            (asset,),
        ).fetchone()
        (created_at,) = conn.execute(
            "SELECT created_at FROM asset_events WHERE asset_name = ? ORDER BY id DESC LIMIT 1",
            (asset,),
        ).fetchone()
    conn.close()
    return (watermark[0], watermark[1]), created_at


async def _polled(backend: SqliteStateBackend) -> bool:
    try:
        return bool(await backend.aget(AssetScope(name="polled"), "last_poll") == 1)
    except AssetNotFoundError:  # run_trigger has not registered it yet
        return False


class TestHeldWrites:
    async def test_watermark_commits_with_its_event(
        self, loaded: LoadResult, tmp_path: Path
    ) -> None:
        """Each watermark written before a yield is read back at once, and commits in the
        event's transaction: the stored watermark's updated_at is the last event's created_at."""
        group = _group(loaded, "counted")
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            events = await run_trigger(
                group.trigger, assets=list(group.assets), backend=backend, timeout=30
            )
            entry = await backend.aget_entry(AssetScope(name="counted"), "watermark")
        assert [e.payload for e in events] == [{"n": n, "seen": n} for n in range(1, 6)]
        assert entry is not None
        assert entry.value == 5
        assert entry.updated_at == events[-1].created_at
        (value, updated_at), created_at = _raw_rows(tmp_path / "state.db", "counted")
        assert (value, updated_at) == ("5", created_at)

    async def test_writes_no_event_follows_commit_after_the_linger(
        self, loaded: LoadResult, tmp_path: Path
    ) -> None:
        """A write that no yield follows commits on its own, once it has lingered."""
        from watchkeeper.airflow import AirflowTrigger

        group = _group(loaded, "polled")
        kwargs = dict(group.kwargs)
        trigger = AirflowTrigger(kwargs["classpath"], kwargs["kwargs"], linger=0.05)
        async with (
            SqliteStateBackend(tmp_path / "state.db") as backend,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(lambda: run_trigger(trigger, assets=list(group.assets), backend=backend))
            await wait_until(lambda: _polled(backend), "the lingering write to commit")
            tg.cancel_scope.cancel()


class TestHooks:
    async def test_a_shared_stream_is_read_through_its_filter_and_cleanup_runs(
        self, loaded: LoadResult, tmp_path: Path
    ) -> None:
        """A trigger with a shared-stream key yields what its filter makes of the stream it
        opens (not its run()), and its cleanup() is awaited when the run ends."""
        from watchkeeper.airflow import AirflowTrigger

        group = _group(loaded, "shared")
        done = tmp_path / "done"
        trigger = AirflowTrigger(group.kwargs["classpath"], {"items": 6, "done": str(done)})
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            events = await run_trigger(trigger, assets=list(group.assets), backend=backend)
        assert [e.payload for e in events] == [{"even": 0}, {"even": 2}, {"even": 4}]
        assert done.read_text() == "cleaned"


def _pause(seconds: float) -> dict[str, object]:
    return {"__watchkeeper_type__": "timedelta", "value": seconds}


class TestTwoStepContrast:
    @pytest.mark.parametrize("hold", [True, False], ids=["held", "two-step"])
    async def test_a_stop_between_the_watermark_and_its_yield(
        self, loaded: LoadResult, tmp_path: Path, hold: bool
    ) -> None:
        """Stopped after it set the watermark and before it yielded, the trigger emits that
        event on its next run when its writes are held; committed at once, as Airflow's
        triggerer commits them, the watermark says the event was seen, and it is lost."""
        from watchkeeper.airflow import AirflowTrigger

        group = _group(loaded, "counted")
        classpath = group.kwargs["classpath"]
        mark = tmp_path / "set"
        first = AirflowTrigger(
            classpath, {"stop": 1, "pause": _pause(60), "mark": str(mark)}, linger=60, hold=hold
        )
        second = AirflowTrigger(classpath, {"stop": 1, "pause": _pause(0)}, hold=hold)
        assets = list(group.assets)
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_trigger(first, assets=assets, backend=backend))
                await wait_until(mark.exists, "the watermark to be set")
                tg.cancel_scope.cancel()  # the daemon stopped, between set() and the yield
            events = await run_trigger(second, assets=assets, backend=backend, timeout=30)
            watermark = await backend.aget(AssetScope(name="counted"), "watermark")
        assert watermark == 1
        if hold:
            assert [e.payload for e in events] == [{"n": 1, "seen": 1}]
        else:
            assert events == []  # lost: the watermark moved without its event
