"""``watchkeeper worker``, ``up``, ``tasks`` and ``runs`` as real subprocesses on SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.abc import Process
from watchkeeper.store import (
    Asset,
    SqliteStateBackend,
)
from watchkeeper.store.protocols import (
    EventCommit,
    TaskSpec,
    encode_json,
)

from tests.support.daemons import free_port, wait_for_api

COMMAND = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]

DEFINITIONS = textwrap.dedent(
    """
    from watchkeeper.triggerer import Asset, asset_task

    orders = Asset("orders")
    report = Asset("order_report")


    @asset_task(schedule=[orders], outlets=[report], retries=0)
    def build_report(*, triggering_asset_events, outlet_events, **context):
        payloads = [e.payload for e in triggering_asset_events[orders]]
        if any(p.get("bad") for p in payloads):
            raise ValueError("a bad order")
        outlet_events[report].extra = {"orders": len(payloads)}
    """
)


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "state.db"
        self.defs = tmp_path / "defs"
        self.defs.mkdir()
        (self.defs / "tasks.py").write_text(DEFINITIONS)
        self.cwd = tmp_path
        self.api_port = free_port()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            {
                "WATCHKEEPER__DATABASE__URL": f"sqlite:///{self.db}",
                "WATCHKEEPER__WORKER__POLL_INTERVAL": "0.02",
                "WATCHKEEPER__LOGGING__FORMAT": "json",
                "WATCHKEEPER__API__PORT": str(self.api_port),
                "COLUMNS": "200",
            }
        )
        return env

    async def run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return await anyio.run_process([*COMMAND, *args], check=False, cwd=self.cwd, env=self.env())

    async def start(self, command: str) -> Process:
        return await anyio.open_process(
            [*COMMAND, command, "--watchers-path", str(self.defs)],
            cwd=self.cwd,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    async def json_lines(self, *args: str) -> list[dict[str, Any]]:
        done = await self.run(*args, "--json")
        assert done.returncode == 0, done.stderr.decode()
        return [json.loads(line) for line in done.stdout.decode().splitlines()]

    async def emit(self, *payloads: dict[str, Any]) -> None:
        async with SqliteStateBackend(self.db) as backend:
            await backend.events.aregister_assets([Asset("orders")])
            for payload in payloads:
                await backend.events.acommit(
                    EventCommit("feed", ("orders",), encode_json(payload, what="payload"))
                )

    async def wait_runs(self, state: str, count: int) -> list[dict[str, Any]]:
        with anyio.fail_after(30):
            while True:
                runs = await self.json_lines("runs", "list", "--state", state)
                if len(runs) >= count:
                    return runs
                await anyio.sleep(0.1)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    """Definitions with one task and an empty SQLite file."""
    yield Env(tmp_path)


async def stop(process: Process) -> int:
    process.send_signal(signal.SIGTERM)
    with anyio.fail_after(20):
        return await process.wait()


async def wait_registered(env: Env) -> None:
    with anyio.fail_after(30):
        while True:
            if env.db.exists() and await env.json_lines("tasks", "list"):
                return
            await anyio.sleep(0.1)


class TestWorkerCommand:
    async def test_worker_runs_tasks_and_stops_on_sigterm(self, env: Env) -> None:
        """The worker runs a task on new events, emits its outlet, and exits 0 on SIGTERM."""
        worker = await env.start("worker")
        try:
            await wait_registered(env)
            await env.emit({"n": 1})
            (run,) = await env.wait_runs("success", 1)
        finally:
            status = await stop(worker)
        assert status == 0
        assert run["task"] == "build_report" and run["event_count"] == 1
        async with SqliteStateBackend(env.db) as backend:
            (event,) = await backend.events.alist_events(asset="order_report")
        assert event.payload == {"orders": 1} and run["outlet_event_ids"] == [event.id]
        assert len(run["event_ids"]) == 1 and run["event_ids"][0] < event.id
        older = await env.json_lines("runs", "list", "--before", str(run["id"]))
        assert older == []

    async def test_up_runs_triggerer_and_worker(self, env: Env) -> None:
        """``up`` runs the daemon and the worker in one process and exits 0 on SIGTERM."""
        process = await env.start("up")
        try:
            await wait_registered(env)
            await env.emit({"n": 1})
            await env.wait_runs("success", 1)
            statuses = await env.run("status", "--json")
        finally:
            status = await stop(process)
        assert status == 0
        assert statuses.returncode == 0

    async def test_up_serves_the_api(self, env: Env) -> None:
        """With ``[api] enabled``, ``up`` serves /healthz and /metrics (with the task series)
        on its port, and still exits 0 on SIGTERM."""
        process = await env.start("up")
        try:
            await wait_registered(env)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{env.api_port}", timeout=5
            ) as client:
                await wait_for_api(client, process)  # /healthz answers 200
                metrics = await client.get("/metrics")
        finally:
            status = await stop(process)
        assert 'watchkeeper_task_pending_events{task="build_report",asset="orders"}' in (
            metrics.text
        )
        assert status == 0

    async def test_up_takes_host_and_port_and_says_where_the_page_is(self, env: Env) -> None:
        """``up --host/--port`` override ``[api]`` (as ``api`` does), and once it serves, ``up``
        prints on stderr the page's address and how to create a token for it."""
        port = free_port()
        process = await anyio.open_process(
            [*COMMAND, "up", "--watchers-path", str(env.defs), "--host", "127.0.0.1",
             "--port", str(port)],
            cwd=env.cwd, env=env.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        assert process.stderr is not None
        said = b""
        try:
            with anyio.fail_after(30):
                while b"tokens create" not in said:
                    said += await process.stderr.receive()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
                page = await c.get("/")
        finally:
            status = await stop(process)
        assert status == 0
        assert page.status_code == 200
        lines = said.decode().splitlines()
        assert f"watchkeeper up: the web page and the API are at http://127.0.0.1:{port}/" in lines
        assert any("watchkeeper tokens create NAME --scope read" in line for line in lines)

    async def test_worker_without_tasks_is_a_usage_error(self, env: Env, tmp_path: Path) -> None:
        """A definitions folder without any asset_task is refused with one line."""
        empty = tmp_path / "empty"
        empty.mkdir()
        done = await env.run("worker", "--watchers-path", str(empty))
        assert done.returncode == 2
        assert "no asset_task" in done.stderr.decode()


class TestTasksAndRuns:
    async def test_list_pause_resume_rewind_show_retry(self, env: Env) -> None:
        """The task and run commands read and steer the store a worker uses."""
        worker = await env.start("worker")
        try:
            await wait_registered(env)
            assert (await env.run("tasks", "pause", "build_report")).returncode == 0
            await env.emit({"bad": True})
            (task,) = await env.json_lines("tasks", "list")
            assert task["paused"] is True and task["pending"] == {"orders": 1}
            assert (await env.run("tasks", "resume", "build_report")).returncode == 0
            (failed,) = await env.wait_runs("failed", 1)
            shown = await env.json_lines("runs", "show", str(failed["id"]))
            assert "ValueError: a bad order" in shown[0]["errors"][0]["error"]
            assert "Traceback" in shown[0]["errors"][0]["traceback"]
            (event_id,) = [e["id"] for e in shown[0]["events"]]
            done = await env.run("runs", "retry", str(failed["id"]))
            assert done.returncode == 0, done.stderr.decode()
            await env.wait_runs("failed", 1)  # fails again: the same bad event
            rewind = await env.run(
                "tasks", "rewind", "build_report", "--asset", "orders", "--to-event", str(event_id)
            )
            assert rewind.returncode == 0, rewind.stderr.decode()
            await env.wait_runs("failed", 2)  # the rewound event made a new run
        finally:
            await stop(worker)

    async def test_unknown_names_are_one_line_errors(self, env: Env) -> None:
        """An unknown task or run is one error line and exit 1."""
        await env.emit({"n": 1})
        for args in (("tasks", "pause", "nope"), ("runs", "show", "99"), ("runs", "retry", "9")):
            done = await env.run(*args)
            assert done.returncode == 1
            lines = done.stderr.decode().splitlines()
            assert len(lines) == 1 and lines[0].startswith("watchkeeper: error:")

    async def test_retry_every_failed_run_of_a_task(self, env: Env) -> None:
        """``runs retry --task NAME``: each failed run of the task queued for one more try, the
        others left alone; no RUN_ID and no --task (or both) is a usage error."""
        async with SqliteStateBackend(env.db) as backend:
            await backend.events.aregister_assets([Asset("orders")])
            await backend.tasks.async_tasks(
                [TaskSpec("build_report", ("orders",), max_events=1, max_tries=1)]
            )
        await env.emit({"n": 1}, {"n": 2}, {"n": 3})
        async with SqliteStateBackend(env.db) as backend:
            runs = await backend.tasks.acreate_runs("build_report", 3)
            claimed = await backend.tasks.aclaim_runs("w", limit=3, ttl=30)
            for run in claimed[:2]:
                await backend.tasks.afinish_run(
                    run.id, "w", run.lease_token, success=False, error="boom"
                )
            await backend.tasks.afinish_run(
                claimed[2].id, "w", claimed[2].lease_token, success=True
            )
        done = await env.run("runs", "retry", "--task", "build_report", "--state", "failed")
        assert done.returncode == 0, done.stderr.decode()
        assert "2 failed run(s) queued" in done.stdout.decode()
        async with SqliteStateBackend(env.db) as backend:
            states = {r.id: r.state for r in await backend.tasks.alist_runs()}
        assert states == {
            claimed[0].id: "queued",
            claimed[1].id: "queued",
            claimed[2].id: "success",
        }
        assert len(runs) == 3
        for args in ((), ("1", "--task", "build_report")):
            usage = await env.run("runs", "retry", *args)
            assert usage.returncode == 2, usage.stderr.decode()
        unknown = await env.run("runs", "retry", "--task", "nope")
        assert unknown.returncode == 1 and "no task named 'nope'" in unknown.stderr.decode()

    async def test_rewind_past_the_cursor_is_refused(self, env: Env) -> None:
        """A rewind to an id past the end of the log or after the cursor, or on an asset
        outside the schedule, is one error line, exit 1, and leaves the cursor alone."""
        async with SqliteStateBackend(env.db) as backend:
            await backend.events.aregister_assets([Asset("orders"), Asset("other")])
            await backend.tasks.async_tasks([TaskSpec("build_report", ("orders",))])
        await env.emit({"n": 1}, {"n": 2})
        (before,) = await env.json_lines("tasks", "list")
        cases = [
            ("orders", "999999999999", "past the end of the log"),
            ("orders", str(before["cursors"]["orders"] + 1), "after the cursor of task"),
            ("other", "1", "is not in the schedule of task 'build_report'"),
        ]
        for asset, to_event, message in cases:
            done = await env.run(
                "tasks", "rewind", "build_report", "--asset", asset, "--to-event", to_event
            )
            assert done.returncode == 1, done.stdout.decode()
            lines = done.stderr.decode().splitlines()
            assert len(lines) == 1 and message in lines[0], lines
            assert "redelivered" not in done.stdout.decode()
            assert "start a worker" not in lines[0]
        (after,) = await env.json_lines("tasks", "list")
        assert after == before and after["pending"] == {"orders": 2}
