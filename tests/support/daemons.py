"""Running the ``watchkeeper triggerer`` daemon as a real child process in a test.

The daemon's watcher files use :data:`LINES_WATCHER` (a watcher that emits each line of a text
file once); :func:`asset_file` defines an asset on one text file and :func:`append_lines`
feeds it. The fixtures that go with these (``watchers``, ``db_path``, ``env``, ``log_file``)
are in ``tests/triggerer/conftest.py``.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any, Protocol

import anyio
import anyio.abc
import httpx
import pytest
from watchkeeper.store import SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer import Settings, TriggererSettings

__all__ = [
    "FAILING_WATCHER",
    "LINES_WATCHER",
    "STOP_GRACE",
    "WAIT",
    "Watched",
    "append_lines",
    "asset_file",
    "committed",
    "daemon",
    "free_port",
    "lines_settings",
    "log_events",
    "payloads",
    "reap",
    "spawn_daemon",
    "terminate",
    "wait_for_api",
    "wait_until",
    "watchkeeper_command",
]

STOP_GRACE = 5.0
WAIT = 20.0  # bound of every wait on the daemon (a loaded CI machine starts Python slowly)

LINES_WATCHER = '''
"""A test watcher: emits each line of a text file once, with the line number as watermark."""

import anyio

from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent


class LinesWatcher(BaseEventTrigger):
    def __init__(self, path, poll=0.05):
        super().__init__()
        self.path = path
        self.poll = poll

    def serialize(self):
        return (self.classpath(), {"path": self.path, "poll": self.poll})

    async def run(self):
        n = await self.asset_state_store.aget("watermark", default=0)
        source = anyio.Path(self.path)
        while True:
            lines = (await source.read_text()).splitlines() if await source.exists() else []
            for line in lines[n:]:
                n += 1
                yield TriggerEvent({"n": n, "line": line}, state={"watermark": n})
            await anyio.sleep(self.poll)
'''


FAILING_WATCHER = """
from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger


class Failing(BaseEventTrigger):
    def serialize(self):
        return (self.classpath(), {})

    async def run(self):
        raise RuntimeError("source is down")
        yield


broken = Asset("broken", watchers=[AssetWatcher("broken_feed", Failing())])
"""


def asset_file(asset: str, source: Path) -> str:
    return textwrap.dedent(
        f"""
        from watchkeeper.triggerer import Asset, AssetWatcher
        from lines import LinesWatcher

        {asset} = Asset("{asset}", watchers=[AssetWatcher("{asset}_feed", LinesWatcher({str(source)!r}))])
        """
    )


def lines_settings(tmp_path: Path, source: Path, **triggerer: Any) -> Settings:
    """Settings of an in-process daemon whose watchers directory (``tmp_path/watchers``) holds
    :data:`LINES_WATCHER` and the asset ``alpha`` on the text file ``source``. ``triggerer``:
    the triggerer's other settings (GC off and a 1 s stop grace unless given)."""
    watchers = tmp_path / "watchers"
    watchers.mkdir()
    (watchers / "lines.py").write_text(LINES_WATCHER)
    (watchers / "alpha.py").write_text(asset_file("alpha", source))
    chosen = {"gc_interval": 0, "stop_grace": 1, **triggerer}
    return Settings(triggerer=TriggererSettings(watchers_path=watchers, **chosen))


def append_lines(path: Path, start: int, stop: int) -> None:
    with path.open("a") as f:
        f.writelines(f"line {i}\n" for i in range(start, stop + 1))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a daemon's API)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def watchkeeper_command(*args: str) -> list[str]:
    """``watchkeeper ARGS``: the installed script, or the same code through this interpreter."""
    script = Path(sys.executable).with_name("watchkeeper")
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()", *args]


def log_events(tmp_path: Path) -> list[dict[str, Any]]:
    events = []
    for line in (tmp_path / "daemon.log").read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a traceback line, or a line still being written
            continue
    return [e for e in events if isinstance(e, dict)]


async def spawn_daemon(
    cwd: Path, watchers: Path, env: dict[str, str], log: IO[bytes], *options: str
) -> anyio.abc.Process:
    """Start ``watchkeeper triggerer --watchers-path WATCHERS OPTIONS`` in ``cwd``, its output
    to ``log``; the caller reaps it (see :func:`daemon`, which does)."""
    return await anyio.open_process(
        watchkeeper_command("triggerer", "--watchers-path", str(watchers), *options),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        cwd=cwd,
        env=env,
    )


@asynccontextmanager
async def daemon(
    tmp_path: Path,
    watchers: Path,
    env: dict[str, str],
    log_file: IO[bytes],
    *,
    reload_interval: float | None = 0.2,
) -> AsyncIterator[anyio.abc.Process]:
    """A running ``watchkeeper triggerer`` child; killed at exit if the test left it running.
    It rescans the watchers every ``reload_interval`` seconds (None: the default interval)."""
    options = () if reload_interval is None else ("--reload-interval", str(reload_interval))
    process = await spawn_daemon(tmp_path, watchers, env, log_file, *options)
    try:
        yield process
    finally:
        await reap(process)


async def reap(process: anyio.abc.Process) -> None:
    """Kill ``process`` if it still runs, wait for it (bounded, shielded) and close it."""
    if process.returncode is None:
        process.kill()
    with anyio.move_on_after(10, shield=True):
        await process.wait()
    await process.aclose()


async def terminate(process: anyio.abc.Process) -> int:
    """SIGTERM the daemon and return its exit status; it must exit within the grace period."""
    process.send_signal(signal.SIGTERM)
    with anyio.fail_after(STOP_GRACE + 5):
        return await process.wait()


class Watched(Protocol):
    """Something :func:`wait_until` watches die: says why it failed, or None while alive."""

    def exit_note(self) -> str | None: ...


def _exit_note(alive: anyio.abc.Process | Watched) -> str | None:
    if isinstance(alive, anyio.abc.Process):
        code = alive.returncode
        return None if code is None else f"the daemon exited ({code})"
    return alive.exit_note()


async def wait_until(
    check: Callable[[], Any],
    what: str,
    *alive: anyio.abc.Process | Watched | None,
    within: float = WAIT,
) -> None:
    """Poll ``check`` (sync or async) until truthy; fail after ``within`` seconds or if one of
    ``alive`` (a daemon process, or a :class:`Watched`) died meanwhile."""
    with anyio.fail_after(within):
        while True:
            result = check()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return
            for watched in alive:
                note = None if watched is None else _exit_note(watched)
                if note is not None:
                    pytest.fail(f"{note} while waiting for {what}")
            await anyio.sleep(0.05)


async def wait_for_api(client: httpx.AsyncClient, *alive: anyio.abc.Process | Watched) -> None:
    """Wait until the API at ``client``'s base URL answers ``/healthz`` with 200 (as
    :func:`wait_until`: bounded, and failing early if one of ``alive`` died)."""

    async def answers() -> bool:
        try:
            return (await client.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_until(answers, "the API to answer", *alive)


async def committed(backend: BaseStateBackend, count: int, *, within: float = WAIT) -> None:
    """Return once ``count`` events were committed; fail after ``within`` seconds."""
    with anyio.fail_after(within):
        while True:
            if len(await backend.events.alist_events()) >= count:
                return
            await anyio.sleep(0.02)


async def payloads(backend: SqliteStateBackend, asset: str) -> list[int]:
    return [int(e.payload["n"]) for e in await backend.events.alist_events(asset=asset)]
