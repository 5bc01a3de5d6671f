"""A real SQS and S3 endpoint for the tests: ``moto_server`` (moto's stand-alone server) on a
free port of 127.0.0.1, started once per test session and stopped after it.

The watchers talk to it through aiobotocore exactly as they would to AWS (``endpoint_url``);
it checks no signature, but botocore signs every request, so :func:`aws_environment` gives the
process test credentials and a region. Each test uses queues and buckets of its own names, so
tests sharing the server never see each other's messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.requires import unavailable

__all__ = ["AWS_ENV", "moto_server", "moto_server_path"]

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "wk-test-key",
    "AWS_SECRET_ACCESS_KEY": "wk-test-secret-do-not-show",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""What botocore needs to sign requests to the test server (which accepts any keys)."""

_READY_TIMEOUT = 30.0


def moto_server_path() -> str:
    """The ``moto_server`` launcher beside this interpreter (or on PATH); skips (fails in CI)
    when moto[server] is not installed."""
    beside = Path(sys.executable).parent / "moto_server"
    if beside.exists():
        return str(beside)
    found = shutil.which("moto_server")
    if found is None:
        unavailable("moto_server is not installed (the dev group's moto[server])")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=1) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Start ``moto_server`` on a free port, wait until it answers, yield its endpoint URL,
    and stop it (SIGTERM, then SIGKILL) however the block ends."""
    launcher = moto_server_path()
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [launcher, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **AWS_ENV},
    )
    try:
        deadline = time.monotonic() + _READY_TIMEOUT
        while not _answers(endpoint):
            if process.poll() is not None:
                unavailable(f"moto_server exited with {process.returncode} before answering")
            if time.monotonic() > deadline:
                unavailable(f"moto_server did not answer on {endpoint} within {_READY_TIMEOUT} s")
            time.sleep(0.1)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
