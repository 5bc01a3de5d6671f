"""``watchkeeper tasks list`` showing removed tasks, and ``watchkeeper tasks delete``: asked
on a terminal, refused without one unless ``--yes``, an unknown task one error line."""

from __future__ import annotations

import os
import pty
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import TaskSpec

from tests.triggerer.test_cli_tasks import COMMAND, Env


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    """Tasks ``build_report`` (removed from the definitions) and ``audit``, two events
    pending for each."""
    made = Env(tmp_path)
    async with SqliteStateBackend(made.db) as backend:
        await backend.events.aregister_assets([Asset("orders")])
        await backend.tasks.async_tasks(
            [TaskSpec("build_report", ("orders",)), TaskSpec("audit", ("orders",))]
        )
    await made.emit({"n": 1}, {"n": 2})
    async with SqliteStateBackend(made.db) as backend:
        assert await backend.tasks.aretire_tasks(["audit"]) == ["build_report"]
    yield made


async def names(env: Env) -> list[str]:
    async with SqliteStateBackend(env.db) as backend:
        return [info.name for info in await backend.tasks.alist_tasks()]


async def on_a_terminal(env: Env, answer: bytes, *args: str) -> tuple[int, bytes]:
    """Run ``watchkeeper ARGS`` with a terminal as its stdin, answering ``answer`` to its
    question; its exit status and what it wrote to the terminal or stderr."""
    main, side = pty.openpty()
    try:
        with anyio.fail_after(30):
            process = await anyio.open_process(
                [*COMMAND, *args], stdin=side, stdout=-1, stderr=-1, cwd=env.cwd, env=env.env()
            )
            os.write(main, answer)
            stdout, stderr = b"", b""
            assert process.stdout is not None and process.stderr is not None
            async for chunk in process.stderr:
                stderr += chunk
            async for chunk in process.stdout:
                stdout += chunk
            status = await process.wait()
    finally:
        os.close(main)
        os.close(side)
    return status, stdout + stderr


class TestRemovedTasks:
    async def test_list_shows_removed_tasks(self, env: Env) -> None:
        """The table has a removed column; --json has removed and removed_at."""
        rows = {row["name"]: row for row in await env.json_lines("tasks", "list")}
        assert rows["build_report"]["removed"] is True and rows["build_report"]["removed_at"]
        assert rows["audit"]["removed"] is False and rows["audit"]["removed_at"] is None
        assert rows["build_report"]["pending"] == {"orders": 2}
        table = await env.run("tasks", "list")
        lines = table.stdout.decode().splitlines()
        assert "removed" in next(line for line in lines if "task" in line and "paused" in line)
        cells = {
            cut[1]: cut[-2]  # the task's name, and the last column: removed
            for cut in ([c.strip() for c in line.split("│")] for line in lines)
            if len(cut) > 2
        }
        assert (cells["build_report"], cells["audit"]) == ("yes", "no")


class TestTasksDelete:
    async def test_yes_deletes_without_asking(self, env: Env) -> None:
        """``--yes`` forgets the task at once; the other stays."""
        done = await env.run("tasks", "delete", "build_report", "--yes")
        assert done.returncode == 0, done.stderr.decode()
        assert "deleted" in done.stdout.decode()
        assert await names(env) == ["audit"]

    async def test_without_a_terminal_or_yes_nothing_is_deleted(self, env: Env) -> None:
        """No terminal to ask on and no --yes: a usage error (exit 2) saying to pass --yes."""
        done = await env.run("tasks", "delete", "build_report")
        lines = done.stderr.decode().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and "--yes" in lines[0]
        assert await names(env) == ["audit", "build_report"]

    async def test_asks_on_a_terminal(self, env: Env) -> None:
        """On a terminal it asks, naming the task: "n" deletes nothing, "y" deletes."""
        status, said = await on_a_terminal(env, b"n\n", "tasks", "delete", "build_report")
        assert status == 1 and b"forget task 'build_report'" in said, said
        assert await names(env) == ["audit", "build_report"]
        status, said = await on_a_terminal(env, b"y\n", "tasks", "delete", "build_report")
        assert status == 0, said
        assert await names(env) == ["audit"]

    async def test_an_unknown_task_is_one_error_line(self, env: Env) -> None:
        """An unknown name: exit 1, one line naming it, no question asked."""
        done = await env.run("tasks", "delete", "nope", "--yes")
        lines = done.stderr.decode().splitlines()
        assert done.returncode == 1 and lines == ["watchkeeper: error: no task named 'nope'"]
