"""The traceback a failed run records starts at the task's own code, not at the worker's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from watchkeeper.store import SqliteStateBackend
from watchkeeper.store.protocols import EventCommit
from watchkeeper.triggerer import Asset, Worker, WorkerSettings, asset_task

ORDERS = Asset("orders")


def _parse(number: str) -> int:
    return int(number)


@asset_task(schedule=[ORDERS], retries=0)
def sync_fails(**context: Any) -> None:
    _parse("not a number")


@asset_task(schedule=[ORDERS], retries=0)
async def async_fails(**context: Any) -> None:
    await anyio.lowlevel.checkpoint()
    try:
        _parse("nope")
    except ValueError as exc:
        raise RuntimeError("loading orders failed") from exc


@pytest.fixture
async def store(tmp_path: Any) -> AsyncIterator[SqliteStateBackend]:
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets([ORDERS])
        yield backend


def frames(text: str) -> list[str]:
    """The ``File "...", line N, in NAME`` lines of a formatted traceback, in order."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith('File "')]


async def recorded_traceback(store: SqliteStateBackend, task: Any) -> str:
    worker = Worker(store, [task], WorkerSettings(poll_interval=0.01))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await store.events.acommit(EventCommit("feed", ("orders",), "{}"))
        with anyio.fail_after(20):
            while not (runs := await store.tasks.alist_runs(task=task.name, state="failed")):  # noqa: ASYNC110 - polls the store
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    run = await store.tasks.aget_run(runs[0].id)
    (error,) = run.errors
    assert error.traceback is not None
    return error.traceback


class TestRecordedTraceback:
    async def test_a_sync_task_shows_its_own_frames_only(self, store: SqliteStateBackend) -> None:
        """A task run in a thread: the traceback's first frame is the task, its last the
        function it called; no frame of watchkeeper, anyio or the thread pool comes first."""
        text = await recorded_traceback(store, sync_fails)
        shown = frames(text)
        assert text.startswith("Traceback (most recent call last):\n")
        assert shown[0].startswith(f'File "{__file__}"') and shown[0].endswith("in sync_fails")
        assert shown[-1].endswith("in _parse") and len(shown) == 2, text
        assert text.rstrip().endswith(
            "ValueError: invalid literal for int() with base 10: 'not a number'"
        )

    async def test_an_async_task_and_its_chained_cause(self, store: SqliteStateBackend) -> None:
        """A task on the loop (greenback portal) with a chained cause: both tracebacks start
        at the task's code."""
        text = await recorded_traceback(store, async_fails)
        assert "The above exception was the direct cause" in text
        assert all(line.startswith(f'File "{__file__}"') for line in frames(text)), text
        assert text.rstrip().endswith("RuntimeError: loading orders failed")
