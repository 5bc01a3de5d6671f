"""The watchers of the definitions, run through the real runtime with the test kit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline import order_files, orders
from watchkeeper.store import BaseStateBackend
from watchkeeper.triggerer.testing import WatcherHarness, run_trigger
from watchkeeper.watchers import DirectoryWatcher, NatsJetStreamWatcher


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_definitions_watch_the_configured_sources() -> None:
    (stream,) = orders.watchers
    (inbox,) = order_files.watchers
    assert isinstance(stream.trigger, NatsJetStreamWatcher)
    assert isinstance(inbox.trigger, DirectoryWatcher)
    assert inbox.trigger.params.pattern == "*.json"


@pytest.mark.parametrize("wk_backend", ["memory", "sqlite"], indirect=True)
async def test_each_dropped_file_is_one_event_once(
    tmp_path: Path, wk_backend: BaseStateBackend, wk_harness: WatcherHarness
) -> None:
    """Two files make two events; after a restart (a new instance from ``serialize()``) they
    are not emitted again, and a third file is."""
    for n in (1, 2):
        (tmp_path / f"order-{n}.json").write_text(json.dumps({"id": str(n)}))
    (tmp_path / "notes.txt").write_text("not an order")
    watcher = DirectoryWatcher(str(tmp_path), pattern="*.json", poll_interval=0.05)
    first = await run_trigger(watcher, assets=order_files, backend=wk_backend, max_events=2)
    assert sorted(e.payload["name"] for e in first) == ["order-1.json", "order-2.json"]
    (tmp_path / "order-3.json").write_text(json.dumps({"id": "3"}))
    again = await wk_harness.restart(watcher, assets=order_files, max_events=1, timeout=10)
    assert [e.payload["name"] for e in again.events] == ["order-3.json"]
