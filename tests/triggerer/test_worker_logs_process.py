"""Each try's output kept with its run, across processes: tries in child processes
(``isolation="process"``) keep their own output apart, and a real ``watchkeeper worker``
SIGKILLed mid-try keeps every line it had flushed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, LogChunk, encode_json
from watchkeeper.triggerer import load_settings
from watchkeeper.triggerer.worker import Worker, load_tasks

from tests.support.daemons import wait_until

COMMAND = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]

ISOLATED = textwrap.dedent(
    """
    import logging
    import os
    import time
    from pathlib import Path

    from watchkeeper.triggerer import Asset, asset_task


    def talk(name, here):
        Path(here, name).touch()
        while not all(Path(here, n).exists() for n in ("left", "right")):
            time.sleep(0.01)
        for i in range(20):
            print(f"{name} {i} pid {os.getpid()}", flush=True)
            time.sleep(0.005)
        logging.getLogger(name).warning("%s is done", name)


    @asset_task(schedule=[Asset("left")], isolation="process")
    def left(**_):
        talk("left", os.environ["LOGS_TEST_DIR"])


    @asset_task(schedule=[Asset("right")], isolation="process")
    def right(**_):
        talk("right", os.environ["LOGS_TEST_DIR"])
    """
)


def stdout_of(chunks: list[LogChunk]) -> str:
    return "".join(c.text for c in chunks if c.stream == "stdout")


async def test_process_isolated_tries_keep_their_own_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tries in two child processes, printing at once, each keep their own lines (from
    their own child) and their own log record."""
    defs = tmp_path / "defs"
    defs.mkdir()
    (defs / "tasks.py").write_text(ISOLATED)
    monkeypatch.setenv("LOGS_TEST_DIR", str(tmp_path))  # the children inherit it
    settings = load_settings(
        database={"url": f"sqlite:///{tmp_path / 'state.db'}"},
        triggerer={"watchers_path": str(defs)},
        worker={"poll_interval": 0.02, "concurrency": 2},
    )
    tasks, errors = await anyio.to_thread.run_sync(load_tasks, defs)
    assert errors == ()
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        worker = Worker(backend, tasks, process_settings=settings)
        await worker.declare()
        for name in ("left", "right"):
            await backend.events.acommit(EventCommit("feed", (name,), encode_json({"n": 1})))
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            with anyio.fail_after(90):
                while True:
                    runs = await backend.tasks.alist_runs(state="success")
                    if len(runs) == 2:
                        break
                    await anyio.sleep(0.05)
            logs = {r.task: await backend.logs.alist(r.id) for r in runs}
            tg.cancel_scope.cancel()
    pids = set()
    for name in ("left", "right"):
        lines = stdout_of(logs[name]).splitlines()
        assert [line.split(" pid ")[0] for line in lines] == [f"{name} {i}" for i in range(20)]
        pids |= {line.split(" pid ")[1] for line in lines}
        (record,) = [c.text for c in logs[name] if c.stream == "log"]
        assert record.rstrip("\n").endswith(f"WARNING {name}: {name} is done")
    assert len(pids) == 2 and str(os.getpid()) not in pids  # two children, not the worker


TALKER = textwrap.dedent(
    """
    import time

    from watchkeeper.triggerer import Asset, asset_task


    @asset_task(schedule=[Asset("orders")])
    def talker(**_):
        i = 0
        while True:  # until the worker is killed
            print(f"line {i}")
            i += 1
            time.sleep(0.01)
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


async def test_a_sigkilled_worker_keeps_what_it_flushed(tmp_path: Path) -> None:
    """A try printing a numbered line every 10 ms, its worker SIGKILLed once lines are
    stored: what is stored afterwards is every line from the first on, in order, with no
    gap, and holds at least what was seen stored before the kill."""
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "tasks.py").write_text(TALKER)
    worker = await anyio.open_process(
        [*COMMAND, "worker", "--watchers-path", str(tmp_path / "defs")],
        cwd=tmp_path,
        env=env_for(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen = ""
    try:
        await wait_until((tmp_path / "state.db").exists, "the worker's database", worker)
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            await wait_until(backend.tasks.alist_tasks, "the task declared", worker)
            await backend.events.aregister_assets([Asset("orders")])
            payload = encode_json({"n": 1}, what="payload")
            await backend.events.acommit(EventCommit("feed", ("orders",), payload))

            async def enough_stored() -> bool:
                nonlocal seen
                runs = await backend.tasks.alist_runs(state="running")
                seen = stdout_of(await backend.logs.alist(runs[0].id)) if runs else ""
                return seen.count("\n") >= 50

            await wait_until(enough_stored, "50 lines stored", worker)
        assert worker.returncode is None
    finally:
        worker.send_signal(signal.SIGKILL)
        code = await worker.wait()
    assert code == -signal.SIGKILL
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        (run,) = await backend.tasks.alist_runs()
        kept = stdout_of(await backend.logs.alist(run.id))
    lines = kept.splitlines()
    assert kept.startswith(seen) and kept.endswith("\n")
    assert lines == [f"line {i}" for i in range(len(lines))]
