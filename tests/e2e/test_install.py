"""Installing watchkeeper where users work: wheels in a fresh virtual environment, no clone.

The module builds the wheels with ``uv build --all-packages`` into a temporary directory (the
three of the README's install, and the optional Airflow bridge), creates a virtual environment
with pip in it, and installs the three there the way the README's "Using watchkeeper in your
own project" section says: ``pip install --find-links
DIST watchkeeper-triggerer watchkeeper-watchers "watchkeeper-store[postgres]"``, then a
watcher's client library (httpx) with a second ``pip install``. Every command then runs from
that environment, in a directory outside the repository: the demo, and a daemon on a watchers
folder of its own whose watcher polls a local HTTP feed with httpx.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from tests.support.daemons import reap
from tests.support.postgres import fresh_pg_database
from tests.support.requires import unavailable

# Building and installing take a while on a loaded machine, and the first test pays for it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SETUP_TIMEOUT = 400.0
"""Seconds each setup command (build, venv, pip install) may take."""
DISTRIBUTIONS = ("watchkeeper_store", "watchkeeper_triggerer", "watchkeeper_watchers")
"""The three the README installs; the workspace also builds ``watchkeeper_airflow`` (optional)."""
BUILT = sorted((*DISTRIBUTIONS, "watchkeeper_airflow"))
ITEMS = [{"id": n, "name": f"item-{n}"} for n in (1, 2, 3)]
"""What the local HTTP feed serves; the watcher emits one event per item."""

WATCHER_FILE = '''\
"""A watcher of a JSON feed over HTTP; httpx is a client library installed next to watchkeeper."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent


class FeedWatcher(BaseEventTrigger):
    """Emits each item of the feed at ``url`` once, in id order; the watermark is the last id."""

    def __init__(self, url: str, interval: float = 0.05) -> None:
        super().__init__()
        self.url = url
        self.interval = interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {{"url": self.url, "interval": self.interval}}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last = await self.asset_state_store.aget("watermark", default=0)
        async with httpx.AsyncClient(trust_env=False) as client:  # the feed is local
            while True:
                response = await client.get(self.url, params={{"after": last}})
                response.raise_for_status()
                for item in sorted(response.json(), key=lambda item: item["id"]):
                    if item["id"] > last:
                        last = item["id"]
                        yield TriggerEvent(item, state={{"watermark": last}})
                await anyio.sleep(self.interval)


feed = Asset("feed", watchers=[AssetWatcher("feed_watcher", FeedWatcher({url!r}))])
'''


def _uv() -> str:
    """The uv binary: the one running this suite (``uv run`` sets ``UV``), or one on PATH."""
    found = os.environ.get("UV") or shutil.which("uv")
    if found is None:
        unavailable("uv is not available (run the suite with `python3 -m uv run pytest`)")
    return found


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the workspace's venv or any watchkeeper setting."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("WATCHKEEPER__") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV")
    }
    env.update(extra)
    return env


def _setup(command: list[str], cwd: Path) -> None:
    """Run one setup command to its end (a sync fixture: blocking is fine here)."""
    result = subprocess.run(
        command,
        cwd=cwd,
        env=_clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"


@dataclass(frozen=True, slots=True)
class Installed:
    """A virtual environment holding the built wheels, and where it was made."""

    venv: Path
    dist: Path

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def watchkeeper(self, *args: str) -> list[str]:
        return [str(self.bin("watchkeeper")), *args]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheels built from this checkout, installed in a fresh venv with a client library."""
    uv = _uv()
    work = tmp_path_factory.mktemp("install")
    dist, venv = work / "dist", work / "venv"
    _setup([uv, "build", "--all-packages", "--wheel", "--out-dir", str(dist)], cwd=REPO)
    built = sorted(path.name.split("-")[0] for path in dist.glob("*.whl"))
    assert built == BUILT
    # `uv venv --seed` is `python -m venv` (pip included) without needing ensurepip, which some
    # distributions ship separately.
    _setup([uv, "venv", "--seed", "--python", sys.executable, str(venv)], cwd=work)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    _setup(
        [
            *pip,
            "--find-links",
            str(dist),
            "watchkeeper-triggerer",
            "watchkeeper-watchers",
            "watchkeeper-store[postgres]",
        ],
        cwd=work,
    )
    _setup([*pip, "httpx"], cwd=work)  # a watcher's client library, added to the same venv
    return Installed(venv, dist)


async def _run(
    command: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    """Run a command of the venv to its end (callers bound it with ``anyio.fail_after``)."""
    return await anyio.run_process(command, cwd=cwd, env=env, check=False)


async def _events(installed: Installed, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """``watchkeeper events --json`` from the venv: one JSON object per line."""
    with anyio.fail_after(60):
        result = await _run(installed.watchkeeper("events", "--json"), cwd, env)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return [json.loads(line) for line in result.stdout.decode().splitlines() if line.strip()]


@contextlib.asynccontextmanager
async def _http_feed(items: list[dict[str, Any]]) -> AsyncIterator[str]:
    """A local HTTP server answering every GET with ``items`` as JSON; yields its URL."""
    body = json.dumps(items).encode()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()

    async def answer(client: anyio.abc.SocketStream) -> None:
        async with client:
            request = b""
            try:
                while b"\r\n\r\n" not in request:
                    request += await client.receive()
                await client.send(head + body)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return  # the daemon closed this poll's connection (it was stopping)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        yield f"http://127.0.0.1:{port}/items"
        tg.cancel_scope.cancel()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A database the daemon in the venv writes to: a SQLite file, or a fresh PG database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    async with fresh_pg_database(dsn, prefix="wk_install") as (_, url):
        yield url


async def _tail(path: Path, chars: int = 4000) -> str:
    text = await anyio.Path(path).read_text(errors="replace")
    return textwrap.indent(text[-chars:], "  ")


class TestInstalledWheels:
    async def test_the_packages_come_from_the_venv(
        self, installed: Installed, tmp_path: Path
    ) -> None:
        """The venv imports watchkeeper, asyncpg and httpx from its own site-packages."""
        code = (
            "import asyncpg, httpx, watchkeeper.store as s, watchkeeper.triggerer as t, "
            "watchkeeper.watchers as w; print(s.__file__); print(t.__file__); print(w.__file__)"
        )
        with anyio.fail_after(60):
            result = await _run([str(installed.bin("python")), "-c", code], tmp_path, _clean_env())
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        files = [Path(line) for line in result.stdout.decode().splitlines()]
        assert len(files) == 3
        for file in files:
            assert file.is_relative_to(installed.venv), file
            assert not file.is_relative_to(REPO), file

    async def test_one_version_one_license_for_the_three(
        self, installed: Installed, tmp_path: Path
    ) -> None:
        """The three wheels carry one version, require each other at exactly that version,
        declare Apache-2.0 and ship the license text; ``watchkeeper --version`` says it."""
        code = (
            "import json, importlib.metadata as m\n"
            "out = {}\n"
            "for name in ('watchkeeper-store', 'watchkeeper-triggerer', 'watchkeeper-watchers'):\n"
            "    d = m.distribution(name)\n"
            "    files = [str(f) for f in d.files or () if f.name == 'LICENSE']\n"
            "    text = [f.read_text() for f in d.files or () if f.name == 'LICENSE']\n"
            "    out[name] = [d.version, d.metadata['License-Expression'], d.requires or [],\n"
            "                 files, text]\n"
            "print(json.dumps(out))\n"
        )
        with anyio.fail_after(60):
            result = await _run([str(installed.bin("python")), "-c", code], tmp_path, _clean_env())
            shown = await _run(installed.watchkeeper("--version"), tmp_path, _clean_env())
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        found = json.loads(result.stdout)
        license_text = (REPO / "LICENSE").read_text()
        versions = {version for version, *_ in found.values()}
        assert len(versions) == 1, found
        (version,) = versions
        for name, (_, expression, requires, files, texts) in found.items():
            assert expression == "Apache-2.0", name
            assert files and texts == [license_text], name
            siblings = [r for r in requires if r.startswith("watchkeeper-")]
            assert all(f"=={version}" in r for r in siblings), (name, requires)
            assert siblings or name == "watchkeeper-store", (name, requires)
        assert shown.stdout.decode() == f"watchkeeper {version}\n"

    async def test_the_demo_runs_from_the_installed_wheel(
        self, installed: Installed, tmp_path: Path
    ) -> None:
        """``watchkeeper demo`` from the venv, outside the repository, passes its check."""
        env = _clean_env(COLUMNS="200", TMPDIR=str(tmp_path))
        with anyio.fail_after(100):
            result = await _run(installed.watchkeeper("demo", "--items", "60"), tmp_path, env)
        out = result.stdout.decode(errors="replace")
        assert result.returncode == 0, out + result.stderr.decode(errors="replace")
        assert "SIGKILL daemon #1" in out
        flowing = " ".join(out.split())  # the verdict may wrap at the terminal's width
        assert "PASSED: the daemon was killed with kill -9 mid-stream" in flowing
        assert "all 120 items arrived exactly once" in flowing

    async def test_a_daemon_runs_a_watchers_folder_of_its_own(
        self, installed: Installed, tmp_path: Path, database_url: str
    ) -> None:
        """The venv's daemon runs a watcher using httpx from a folder in tmp; events commit."""
        project = tmp_path / "my-project"
        await anyio.Path(project / "watchers").mkdir(parents=True)
        env = _clean_env(
            WATCHKEEPER__DATABASE__URL=database_url,
            WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL="0.5",
            WATCHKEEPER__TRIGGERER__GC_INTERVAL="0",
            WATCHKEEPER__LOGGING__FORMAT="json",
        )
        log_path = project / "daemon.log"
        async with _http_feed(ITEMS) as url:
            source = WATCHER_FILE.format(url=url)
            await anyio.Path(project / "watchers" / "feed.py").write_text(source)
            log = await anyio.to_thread.run_sync(log_path.open, "ab")
            try:
                process = await anyio.open_process(
                    installed.watchkeeper("triggerer", "--watchers-path", "watchers"),
                    cwd=project,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            finally:
                log.close()
            try:
                events = await self._wait_for_events(installed, project, env, process, log_path)
                process.send_signal(signal.SIGTERM)
                with anyio.fail_after(30):
                    await process.wait()
                assert process.returncode == 0, await _tail(log_path)
            finally:
                await reap(process)
        assert [(e["asset"], e["payload"]) for e in events] == [("feed", item) for item in ITEMS]
        get = installed.watchkeeper("state-store", "get", "--asset", "feed", "watermark", "--json")
        with anyio.fail_after(60):
            watermark = await _run(get, project, env)
        assert watermark.returncode == 0, watermark.stderr.decode(errors="replace")
        assert json.loads(watermark.stdout) == ITEMS[-1]["id"]

    @staticmethod
    async def _wait_for_events(
        installed: Installed,
        project: Path,
        env: dict[str, str],
        process: anyio.abc.Process,
        log_path: Path,
    ) -> list[dict[str, Any]]:
        """Poll ``watchkeeper events --json`` (another process) until every item is there."""
        with anyio.fail_after(90):
            while True:
                if process.returncode is not None:
                    tail = await _tail(log_path)
                    raise AssertionError(f"the daemon exited with {process.returncode}:\n{tail}")
                events = await _events(installed, project, env)
                if len(events) >= len(ITEMS):
                    return events
                await anyio.sleep(0.2)
