"""``watchkeeper worker`` following its definition files: a real worker process on SQLite,
its definition file edited, broken, emptied of a task and restored while it runs."""

from __future__ import annotations

import os
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, encode_json

from tests.support.daemons import log_events, reap, terminate, wait_until, watchkeeper_command


def definitions(version: int, *, with_report: bool = True) -> str:
    """A file with ``audit`` (always there) and, unless left out, ``build_report``, whose
    outlet says which ``version`` of its code ran."""
    report = textwrap.dedent(
        f"""

        @asset_task(schedule=[orders], outlets=[report], retries=0)
        def build_report(*, triggering_asset_events, outlet_events, **context):
            outlet_events[report].extra = {{"version": {version}}}
        """
    )
    return textwrap.dedent(
        """
        from watchkeeper.triggerer import Asset, asset_task

        orders = Asset("orders")
        report = Asset("order_report")


        @asset_task(schedule=[orders], retries=0)
        def audit(**context):
            pass
        """
    ) + (report if with_report else "")


class Env:
    def __init__(self, tmp_path: Path, isolation: str = "none") -> None:
        self.tmp_path = tmp_path
        self.isolation = isolation
        self.db = tmp_path / "state.db"
        self.defs = tmp_path / "defs"
        self.defs.mkdir()
        self.file = self.defs / "tasks.py"
        self.file.write_text(definitions(1))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            {
                "WATCHKEEPER__DATABASE__URL": f"sqlite:///{self.db}",
                "WATCHKEEPER__WORKER__POLL_INTERVAL": "0.02",
                "WATCHKEEPER__WORKER__RELOAD_INTERVAL": "0.1",
                "WATCHKEEPER__WORKER__ISOLATION": self.isolation,
                "WATCHKEEPER__WORKER__CONCURRENCY": "2",  # few children to start on a busy machine
                "WATCHKEEPER__LOGGING__FORMAT": "json",
            }
        )
        return env

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [e for e in log_events(self.tmp_path) if e.get("event") == event]

    async def emit(self, n: int) -> None:
        async with SqliteStateBackend(self.db) as backend:
            await backend.events.aregister_assets([Asset("orders")])
            await backend.events.acommit(
                EventCommit("feed", ("orders",), encode_json({"n": n}, what="payload"))
            )

    async def versions(self) -> list[int]:
        """The code versions of build_report that ran, in run order."""
        async with SqliteStateBackend(self.db) as backend:
            events = await backend.events.alist_events(asset="order_report")
        return [int(e.payload["version"]) for e in events]

    async def runs(self, task: str) -> list[Any]:
        async with SqliteStateBackend(self.db) as backend:
            return await backend.tasks.alist_runs(task=task, state="success")

    async def task(self, name: str) -> Any:
        async with SqliteStateBackend(self.db) as backend:
            (info,) = [t for t in await backend.tasks.alist_tasks() if t.name == name]
        return info

    async def rewrite(self, text: str, reloads: int) -> None:
        """Write the definition file and wait for the worker's next reload to be logged."""
        self.file.write_text(text)
        await wait_until(
            lambda: len(self.logged("tasks_reloaded")) + len(self.logged("task_refused")) > reloads,
            "the worker to reload",
        )


@pytest.fixture(params=["none", "process"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    """The definitions and the database; tries in the worker, or in child processes."""
    yield Env(tmp_path, request.param)


@pytest.fixture
async def worker(env: Env) -> AsyncIterator[anyio.abc.Process]:
    with (env.tmp_path / "daemon.log").open("wb") as log:
        process = await start_worker(env, log)
        try:
            yield process
        finally:
            await reap(process)


async def start_worker(env: Env, log: IO[bytes]) -> anyio.abc.Process:
    return await anyio.open_process(
        watchkeeper_command("worker", "--watchers-path", str(env.defs)),
        stdin=None,
        stdout=log,
        stderr=log,
        cwd=env.tmp_path,
        env=env.env(),
    )


class TestWorkerFollowsFiles:
    async def test_changed_code_applies_to_the_next_runs(
        self, env: Env, worker: anyio.abc.Process
    ) -> None:
        """An edited task runs its new code for the events after the reload; a file that
        does not import is refused, named in the log, and the previous code keeps running."""
        await wait_until(lambda: env.logged("worker_started"), "the worker to start", worker)
        await env.emit(1)
        await wait_until(lambda: _has(env.versions, [1]), "version 1 to run", worker)

        await env.rewrite(definitions(2), reloads=0)
        await env.emit(2)
        await wait_until(lambda: _has(env.versions, [1, 2]), "version 2 to run", worker)

        await env.rewrite(definitions(3) + "\ndef broken(:\n", reloads=1)
        (refused,) = env.logged("task_refused")
        assert refused["file"] == "tasks.py" and "SyntaxError" in refused["reason"]
        await env.emit(3)
        await wait_until(lambda: _has(env.versions, [1, 2, 2]), "version 2 to run again", worker)
        assert await terminate(worker) == 0

    @pytest.mark.parametrize("env", ["none"], indirect=True)
    async def test_a_removed_task_keeps_its_events_until_it_comes_back(
        self, env: Env, worker: anyio.abc.Process
    ) -> None:
        """A task gone from the file gets no new runs and is listed as removed, its events
        pending; defined again, it runs them with its new code; deleted, it is forgotten and
        its runs stay."""
        await wait_until(lambda: env.logged("worker_started"), "the worker to start", worker)
        await env.emit(1)
        await wait_until(lambda: _has(env.versions, [1]), "version 1 to run", worker)

        await env.rewrite(definitions(1, with_report=False), reloads=0)
        (reloaded,) = env.logged("tasks_reloaded")
        assert reloaded["removed"] == ["build_report"]
        await env.emit(2)
        await wait_until(lambda: _count(env.runs("audit"), 2), "audit to run again", worker)
        info = await env.task("build_report")
        assert info.removed and info.pending == {"orders": 1}
        assert len(await env.runs("build_report")) == 1  # audit's run was made: none for it

        await env.rewrite(definitions(4), reloads=1)
        await wait_until(lambda: _has(env.versions, [1, 4]), "the pending event to run", worker)
        assert not (await env.task("build_report")).removed
        assert await terminate(worker) == 0

        done = await anyio.run_process(
            watchkeeper_command("tasks", "delete", "build_report", "--yes"),
            cwd=env.tmp_path, env=env.env(), check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        async with SqliteStateBackend(env.db) as backend:
            assert [t.name for t in await backend.tasks.alist_tasks()] == ["audit"]
        assert len(await env.runs("build_report")) == 2


async def _count(runs: Any, expected: int) -> bool:
    return len(await runs) >= expected


async def _has(versions: Any, expected: list[int]) -> bool:
    found = await versions()
    assert found == expected[: len(found)], found  # never another version in between
    return bool(found == expected)
