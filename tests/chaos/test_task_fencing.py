"""A killed worker's try is retried with its state; a frozen worker's late success is refused.

Real ``watchkeeper worker`` processes on SQLite, real SIGKILL, SIGSTOP and SIGCONT. The task's
first try announces itself with a marker file and then waits for a go file, so the test knows
when the try is inside the task.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from watchkeeper.store import (
    Asset,
    SqliteStateBackend,
)
from watchkeeper.store.protocols import EventCommit

from tests.chaos._task_chaos import COMMAND

pytestmark = [pytest.mark.timeout(120)]


def definitions(marker: Path, go: Path) -> str:
    return textwrap.dedent(
        f"""
        import os
        import time

        from watchkeeper.triggerer import Asset, asset_task

        src = Asset("src")
        out = Asset("out")


        @asset_task(schedule=[src], outlets=[out], retries=5, retry_delay=0.01)
        def slow_first(*, try_number, task_state_store, outlet_events, **_):
            previous = task_state_store.get("wrote")
            task_state_store.set("wrote", try_number)
            outlet_events[out].extra = {{"try": try_number, "previous": previous}}
            if try_number == 1:
                open({str(marker)!r}, "w").close()
                while not os.path.exists({str(go)!r}):
                    time.sleep(0.01)
        """
    )


class Workers:
    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "state.db"
        self.marker, self.go = tmp_path / "first_try_running", tmp_path / "go"
        self.defs = tmp_path / "defs"
        self.defs.mkdir()
        (self.defs / "tasks.py").write_text(definitions(self.marker, self.go))
        self.cwd = tmp_path
        self.logs: list[Path] = []

    async def start(self) -> Process:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            {
                "WATCHKEEPER__DATABASE__URL": f"sqlite:///{self.db}",
                "WATCHKEEPER__WORKER__POLL_INTERVAL": "0.02",
                "WATCHKEEPER__WORKER__HEARTBEAT_INTERVAL": "0.3",
                "WATCHKEEPER__WORKER__LEASE_TTL": "1.0",
                "WATCHKEEPER__LOGGING__FORMAT": "json",
            }
        )
        log = self.cwd / f"worker{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("ab") as out:
            return await anyio.open_process(
                [*COMMAND, "worker", "--watchers-path", str(self.defs)],
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )

    async def wait_declared(self) -> None:
        with anyio.fail_after(30):
            while True:
                if self.db.exists():
                    async with SqliteStateBackend(self.db) as backend:
                        if await backend.tasks.alist_tasks():
                            return
                await anyio.sleep(0.1)

    async def emit(self) -> None:
        async with SqliteStateBackend(self.db) as backend:
            await backend.events.aregister_assets([Asset("src")])
            await backend.events.acommit(EventCommit("feed", ("src",), "{}"))

    async def wait_file(self, path: Path) -> None:
        with anyio.fail_after(30):
            while True:
                if await anyio.Path(path).exists():
                    return
                await anyio.sleep(0.02)

    async def wait_success(self) -> Any:
        with anyio.fail_after(30):
            while True:
                async with SqliteStateBackend(self.db) as backend:
                    runs = await backend.tasks.alist_runs(state="success")
                    if runs:
                        return runs[0], await backend.events.alist_events(asset="out")
                await anyio.sleep(0.05)

    def log_events(self, index: int) -> list[str]:
        lines = self.logs[index].read_text(errors="replace").splitlines()
        return [json.loads(line).get("event", "") for line in lines if line.startswith("{")]


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[Workers]:
    """A definitions folder with the two-phase task and an SQLite file."""
    yield Workers(tmp_path)


async def finish(process: Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            await process.wait()


class TestKilledTry:
    async def test_retry_after_sigkill_sees_the_killed_tries_state(self, workers: Workers) -> None:
        """A worker killed inside try 1 leaves state that try 2, on a new worker, reads."""
        first = await workers.start()
        await workers.wait_declared()
        await workers.emit()
        await workers.wait_file(workers.marker)
        first.send_signal(signal.SIGKILL)
        await first.wait()
        workers.go.touch()  # the restarted worker's try 2 does not wait anyway
        second = await workers.start()
        try:
            run, events = await workers.wait_success()
        finally:
            await finish(second)
        assert run.try_number == 2
        assert "lapsed" in run.errors[0].error
        assert [e.payload for e in events] == [{"try": 2, "previous": 1}]


class TestFrozenWorker:
    async def test_sigstopped_worker_cannot_succeed_after_its_lease_moved(
        self, workers: Workers
    ) -> None:
        """A worker frozen past its lease loses the run to another; on SIGCONT its success
        is refused and emits nothing."""
        frozen = await workers.start()
        other: Process | None = None
        try:
            await workers.wait_declared()
            await workers.emit()
            await workers.wait_file(workers.marker)
            frozen.send_signal(signal.SIGSTOP)
            other = await workers.start()
            run, events = await workers.wait_success()
            assert run.try_number == 2
            workers.go.touch()
            frozen.send_signal(signal.SIGCONT)
            with anyio.fail_after(30):
                while True:
                    if {"run_fenced", "run_lease_lost"} & set(workers.log_events(0)):
                        break
                    await anyio.sleep(0.05)
            await finish(frozen)
            async with SqliteStateBackend(workers.db) as backend:
                after = await backend.events.alist_events(asset="out")
                (final,) = await backend.tasks.alist_runs()
        finally:
            await finish(frozen)
            if other is not None:
                await finish(other)
        assert after == events and [e.payload for e in after] == [{"try": 2, "previous": 1}]
        assert final.state == "success" and final.try_number == 2
        assert "run_finished" not in workers.log_events(0)
