"""Fixtures of the triggerer's daemon tests: a watchers directory, a database, an environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.support.browser import chromium_path
from tests.support.daemons import LINES_WATCHER, STOP_GRACE, free_port


@pytest.fixture
def watchers(tmp_path: Path) -> Path:
    directory = tmp_path / "watchers"
    directory.mkdir()
    (directory / "lines.py").write_text(LINES_WATCHER)
    return directory


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def env(db_path: Path) -> dict[str, str]:
    """The daemon's environment: this test's database, fast heartbeats, renewals and GC, JSON
    logs, and a free port for its API (daemons of tests running at once never share 8787)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    clean.update(
        WATCHKEEPER__DATABASE__URL=f"sqlite:///{db_path}",
        WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL="0.2",
        WATCHKEEPER__TRIGGERER__LEASE_RENEW_INTERVAL="0.2",
        WATCHKEEPER__TRIGGERER__STOP_GRACE=str(STOP_GRACE),
        WATCHKEEPER__TRIGGERER__GC_INTERVAL="0.5",
        WATCHKEEPER__LOGGING__FORMAT="json",
        WATCHKEEPER__API__PORT=str(free_port()),
    )
    return clean


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[IO[bytes]]:
    with (tmp_path / "daemon.log").open("ab") as f:
        yield f


@pytest.fixture
def chromium() -> Path:
    """Debian's chromium for the browser tests; missing, the test skips (and fails under
    CI=true)."""
    return chromium_path()
