"""A try lost with its worker (SIGKILL) does not count against ``retries``: the run is tried
again by the next worker and records the lost try as ``worker_lost``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import anyio
from anyio.abc import Process
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, encode_json

COMMAND = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]

DEFINITIONS = textwrap.dedent(
    """
    import time
    from pathlib import Path

    from watchkeeper.triggerer import Asset, asset_task

    orders = Asset("orders")


    @asset_task(schedule=[orders], retries=0)
    def hangs_first(*, try_number, **_):
        if try_number == 1:
            Path("started").touch()
            time.sleep(600)  # the worker is killed meanwhile
    """
)


def env_for(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        {
            "WATCHKEEPER__DATABASE__URL": f"sqlite:///{tmp_path / 'state.db'}",
            "WATCHKEEPER__WORKER__POLL_INTERVAL": "0.02",
            "WATCHKEEPER__LOGGING__FORMAT": "json",
        }
    )
    return env


async def start_worker(tmp_path: Path) -> Process:
    return await anyio.open_process(
        [*COMMAND, "worker", "--watchers-path", str(tmp_path / "defs")],
        cwd=tmp_path,
        env=env_for(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def runs_json(tmp_path: Path) -> list[dict[str, object]]:
    done = await anyio.run_process(
        [*COMMAND, "runs", "list", "--json"], cwd=tmp_path, env=env_for(tmp_path), check=True
    )
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


async def wait_for(condition: Callable[[], bool]) -> None:
    while True:
        if condition():
            return
        await anyio.sleep(0.05)


async def test_sigkilled_try_is_retried_without_counting(tmp_path: Path) -> None:
    """retries=0, the worker SIGKILLed mid-try: the next worker runs the run again and it
    succeeds; ``runs list --json`` shows try 1 as worker_lost, no failure of the task's."""
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "tasks.py").write_text(DEFINITIONS)
    first = await start_worker(tmp_path)
    try:
        with anyio.fail_after(60):
            await wait_for(lambda: (tmp_path / "state.db").exists())
            async with SqliteStateBackend(tmp_path / "state.db") as backend:
                while True:
                    if await backend.tasks.alist_tasks():
                        break
                    await anyio.sleep(0.05)
                await backend.events.aregister_assets([Asset("orders")])
                payload = encode_json({"n": 1}, what="payload")
                await backend.events.acommit(EventCommit("feed", ("orders",), payload))
            await wait_for(lambda: (tmp_path / "started").exists() or first.returncode is not None)
            assert first.returncode is None
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    second = await start_worker(tmp_path)
    try:
        with anyio.fail_after(60):
            while True:
                (run,) = await runs_json(tmp_path)
                if run["state"] != "running" and run["state"] != "queued":
                    break
                await anyio.sleep(0.1)
    finally:
        second.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            await second.wait()
    assert run["state"] == "success", run
    assert (run["try_number"], run["failures"], run["lost_tries"]) == (2, 0, 1)
    errors = run["errors"]
    assert isinstance(errors, list) and [(e["try"], e["cause"]) for e in errors] == [
        (1, "worker_lost")
    ]
