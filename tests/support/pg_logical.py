"""A throwaway PostgreSQL cluster with ``wal_level=logical``, for the change-data-capture tests.

The shared server on 5432 runs ``wal_level=replica``, which has no logical decoding, and
changing it needs a restart other tests would notice. So :func:`logical_cluster` makes a
cluster of its own: ``initdb`` into a temporary directory (as the ``postgres`` user when the
tests run as root: the server refuses to run as root), started on a free port of 127.0.0.1
with ``wal_level=logical``, its socket in the same directory, trust authentication, and
``fsync=off`` (nothing here must survive a power cut, and the tests are faster). It is stopped
and removed when the block ends. :meth:`LogicalCluster.stop` and :meth:`LogicalCluster.start`
take it down and bring it back on the same port, for a test of a server that goes away.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.requires import unavailable

__all__ = ["LogicalCluster", "logical_cluster"]

PASSWORD = "cdc-secret-do-not-show"
"""Put in the DSN (trust authentication ignores it) so tests can check it never shows."""


def _bindir() -> Path | None:
    found = shutil.which("pg_config")
    if found is not None:
        answer = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(answer.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LogicalCluster:
    """A running throwaway cluster: where it lives, its port, and a DSN to its ``postgres``
    database as its superuser (with a password in it that the server never checks)."""

    bindir: Path
    root: Path
    port: int
    runas: list[str]

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        command = [*self.runas, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args]
        answer = subprocess.run(command, capture_output=True, text=True, check=False)
        if answer.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl {args[0]} failed: {answer.stderr}\n{log}")

    def start(self) -> None:
        """Start the server (again) and wait until it takes connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c wal_level=logical "
            "-c max_replication_slots=20 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        self._ctl("-l", str(self.root / "server.log"), "-o", options, "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Stop the server at once (``-m fast``: sessions are cut)."""
        self._ctl("-m", "fast", "-w", "-t", "60", "stop")


@contextlib.contextmanager
def logical_cluster() -> Iterator[LogicalCluster]:
    """Make, start, yield, then stop and remove a cluster with ``wal_level=logical``; skips
    the test (fails it under ``CI=true``) when PostgreSQL's server programs are missing."""
    bindir = _bindir()
    if bindir is None:
        unavailable("PostgreSQL's initdb is not installed (Debian's postgresql package)")
    runas: list[str] = []
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            unavailable("running as root and there is no postgres user to run initdb as")
        runas = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="wk-pg-logical-"))
    try:
        if runas:
            shutil.chown(root, "postgres")
        answer = subprocess.run(
            [
                *runas,
                str(bindir / "initdb"),
                "-D",
                str(root / "data"),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if answer.returncode != 0:
            unavailable(f"initdb failed: {answer.stderr.strip()[-500:]}")
        cluster = LogicalCluster(bindir, root, _free_port(), runas)
        cluster.start()
        try:
            yield cluster
        finally:
            with contextlib.suppress(RuntimeError):
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
