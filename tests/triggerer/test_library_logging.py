"""watchkeeper used as a library: silent unless the program configures logging.

Each test runs a real Python program in a subprocess, as a user's own program would run
``run_task`` and ``run_trigger``: no structlog configuration, stdout and stderr captured.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import structlog
from watchkeeper.store.protocols import get_logger

PROGRAM = textwrap.dedent(
    """
    import logging
    import sys
    from collections.abc import AsyncIterator
    from typing import Any

    import anyio
    from watchkeeper.store import Asset, SqliteStateBackend, run_task
    from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
    from watchkeeper.triggerer.testing import run_trigger

    ORDERS = Asset("orders")


    class Ticks(BaseEventTrigger):
        def serialize(self) -> tuple[str, dict[str, Any]]:
            return self.classpath(), {}

        async def run(self) -> AsyncIterator[TriggerEvent]:
            for n in range(3):
                yield TriggerEvent({"n": n}, state={"wm": n})


    def load(**context: Any) -> None:
        context["asset_state_store"].set("seen", 1)


    async def main(path: str) -> None:
        async with SqliteStateBackend(path) as backend:
            await run_task(load, backend=backend, dag_id="d", run_id="r", task_id="t",
                           outlets=[ORDERS])
            events = await run_trigger(Ticks(), assets=ORDERS, backend=backend, max_events=3)
            assert len(events) == 3, events


    if sys.argv[2] == "debug":
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
    anyio.run(main, sys.argv[1], backend="asyncio")
    """
)


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "user_program.py"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("WATCHKEEPER")}
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "state.db"), mode],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )


class TestLibraryIsQuiet:
    def test_a_plain_program_prints_nothing(self, tmp_path: Path) -> None:
        """run_task and run_trigger in a program that configured no logging print nothing."""
        done = _run(tmp_path, "plain")
        assert done.returncode == 0, done.stderr
        assert (done.stdout, done.stderr) == ("", "")

    def test_a_program_that_configures_stdlib_logging_sees_the_events(self, tmp_path: Path) -> None:
        """With stdlib logging at DEBUG, the debug events arrive as records of watchkeeper loggers."""
        done = _run(tmp_path, "debug")
        assert done.returncode == 0, done.stderr
        lines = done.stderr.splitlines()
        assert any(
            line.startswith("DEBUG watchkeeper.store.context task_succeeded") for line in lines
        ), done.stderr
        committed = [line for line in lines if " event_committed " in line]
        assert len(committed) == 3, done.stderr
        assert committed[0].startswith("DEBUG watchkeeper.triggerer.runtime._supervisor")
        assert "trigger_id=" in committed[0]
        assert done.stdout == ""


class TestLibraryLogger:
    def test_capture_logs_sees_library_events(self) -> None:
        """structlog.testing.capture_logs() captures a module logger's events, fields included."""
        log = get_logger("watchkeeper.test")
        with structlog.testing.capture_logs() as captured:
            log.debug("event_committed", event_id=7)
        assert captured == [{"event": "event_committed", "event_id": 7, "log_level": "debug"}]

    def test_unconfigured_events_go_to_the_named_stdlib_logger(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Without a structlog configuration an event is a stdlib record of the module's logger."""
        log = get_logger("watchkeeper.test")
        with caplog.at_level(logging.INFO, logger="watchkeeper.test"):
            log.debug("hidden")
            log.info("shown", url="postgresql://u:hunter2@db/wk")
        assert [(r.name, r.levelno) for r in caplog.records] == [("watchkeeper.test", logging.INFO)]
        assert caplog.records[0].getMessage() == "shown url='postgresql://u:***@db/wk'"
        assert not log.is_enabled_for(logging.DEBUG)
