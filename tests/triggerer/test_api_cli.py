"""``watchkeeper tokens`` and ``watchkeeper api``."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest
from watchkeeper.store import SqliteStateBackend
from watchkeeper.triggerer import cli
from watchkeeper.triggerer.api import verify_token

from tests.support.daemons import free_port, wait_for_api, watchkeeper_command


class TestTokensCommand:
    def test_create_prints_once_and_stores_a_hash(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The token is printed at creation; the store and ``list`` never show it."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        args = ["--database-url", url, "tokens", "create", "ops", "--scope", "read"]
        assert cli.run([*args, "--scope", "write:asset:orders_*", "--expires-in", "3"]) == 0
        token = capsys.readouterr().out.splitlines()[0]
        assert token.startswith("wk_")
        assert cli.run(["--database-url", url, "tokens", "list", "--json"]) == 0
        listed = capsys.readouterr().out
        row = json.loads(listed)
        assert (row["name"], row["scopes"], row["state"]) == (
            "ops",
            ["read", "write:asset:orders_*"],
            "active",
        )
        assert token not in listed and token.split("_", 2)[2] not in listed
        with SqliteStateBackend(tmp_path / "s.db") as backend:
            (stored,) = backend.run_sync(backend.controls.alist_tokens)
            principal = backend.run_sync(verify_token, backend.controls, token, stored.created_at)
        assert token.split("_", 2)[2] not in stored.digest
        assert principal is not None and principal.scopes == ("read", "write:asset:orders_*")

    async def test_create_prints_the_token_alone_on_stdout(self, tmp_path: Path) -> None:
        """``TOKEN=$(watchkeeper tokens create ...)`` captures the token and nothing else; the
        "shown once" note goes to stderr, where the person running it sees it."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        create = watchkeeper_command(
            "--database-url", url, "tokens", "create", "ci", "--scope", "read"
        )
        script = f'TOKEN=$({shlex.join(create)}) && printf "%s" "$TOKEN"'
        done = await anyio.run_process(["sh", "-c", script], check=False)
        token, note = done.stdout.decode(), done.stderr.decode()
        assert done.returncode == 0, note
        assert token.startswith("wk_") and token.strip() == token and " " not in token, token
        assert "shown once" in note and token not in note
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            (stored,) = await backend.controls.alist_tokens()
            assert await verify_token(backend.controls, token, stored.created_at) is not None

    def test_revoke_and_errors(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A bad scope is a usage error, a live name cannot be reused, revoke works once."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        base = ["--database-url", url, "tokens"]
        assert cli.run([*base, "create", "x", "--scope", "write"]) == 2
        assert "invalid scope 'write'" in capsys.readouterr().err
        assert cli.run([*base, "create", "x", "--scope", "operate"]) == 0
        assert cli.run([*base, "create", "x", "--scope", "operate"]) == 1
        assert "already exists" in capsys.readouterr().err
        assert cli.run([*base, "revoke", "x"]) == 0
        assert cli.run([*base, "revoke", "x"]) == 1
        assert "no active token named 'x'" in capsys.readouterr().err


@pytest.mark.slow
class TestApiCommand:
    async def test_serves_until_sigterm(self, tmp_path: Path) -> None:
        """``watchkeeper api`` answers /healthz and exits 0 on SIGTERM."""
        port = free_port()
        command = watchkeeper_command(
            "--database-url", f"sqlite:///{tmp_path / 's.db'}", "api", "--port", str(port)
        )
        async with await anyio.open_process(command, stdin=subprocess.DEVNULL) as process:
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                    await wait_for_api(client, process)
                process.send_signal(signal.SIGTERM)
                with anyio.fail_after(20):
                    assert await process.wait() == 0
            finally:
                if process.returncode is None:
                    process.kill()

    @pytest.mark.parametrize("command", ["api", "up"])
    @pytest.mark.parametrize(
        ("option", "message"),
        [(["--port", "65536"], "65536 is more than 65535"), (["--host", ""], "'' is not a host")],
    )
    def test_bad_host_or_port_is_a_usage_error(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        command: str,
        option: list[str],
        message: str,
    ) -> None:
        """``--host`` and ``--port`` of ``api`` and ``up`` refuse what cannot be listened on,
        with one line, before anything starts."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        with pytest.raises(SystemExit) as exited:
            cli.run(["--database-url", url, command, *option])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "s.db").exists()

    def test_a_busy_port_is_one_line(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A port already taken fails the command with one line naming the address."""
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            url = f"sqlite:///{tmp_path / 's.db'}"
            assert cli.run(["--database-url", url, "api", "--port", str(port)]) == 1
        err = capsys.readouterr().err
        assert f"cannot listen on 127.0.0.1:{port}" in err and len(err.splitlines()) == 1
