"""``watchkeeper runs logs RUN_ID [--try N] [--follow] [--json]`` as a real subprocess on a
SQLite file whose runs and logs the test writes through the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskSpec, encode_json

from tests.support.clock import Clock

COMMAND = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]
TTL = timedelta(seconds=60)


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "state.db"
        self.cwd = tmp_path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env["WATCHKEEPER__DATABASE__URL"] = f"sqlite:///{self.db}"
        return env

    async def run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return await anyio.run_process(
            [*COMMAND, "runs", "logs", *args], check=False, cwd=self.cwd, env=self.env()
        )

    def store(self) -> SqliteStateBackend:
        return SqliteStateBackend(self.db)

    async def running_run(self, store: Any) -> tuple[int, int]:
        """A run of task ``t``, claimed by ``w``: its id and lease token."""
        await store.events.aregister_assets([Asset("a")])
        await store.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1, max_tries=3)])
        await store.events.acommit(EventCommit("w", ("a",), encode_json({"n": 1})))
        await store.tasks.acreate_run("t")
        (run,) = await store.tasks.aclaim_runs("w", limit=1, ttl=TTL)
        return run.id, run.lease_token

    async def two_tries(self) -> int:
        """A run whose try 1 printed and failed, and whose try 2 printed and succeeded."""
        async with self.store() as store:
            run_id, token = await self.running_run(store)
            await store.logs.aappend(run_id, 1, [("stdout", "first\n"), ("stderr", "oops\n")])
            await store.tasks.afinish_run(run_id, "w", token, success=False, error="x")
            (again,) = await store.tasks.aclaim_runs("w", limit=1, ttl=TTL)
            await store.logs.aappend(run_id, 2, [("stdout", "second \x1b[31mred\n")])
            await store.tasks.afinish_run(run_id, "w", again.lease_token, success=True)
        return run_id


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    yield Env(tmp_path)


class TestRunsLogs:
    async def test_text_of_every_try(self, env: Env) -> None:
        """The tries' text in order, a header before each try's, terminal controls escaped."""
        run_id = await env.two_tries()
        done = await env.run(str(run_id))
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.decode() == (
            "--- try 1 ---\nfirst\noops\n--- try 2 ---\nsecond \\x1b[31mred\n"
        )

    async def test_one_try_and_json(self, env: Env) -> None:
        """``--try 2`` prints that try's only; ``--json`` one chunk a line."""
        run_id = await env.two_tries()
        done = await env.run(str(run_id), "--try", "2")
        assert done.stdout.decode() == "second \\x1b[31mred\n"
        done = await env.run(str(run_id), "--json")
        records = [json.loads(line) for line in done.stdout.decode().splitlines()]
        assert [(r["try_number"], r["stream"], r["text"]) for r in records] == [
            (1, "stdout", "first\n"),
            (1, "stderr", "oops\n"),
            (2, "stdout", "second \x1b[31mred\n"),
        ]
        assert all(r["run_id"] == run_id and r["created_at"] for r in records)
        assert [r["seq"] for r in records] == sorted(r["seq"] for r in records)

    async def test_errors(self, env: Env) -> None:
        """An unknown run, or a try the run never made, is one error line and exit 1."""
        run_id = await env.two_tries()
        for args, says in (
            (("99",), "run 99 does not exist"),
            ((str(run_id), "--try", "3"), f"run {run_id} has no try 3"),
        ):
            done = await env.run(*args)
            assert done.returncode == 1
            (line,) = done.stderr.decode().splitlines()
            assert line.startswith("watchkeeper: error:") and says in line
        done = await env.run(str(run_id), "--try", "0")
        assert done.returncode == 2  # a usage error

    async def test_no_logs(self, env: Env) -> None:
        """A run without logs prints nothing on stdout, and says so on stderr."""
        async with env.store() as store:
            run_id, _ = await env.running_run(store)
        done = await env.run(str(run_id))
        assert (done.returncode, done.stdout) == (0, b"")
        assert f"run {run_id} has no logs" in done.stderr.decode()

    async def test_follow_until_the_run_finishes(self, env: Env) -> None:
        """``--follow`` prints what a running try writes as it comes, and ends once the run
        finished and its last chunk is printed."""
        async with env.store() as store:
            run_id, token = await env.running_run(store)
            await store.logs.aappend(run_id, 1, [("stdout", "early\n")])
            follower = await anyio.open_process(
                [*COMMAND, "runs", "logs", str(run_id), "--follow"],
                cwd=env.cwd,
                env=env.env(),
                stdin=subprocess.DEVNULL,
            )
            assert follower.stdout is not None
            got = b""
            with anyio.fail_after(30):
                while b"early\n" not in got:
                    got += await follower.stdout.receive()
                await store.logs.aappend(run_id, 1, [("stdout", "late\n")])
                while b"late\n" not in got:
                    got += await follower.stdout.receive()
                await store.logs.aappend(run_id, 1, [("stdout", "last\n")])
                await store.tasks.afinish_run(run_id, "w", token, success=True)
                async for data in follower.stdout:
                    got += data
                assert await follower.wait() == 0
        assert got == b"early\nlate\nlast\n"

    async def test_clean_deletes_the_logs_of_runs_finished_long_ago(self, env: Env) -> None:
        """``state-store clean`` deletes the logs of a run that finished before the events'
        retention (30 days) and says how many chunks went."""
        async with env.store() as store:
            store.clock = Clock(datetime.now(UTC) - timedelta(days=40))
            run_id, token = await env.running_run(store)
            await store.logs.aappend(run_id, 1, [("stdout", "old\n"), ("stderr", "older\n")])
            await store.tasks.afinish_run(run_id, "w", token, success=True)
        done = await anyio.run_process(
            [*COMMAND, "state-store", "clean", "--json"], check=False, cwd=env.cwd, env=env.env()
        )
        assert done.returncode == 0, done.stderr.decode()
        assert json.loads(done.stdout)["logs"] == 2
        assert (await env.run(str(run_id))).stdout == b""
