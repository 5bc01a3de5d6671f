"""Each try's output kept with its run, in the worker's process: what concurrent tries print
and log never mixes, the threads and tasks a try starts write to its logs, the cap keeps the
tail, secrets are masked, and output outside a try still reaches the process's streams."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, LogChunk, encode_json
from watchkeeper.triggerer import Asset, Worker, WorkerSettings, asset_task

from tests.triggerer.test_worker import wait_runs

LEFT, RIGHT = Asset("left"), Asset("right")
FAST = WorkerSettings(concurrency=4, poll_interval=0.01, heartbeat_interval=0.5)
LINES = 20


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    """A built-in backend with the test assets registered."""
    await backend.events.aregister_assets([LEFT, RIGHT])
    yield backend


async def run_tasks(
    store: Any, *tasks: Any, settings: WorkerSettings = FAST, events: tuple[Asset, ...] = ()
) -> dict[str, list[LogChunk]]:
    """Run ``tasks`` on one event of each of ``events`` until every run succeeded; each
    task's run's logs, read as soon as the run is recorded."""
    logs: dict[str, list[LogChunk]] = {}
    async with anyio.create_task_group() as tg:
        worker = Worker(store, tasks, settings)
        await tg.start(worker.run)
        for asset in events:
            commit = EventCommit("feed", (asset.name,), encode_json({"n": 1}, what="payload"))
            await store.events.acommit(commit)
        for task in tasks:
            (run,) = await wait_runs(store, task.name, "success", 1)
            logs[task.name] = await store.logs.alist(run.id)
        tg.cancel_scope.cancel()
    return logs


def joined(chunks: list[LogChunk], stream: str) -> str:
    return "".join(c.text for c in chunks if c.stream == stream)


class TestNoMixing:
    async def test_concurrent_sync_tasks(self, store: Any) -> None:
        """Two sync tries printing in turn (a barrier between lines) keep their own lines,
        in order, stdout and stderr apart."""
        barrier = threading.Barrier(2, timeout=20)

        def talk(name: str) -> None:
            for i in range(LINES):
                print(f"{name} out {i}")
                print(f"{name} err {i}", file=sys.stderr)
                barrier.wait()

        @asset_task(schedule=[LEFT])
        def left(**_: Any) -> None:
            talk("left")

        @asset_task(schedule=[RIGHT])
        def right(**_: Any) -> None:
            talk("right")

        logs = await run_tasks(store, left, right, events=(LEFT, RIGHT))
        for name in ("left", "right"):
            assert joined(logs[name], "stdout") == "".join(
                f"{name} out {i}\n" for i in range(LINES)
            )
            assert joined(logs[name], "stderr") == "".join(
                f"{name} err {i}\n" for i in range(LINES)
            )
            assert {c.try_number for c in logs[name]} == {1}

    async def test_concurrent_async_tasks_their_threads_and_tasks(self, store: Any) -> None:
        """Two async tries interleaving on the loop keep their own prints and log records,
        also those of the threads (``to_thread``) and tasks they start."""
        both = anyio.Event()
        started: list[str] = []

        async def talk(name: str) -> None:
            started.append(name)
            if len(started) == 2:
                both.set()
            with anyio.fail_after(20):
                await both.wait()
            for i in range(LINES):
                print(f"{name} {i}")
                await anyio.sleep(0.001)
            logging.getLogger(f"tasks.{name}").warning("%s warns", name)
            await anyio.to_thread.run_sync(print, f"{name} from a thread")
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, print, f"{name} from a task's thread")

        @asset_task(schedule=[LEFT])
        async def left(**_: Any) -> None:
            await talk("left")

        @asset_task(schedule=[RIGHT])
        async def right(**_: Any) -> None:
            await talk("right")

        logs = await run_tasks(store, left, right, events=(LEFT, RIGHT))
        for name in ("left", "right"):
            lines = "".join(f"{name} {i}\n" for i in range(LINES))
            threads = f"{name} from a thread\n{name} from a task's thread\n"
            assert joined(logs[name], "stdout") == lines + threads
            (record,) = joined(logs[name], "log").splitlines()
            assert record.endswith(f"WARNING tasks.{name}: {name} warns")


class TestText:
    async def test_the_cap_keeps_the_tail(self, store: Any) -> None:
        """A try printing more than ``[worker] log_max_bytes`` keeps its last lines."""

        @asset_task(schedule=[LEFT])
        def chatty(**_: Any) -> None:
            for i in range(1000):
                print(f"line {i:04}")

        settings = WorkerSettings(poll_interval=0.01, log_max_bytes=100)
        logs = await run_tasks(store, chatty, settings=settings, events=(LEFT,))
        text = joined(logs["chatty"], "stdout")
        assert len(text.encode()) <= 100
        assert text.endswith("line 0998\nline 0999\n")
        assert "line 0000" not in text

    async def test_secrets_are_masked(self, store: Any) -> None:
        """A password in a printed URL is stored masked."""

        @asset_task(schedule=[LEFT])
        def leaky(**_: Any) -> None:
            print("connecting to postgresql://app:hunter2@db.internal/orders")

        logs = await run_tasks(store, leaky, events=(LEFT,))
        text = joined(logs["leaky"], "stdout")
        assert "hunter2" not in text and "postgresql://app:***@db.internal/orders" in text

    async def test_output_outside_a_try_goes_to_the_process(
        self, store: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """While the worker runs, a print outside any try reaches the process's stdout; a
        try's print does not."""

        @asset_task(schedule=[LEFT])
        def quiet(**_: Any) -> None:
            print("inside the try")

        async with anyio.create_task_group() as tg:
            worker = Worker(store, [quiet], FAST)
            await tg.start(worker.run)
            print("outside any try")
            commit = EventCommit("feed", ("left",), encode_json({"n": 1}, what="payload"))
            await store.events.acommit(commit)
            (run,) = await wait_runs(store, "quiet", "success", 1)
            tg.cancel_scope.cancel()
        out = capsys.readouterr().out
        assert "outside any try" in out and "inside the try" not in out
        assert joined(await store.logs.alist(run.id), "stdout") == "inside the try\n"

    async def test_zero_keeps_no_logs(self, store: Any, capsys: pytest.CaptureFixture[str]) -> None:
        """``log_max_bytes = 0``: nothing is kept, the try prints to the process's stdout."""

        @asset_task(schedule=[LEFT])
        def plain(**_: Any) -> None:
            print("to the process")

        settings = WorkerSettings(poll_interval=0.01, log_max_bytes=0)
        logs = await run_tasks(store, plain, settings=settings, events=(LEFT,))
        assert logs["plain"] == []
        assert "to the process" in capsys.readouterr().out
