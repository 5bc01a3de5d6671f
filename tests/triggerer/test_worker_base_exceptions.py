"""A task that raises a ``BaseException`` (``sys.exit``, ``KeyboardInterrupt``, its own
subclass, a cancellation of its own) fails its try; the worker process runs on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskRun, encode_json

COMMAND = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]

# Each raising task on its own asset, so one event makes exactly one run of it.
RAISERS = {
    "sync_exit": ("def", "sys.exit(3)", "SystemExit: 3"),
    "async_exit": ("async def", "sys.exit(3)", "SystemExit: 3"),
    "sync_interrupt": ("def", "raise KeyboardInterrupt", "KeyboardInterrupt"),
    "async_interrupt": ("async def", "raise KeyboardInterrupt", "KeyboardInterrupt"),
    "sync_custom": ("def", "raise Custom('mine')", "Custom: mine"),
    "async_custom": ("async def", "raise Custom('mine')", "Custom: mine"),
    "async_generator_exit": ("async def", "raise GeneratorExit", "GeneratorExit"),
    "async_own_cancel": ("async def", "raise asyncio.CancelledError()", "CancelledError"),
}


def definitions() -> str:
    head = textwrap.dedent(
        """
        import asyncio
        import sys

        from watchkeeper.triggerer import Asset, asset_task


        class Custom(BaseException):
            pass


        good = Asset("good")


        @asset_task(schedule=[good])
        def fine(**_):
            pass
        """
    )
    parts = [head]
    for name, (kind, body, _) in RAISERS.items():
        parts.append(
            f"\n\n@asset_task(schedule=[Asset({name!r})], retries=2, retry_delay=0.01)\n"
            f"{kind} {name}(**_):\n    {body}\n"
        )
    return "".join(parts)


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "state.db"
        self.defs = tmp_path / "defs"
        self.defs.mkdir()
        (self.defs / "tasks.py").write_text(definitions())
        self.cwd = tmp_path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            {
                "WATCHKEEPER__DATABASE__URL": f"sqlite:///{self.db}",
                "WATCHKEEPER__WORKER__POLL_INTERVAL": "0.02",
                "WATCHKEEPER__LOGGING__FORMAT": "json",
            }
        )
        return env

    async def start(self, command: str) -> Process:
        return await anyio.open_process(
            [*COMMAND, command, "--watchers-path", str(self.defs)],
            cwd=self.cwd,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def emit(self, *assets: str) -> None:
        async with SqliteStateBackend(self.db) as backend:
            await backend.events.aregister_assets([Asset(a) for a in assets])
            for asset in assets:
                payload = encode_json({"n": 1}, what="payload")
                await backend.events.acommit(EventCommit("feed", (asset,), payload))

    async def wait_tasks(self, process: Process) -> None:
        with anyio.fail_after(60):
            while True:
                assert process.returncode is None, f"the worker exited: {process.returncode}"
                if self.db.exists():
                    async with SqliteStateBackend(self.db) as backend:
                        if len(await backend.tasks.alist_tasks()) == len(RAISERS) + 1:
                            return
                await anyio.sleep(0.1)

    async def wait_finished(self, process: Process, tasks: set[str]) -> dict[str, TaskRun]:
        with anyio.fail_after(60):
            while True:
                assert process.returncode is None, f"the worker exited: {process.returncode}"
                async with SqliteStateBackend(self.db) as backend:
                    runs = await backend.tasks.alist_runs()
                    done = {
                        r.task: await backend.tasks.aget_run(r.id)
                        for r in runs
                        if r.task in tasks and r.state in ("success", "failed")
                    }
                if set(done) == tasks:
                    return done
                await anyio.sleep(0.1)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    yield Env(tmp_path)


async def stop(process: Process) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with anyio.fail_after(20):
        return await process.wait()


@pytest.mark.parametrize("command", ["worker", "up"])
async def test_base_exceptions_fail_the_try_and_the_worker_runs_on(env: Env, command: str) -> None:
    """Each raising task's run fails after 3 tries (retries=2) in the same process, each try
    recording the exception; a later good run succeeds, and SIGTERM still exits 0."""
    process = await env.start(command)
    try:
        await env.wait_tasks(process)
        await env.emit(*RAISERS)
        failed = await env.wait_finished(process, set(RAISERS))
        await env.emit("good")
        (good,) = (await env.wait_finished(process, {"fine"})).values()
        assert process.returncode is None
    finally:
        status = await stop(process)
    assert status == 0
    assert good.state == "success"
    for name, (_, _, error) in RAISERS.items():
        run: Any = failed[name]
        assert run.state == "failed", name
        assert run.try_number == 3, name
        assert [e.try_number for e in run.errors] == [1, 2, 3], name
        assert all(e.error == error for e in run.errors), (name, run.errors)
        assert all("Traceback" in (e.traceback or "") for e in run.errors), name
