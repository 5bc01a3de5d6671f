"""``examples/orders-pipeline`` is a project a user copies: its own tests pass, run as its
README says (pytest from the project's folder, with its own settings), here on the suite's
environment, which has the three packages installed."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "orders-pipeline"

pytestmark = pytest.mark.slow


async def test_the_example_projects_tests_pass() -> None:
    with anyio.fail_after(300):
        done = await anyio.run_process(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"],
            cwd=PROJECT,
            check=False,
        )
    output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert done.returncode == 0, output
    assert "7 passed" in output and "skipped" not in output, output
