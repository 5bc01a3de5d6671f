"""``isolation="process"``: each try in a child process of the worker's pool. A task that
segfaults, calls ``os._exit``, runs past ``execution_timeout`` or leaks past the memory cap
fails its own try with the cause recorded; the worker and its other runs carry on."""

from __future__ import annotations

import os
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskRun, encode_json
from watchkeeper.triggerer import asset_task, load_settings
from watchkeeper.triggerer.settings import Settings
from watchkeeper.triggerer.worker import IsolationUnavailableError, Worker, load_tasks

from tests.support.daemons import wait_until

DEFINITIONS = textwrap.dedent(
    """
    import ctypes
    import os
    import time

    from watchkeeper.triggerer import Asset, asset_task

    totals = Asset("totals")


    @asset_task(schedule=[Asset("segv")], isolation="process")
    def segv(**_):
        ctypes.string_at(0)  # reads address 0: SIGSEGV


    @asset_task(schedule=[Asset("exits")], isolation="process")
    def exits(**_):
        os._exit(3)


    @asset_task(schedule=[Asset("sleeps")], isolation="process", execution_timeout=0.5)
    def sleeps(**_):
        time.sleep(60)  # a sync try: in a thread it could only be abandoned


    @asset_task(schedule=[Asset("leaks")], isolation="process")
    def leaks(**_):
        kept = []
        while True:
            kept.append(bytearray(64 * 1024 * 1024))


    @asset_task(schedule=[Asset("raises")], isolation="process")
    def raises(**_):
        raise ValueError("bad row 7")


    @asset_task(schedule=[Asset("fine")], outlets=[totals], isolation="process")
    def fine(*, triggering_asset_events, outlet_events, asset_state_store, **context):
        (event,) = triggering_asset_events[Asset("fine")]
        asset_state_store[totals].set("last", event.payload)
        outlet_events[totals].extra = {"pid": os.getpid(), "seen": event.payload}


    @asset_task(schedule=[Asset("inline")])
    def inline(**_):
        pass


    @asset_task(
        schedule=[Asset("strict")], isolation="process", retries=3, retry_on=ConnectionError
    )
    def strict(**_):
        raise ValueError("bad row 7")


    @asset_task(
        schedule=[Asset("flaky")], isolation="process", retries=3, retry_delay=0.01,
        retry_on=[OSError],
    )
    def flaky(try_number, **_):
        if try_number == 1:
            raise ConnectionResetError("hung up")
    """
)


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.defs = tmp_path / "defs"
        self.defs.mkdir()
        (self.defs / "tasks.py").write_text(DEFINITIONS)
        self.db = tmp_path / "state.db"
        self.settings: Settings = load_settings(
            database={"url": f"sqlite:///{self.db}"},
            triggerer={"watchers_path": str(self.defs)},
            worker={"poll_interval": 0.02, "concurrency": 4, "process_memory_limit_mb": 1024},
        )


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    yield Env(tmp_path)


async def _run_until_settled(env: Env, assets: list[str]) -> dict[str, TaskRun]:
    """Run a worker with the definitions' tasks, commit one event on each of ``assets``, and
    return each task's run once every run has settled."""
    tasks, errors = await anyio.to_thread.run_sync(load_tasks, env.defs)
    assert errors == ()
    async with SqliteStateBackend(env.db) as backend:
        worker = Worker(backend, tasks, process_settings=env.settings)
        await worker.declare()
        for name in assets:
            await backend.events.acommit(EventCommit("feed", (name,), encode_json({"n": 1})))
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            with anyio.fail_after(90):
                while True:
                    runs = await backend.tasks.alist_runs()
                    if len(runs) == len(assets) and all(
                        r.state in ("success", "failed") for r in runs
                    ):
                        break
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        return {r.task: r for r in runs}


class TestProcessIsolation:
    @pytest.mark.slow
    async def test_crashes_fail_their_own_try_and_the_rest_runs(self, env: Env) -> None:
        runs = await _run_until_settled(
            env, ["segv", "exits", "sleeps", "leaks", "raises", "fine", "inline"]
        )
        states = {name: run.state for name, run in runs.items()}
        assert states == {
            "segv": "failed",
            "exits": "failed",
            "sleeps": "failed",
            "leaks": "failed",
            "raises": "failed",
            "fine": "success",
            "inline": "success",
        }
        errors = {name: run.errors[-1] for name, run in runs.items() if run.errors}
        assert "killed by SIGSEGV" in errors["segv"].error
        assert "exited with status 3" in errors["exits"].error
        assert errors["sleeps"].cause == "timeout"
        assert "execution_timeout of 0.5 s" in errors["sleeps"].error
        assert "MemoryError" in errors["leaks"].error
        assert errors["raises"].error == "ValueError: bad row 7"
        assert errors["raises"].traceback is not None
        assert "raise ValueError" in errors["raises"].traceback
        async with SqliteStateBackend(env.db) as backend:
            (outlet,) = [e for e in await backend.events.alist_events() if e.asset == "totals"]
        assert outlet.payload["seen"] == {"n": 1}
        assert outlet.payload["pid"] != os.getpid()  # it ran in a child

    async def test_retry_on_matches_a_child_s_error_by_its_type(self, env: Env) -> None:
        """The child's exception type (and its bases) decide: a ``ValueError`` the task's
        ``retry_on`` does not name fails at once; a ``ConnectionResetError`` (an ``OSError``)
        is retried."""
        runs = await _run_until_settled(env, ["strict", "flaky"])
        assert (runs["strict"].state, runs["strict"].try_number) == ("failed", 1)
        assert runs["strict"].errors[-1].final
        assert (runs["flaky"].state, runs["flaky"].try_number) == ("success", 2)

    async def test_a_crashed_child_is_replaced_for_the_next_try(self, env: Env) -> None:
        """A child killed by a try is not reused: the next task's try gets a new one."""
        runs = await _run_until_settled(env, ["exits", "fine"])
        assert (runs["exits"].state, runs["fine"].state) == ("failed", "success")


def test_process_isolation_needs_the_settings(tmp_path: Path) -> None:
    from watchkeeper.store import Asset, MemoryStateBackend

    @asset_task(schedule=[Asset("a")], isolation="process")
    def isolated(**_: object) -> None:
        pass

    with pytest.raises(IsolationUnavailableError, match="process_settings"):
        Worker(MemoryStateBackend(), [isolated])
    in_memory = load_settings(database={"url": "sqlite:///:memory:"})
    with pytest.raises(IsolationUnavailableError, match="in-memory store"):
        Worker(MemoryStateBackend(), [isolated], process_settings=in_memory)


def test_isolation_is_checked() -> None:
    from watchkeeper.store import Asset

    with pytest.raises(ValueError, match="isolation must be 'none' or 'process', got 'thread'"):
        asset_task(schedule=[Asset("a")], isolation="thread")  # type: ignore[arg-type]


SLEEPER = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    from watchkeeper.triggerer import Asset, asset_task


    @asset_task(schedule=[Asset("naps")], isolation="process")
    def naps(**_):
        Path(os.environ["NAP_PID_FILE"]).write_text(str(os.getpid()))
        time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")  # not a service
async def test_a_killed_worker_takes_its_children_with_it(tmp_path: Path) -> None:
    """SIGKILL of ``watchkeeper worker`` mid-try: the child running the try ends too, so no
    try keeps running behind the retry another worker makes."""
    import signal
    import subprocess
    import sys

    defs = tmp_path / "defs"
    defs.mkdir()
    (defs / "naps.py").write_text(SLEEPER)
    db, pid_file = tmp_path / "state.db", tmp_path / "child.pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        {
            "WATCHKEEPER__DATABASE__URL": f"sqlite:///{db}",
            "WATCHKEEPER__WORKER__POLL_INTERVAL": "0.02",
            "NAP_PID_FILE": str(pid_file),
        }
    )
    command = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]
    worker = await anyio.open_process(
        [*command, "worker", "--watchers-path", str(defs)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_until(
            lambda: backend_has_task(db, "naps"), "the task declared", worker, within=120
        )
        async with SqliteStateBackend(db) as backend:
            await backend.events.acommit(EventCommit("feed", ("naps",), encode_json(1)))
        # A pool of fresh interpreters starts first: seconds each on a busy machine.
        await wait_until(lambda: _read(pid_file), "the try started in a child", worker, within=120)
        child = int(_read(pid_file))
        assert child != worker.pid and _alive(child)
        worker.send_signal(signal.SIGKILL)
        await worker.wait()
        await wait_until(lambda: not _alive(child), "the child ended with its worker")
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


async def backend_has_task(db: Path, name: str) -> bool:
    if not await anyio.Path(db).exists():
        return False
    async with SqliteStateBackend(db) as backend:
        return any(t.name == name for t in await backend.tasks.alist_tasks())
