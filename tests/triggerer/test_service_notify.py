"""The service manager's readiness protocol (``NOTIFY_SOCKET``, systemd's ``Type=notify``):
the daemon says READY=1 once it serves and STOPPING=1 when a signal stops it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import httpx
import pytest
from structlog.testing import capture_logs
from watchkeeper.triggerer._core._notify import notify

from tests.support.daemons import (
    asset_file,
    daemon,
    free_port,
    reap,
    terminate,
    watchkeeper_command,
)
from tests.triggerer.test_cli_tasks import DEFINITIONS


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: a Unix socket's path is limited to about 100 bytes."""
    path = Path("/tmp") / f"wk-notify-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


class TestNotify:
    def test_sends_one_datagram_of_fields(
        self, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The fields arrive as KEY=value lines in one datagram; a value stays on one line."""
        path = short_tmp / "notify.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
            manager.bind(str(path))
            monkeypatch.setenv("NOTIFY_SOCKET", str(path))
            assert notify(READY=1, STATUS="watching\n/srv/w") is True
            assert _fields(manager.recv(4096)) == {"READY": "1", "STATUS": "watching /srv/w"}

    def test_an_abstract_socket(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``@name`` names a socket in the abstract namespace."""
        name = f"wk-notify-{uuid.uuid4().hex}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
            manager.bind("\0" + name)
            monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
            assert notify(STOPPING=1) is True
            assert _fields(manager.recv(4096)) == {"STOPPING": "1"}

    def test_without_a_manager_nothing_is_sent(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
        assert notify(READY=1) is False

    def test_a_socket_nobody_reads_is_logged_not_raised(
        self, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("NOTIFY_SOCKET", str(short_tmp / "absent.sock"))
        with capture_logs() as logs:
            assert notify(READY=1) is False
        assert [e["event"] for e in logs] == ["service_notify_failed"]


@pytest.mark.slow
async def test_the_daemon_is_ready_when_it_serves_and_says_when_it_stops(
    short_tmp: Path,
    tmp_path: Path,
    watchers: Path,
    env: dict[str, str],
    log_file: IO[bytes],
) -> None:
    """READY=1 arrives once the daemon serves (its API answers /readyz with 200 by then);
    SIGTERM makes it say STOPPING=1 before it exits 0."""
    (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "alpha.txt"))
    path = short_tmp / "notify.sock"
    manager = await anyio.create_unix_datagram_socket(local_path=path)
    async with (
        manager,
        daemon(tmp_path, watchers, {**env, "NOTIFY_SOCKET": str(path)}, log_file) as process,
    ):
        with anyio.fail_after(60):
            ready, _ = await manager.receive()
        assert _fields(ready)["READY"] == "1"
        assert str(watchers) in _fields(ready)["STATUS"]
        port = env["WATCHKEEPER__API__PORT"]
        async with httpx.AsyncClient(timeout=10) as client:
            health = await client.get(f"http://127.0.0.1:{port}/healthz")
        assert health.status_code == 200
        assert await terminate(process) == 0
        with anyio.fail_after(5):
            stopping, _ = await manager.receive()
        assert _fields(stopping) == {"STOPPING": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["worker", "api", "up"])
async def test_the_worker_api_and_up_say_ready_and_stopping(
    command: str, short_tmp: Path, tmp_path: Path
) -> None:
    """``worker``, ``api`` and ``up`` say READY=1 once they serve (the API answers by then)
    and STOPPING=1 on SIGTERM, then exit 0: their systemd units are ``Type=notify`` too."""
    defs = tmp_path / "defs"
    defs.mkdir()
    (defs / "tasks.py").write_text(DEFINITIONS)
    port = free_port()
    path = short_tmp / "notify.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        WATCHKEEPER__DATABASE__URL=f"sqlite:///{tmp_path / 'state.db'}",
        WATCHKEEPER__API__PORT=str(port),
        WATCHKEEPER__LOGGING__FORMAT="json",
        NOTIFY_SOCKET=str(path),
    )
    args = ["api"] if command == "api" else [command, "--watchers-path", str(defs)]
    manager = await anyio.create_unix_datagram_socket(local_path=path)
    async with (
        manager,
        await anyio.open_process(
            watchkeeper_command(*args), cwd=tmp_path, env=env, stdin=subprocess.DEVNULL
        ) as process,
    ):
        try:
            with anyio.fail_after(60):
                ready, _ = await manager.receive()
            assert _fields(ready)["READY"] == "1"
            if command != "worker":  # the worker serves no HTTP
                async with httpx.AsyncClient(timeout=10) as client:
                    health = await client.get(f"http://127.0.0.1:{port}/healthz")
                assert health.status_code == 200
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(5):
                stopping, _ = await manager.receive()
            assert _fields(stopping) == {"STOPPING": "1"}
            with anyio.fail_after(30):
                assert await process.wait() == 0
        finally:
            await reap(process)
