"""pytest plugin of the test kit, registered as the ``watchkeeper`` ``pytest11`` entry point.

It only adds fixtures (no autouse fixture, no hook), all prefixed ``wk_`` so they cannot shadow
a project's own. They are async and run under anyio's pytest plugin: mark the tests
``@pytest.mark.anyio`` (or set ``anyio_mode = "auto"``) and keep the ``anyio_backend`` on
``"asyncio"`` (aiosqlite and asyncpg are asyncio-only).

- ``wk_backend``: an opened, empty state backend; ``"memory"`` by default, or ``"sqlite"`` (a
  file under ``tmp_path``) through ``@pytest.mark.parametrize("wk_backend", [...],
  indirect=True)``.
- ``wk_source``: an empty :class:`~.sources.FakeEventSource`, in memory by default, or in a
  SQLite file under ``tmp_path`` with ``indirect`` parametrization ``"sqlite"``.
- ``wk_harness``: a :class:`~.harness.WatcherHarness` on ``wk_backend``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from watchkeeper.store import BaseStateBackend, MemoryStateBackend, SqliteStateBackend

from .harness import WatcherHarness
from .sources import FakeEventSource

__all__ = ["wk_backend", "wk_harness", "wk_source"]

_BACKEND_KINDS = ("memory", "sqlite")
_SOURCE_KINDS = ("memory", "sqlite")


def _kind(request: pytest.FixtureRequest, fixture: str, allowed: tuple[str, ...]) -> str:
    kind = getattr(request, "param", "memory")
    if kind not in allowed:
        raise ValueError(
            f"{fixture} is parametrized with {kind!r}; expected one of {', '.join(allowed)}"
        )
    return str(kind)


@pytest.fixture
async def wk_backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BaseStateBackend]:
    """An opened, empty state backend: ``memory`` (default) or ``sqlite`` under ``tmp_path``."""
    kind = _kind(request, "wk_backend", _BACKEND_KINDS)
    if kind == "memory":
        async with MemoryStateBackend() as memory:
            yield memory
    else:
        async with SqliteStateBackend(tmp_path / "wk-state.db") as sqlite:
            yield sqlite


@pytest.fixture
async def wk_source(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[FakeEventSource]:
    """An empty, open :class:`FakeEventSource`: in memory (default) or in a SQLite file."""
    kind = _kind(request, "wk_source", _SOURCE_KINDS)
    source = (
        FakeEventSource() if kind == "memory" else FakeEventSource.at(tmp_path / "wk-source.db")
    )
    async with source:
        yield source


@pytest.fixture
def wk_harness(wk_backend: BaseStateBackend) -> WatcherHarness:
    """A :class:`WatcherHarness` that runs triggers through the real runtime on ``wk_backend``."""
    return WatcherHarness(wk_backend)
