"""Fixtures of the broker watcher tests: a SQLite state store and a harness over it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from watchkeeper.store import BaseStateBackend, SqliteStateBackend
from watchkeeper.triggerer.testing import WatcherHarness


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[BaseStateBackend]:
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        yield backend


@pytest.fixture
def harness(state: BaseStateBackend) -> WatcherHarness:
    """A harness reading the default watermark key; a module whose watcher keeps another
    key overrides this fixture."""
    return WatcherHarness(state)
