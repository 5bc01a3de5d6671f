"""One watcher file must not take the daemon down, and ``status`` must tell the truth.

Real ``watchkeeper triggerer`` processes on a SQLite file (and PostgreSQL where the failure was
PostgreSQL's): a file that hangs at import, at start-up or added at runtime; asset names the
database cannot store; a daemon killed with SIGKILL as ``watchkeeper status`` sees it.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import pytest
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer.cli._runtime import status_report

from tests.support.daemons import (
    WAIT,
    append_lines,
    asset_file,
    daemon,
    log_events,
    payloads,
    terminate,
    wait_until,
    watchkeeper_command,
)
from tests.support.postgres import fresh_pg_database

pytestmark = pytest.mark.slow


def hanging_file(marker: Path, how: str = "busy") -> str:
    """A watcher file that records its pid in ``marker`` and then never finishes importing."""
    hang = "while True:\n    pass\n" if how == "busy" else "import time\ntime.sleep(3600)\n"
    return f"import os\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n" + hang


async def gone(pid: int) -> bool:
    """True once no process has ``pid`` (the child that read the hung file was killed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def refusals(tmp_path: Path) -> dict[str, str]:
    return {e["file"]: e["reason"] for e in log_events(tmp_path) if e["event"] == "watcher_refused"}


class TestHangingImports:
    async def test_files_that_hang_at_import_are_refused_and_the_others_start(
        self,
        tmp_path: Path,
        watchers: Path,
        db_path: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """``while True: pass`` and ``time.sleep`` forever at import are refused after
        import_timeout, named in ``watcher_refused``; the healthy watcher runs; SIGTERM works."""
        alpha = tmp_path / "alpha.txt"
        append_lines(alpha, 1, 3)
        (watchers / "alpha.py").write_text(asset_file("alpha", alpha))
        (watchers / "busy.py").write_text(hanging_file(tmp_path / "busy.pid", "busy"))
        (watchers / "sleepy.py").write_text(hanging_file(tmp_path / "sleepy.pid", "sleep"))
        env = {**env, "WATCHKEEPER__TRIGGERER__IMPORT_TIMEOUT": "1.5"}
        async with (
            SqliteStateBackend(db_path) as backend,
            daemon(tmp_path, watchers, env, log_file) as process,
        ):

            async def committed() -> bool:
                return await payloads(backend, "alpha") == [1, 2, 3]

            await wait_until(committed, "the healthy watcher's events", process)
            assert await terminate(process) == 0
        assert refusals(tmp_path) == {
            "busy.py": "import timed out after 1.5 s",
            "sleepy.py": "import timed out after 1.5 s",
        }
        pids = [int((tmp_path / name).read_text()) for name in ("busy.pid", "sleepy.pid")]

        async def both_gone() -> bool:
            return all([await gone(pid) for pid in pids])

        await wait_until(both_gone, "the processes that read the hanging files to end")

    async def test_sigterm_while_a_file_hangs_at_start_up_stops_the_daemon(
        self,
        tmp_path: Path,
        watchers: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """A daemon still starting, waiting on a file that hangs (long import_timeout), exits 0
        on SIGTERM without waiting for the timeout, and the reading process is killed."""
        marker = tmp_path / "busy.pid"
        (watchers / "busy.py").write_text(hanging_file(marker))
        env = {**env, "WATCHKEEPER__TRIGGERER__IMPORT_TIMEOUT": "600"}
        async with daemon(tmp_path, watchers, env, log_file) as process:
            await wait_until(marker.exists, "the hanging import to start", process)
            assert await terminate(process) == 0
        stopping = [e for e in log_events(tmp_path) if e["event"] == "daemon_stopping"]
        assert stopping[0]["starting"] is True
        await wait_until(lambda: gone(int(marker.read_text())), "the reading process to end")

    async def test_a_file_that_hangs_when_added_at_runtime_does_not_stop_lease_renewal(
        self,
        tmp_path: Path,
        watchers: Path,
        db_path: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """While a newly added file hangs at import (import_timeout far beyond the lease's
        time to live), the running watcher's lease keeps being renewed under the same token
        and the watcher keeps committing; SIGTERM then still exits 0."""
        alpha = tmp_path / "alpha.txt"
        append_lines(alpha, 1, 2)
        (watchers / "alpha.py").write_text(asset_file("alpha", alpha))
        env = {
            **env,
            "WATCHKEEPER__TRIGGERER__IMPORT_TIMEOUT": "600",
            "WATCHKEEPER__TRIGGERER__LEASE_TTL": "1.0",
            "WATCHKEEPER__TRIGGERER__LEASE_RENEW_INTERVAL": "0.25",
            "WATCHKEEPER__TRIGGERER__LEASE_MARGIN": "0.25",
        }
        marker = tmp_path / "busy.pid"
        async with (
            SqliteStateBackend(db_path) as backend,
            daemon(tmp_path, watchers, env, log_file) as process,
        ):

            async def two() -> bool:
                return await payloads(backend, "alpha") == [1, 2]

            await wait_until(two, "alpha's first events", process)
            (before,) = await backend.leases.alist_leases()
            (watchers / "busy.py").write_text(hanging_file(marker))
            await wait_until(marker.exists, "the reload to import the hanging file", process)
            (hung,) = await backend.leases.alist_leases()

            assert hung.expires_at is not None

            async def renewed_long_after() -> bool:
                (lease,) = await backend.leases.alist_leases()
                assert lease.expires_at is not None and hung.expires_at is not None
                return lease.expires_at > hung.expires_at + timedelta(seconds=3)

            await wait_until(renewed_long_after, "three lease lifetimes of renewals", process)
            append_lines(alpha, 3, 4)

            async def four() -> bool:
                return await payloads(backend, "alpha") == [1, 2, 3, 4]

            await wait_until(four, "events committed while the file hangs", process)
            (after,) = await backend.leases.alist_leases()
            assert (after.owner, after.token) == (before.owner, before.token)
            assert await terminate(process) == 0
        names = {e["event"] for e in log_events(tmp_path)}
        assert not names & {"lease_moved", "lease_lost", "lease_renewal_failed"}
        await wait_until(lambda: gone(int(marker.read_text())), "the reading process to end")


BAD_NAMES = {
    "nul.py": "bad\\x00name",
    "surrogate.py": "bad\\udc80name",
    "long.py": "x" * 3000,
}


def bad_name_file(name: str, source: Path) -> str:
    return textwrap.dedent(
        f"""
        from watchkeeper.triggerer import Asset, AssetWatcher
        from lines import LinesWatcher

        bad = Asset("{name}", watchers=[AssetWatcher("bad_feed", LinesWatcher({str(source)!r}))])
        """
    )


@asynccontextmanager
async def database(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[str, BaseStateBackend]]:
    """The daemon's database URL and a backend open on it, for SQLite or PostgreSQL."""
    if kind == "sqlite":
        path = tmp_path / "state.db"
        async with SqliteStateBackend(path) as backend:
            yield f"sqlite:///{path}", backend
        return
    async with (
        fresh_pg_database(request.getfixturevalue("pg_dsn"), prefix="wk_names") as (_, dsn),
        PostgresStateBackend(dsn) as backend,
    ):
        yield dsn, backend


class TestBadNames:
    @pytest.mark.parametrize(
        "kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
    )
    async def test_bad_asset_names_refuse_their_files_and_new_files_still_load(
        self,
        kind: str,
        tmp_path: Path,
        watchers: Path,
        env: dict[str, str],
        log_file: IO[bytes],
        request: pytest.FixtureRequest,
    ) -> None:
        """Asset names with NUL, a lone surrogate or over the length limit refuse their files
        (named, with the reason) instead of ending the daemon; the good watcher runs, and a
        valid file added later is loaded (no reload that fails forever)."""
        alpha, beta = tmp_path / "alpha.txt", tmp_path / "beta.txt"
        append_lines(alpha, 1, 2)
        append_lines(beta, 1, 3)
        (watchers / "alpha.py").write_text(asset_file("alpha", alpha))
        for file, name in BAD_NAMES.items():
            (watchers / file).write_text(bad_name_file(name, alpha))
        async with database(kind, tmp_path, request) as (url, backend):
            env = {**env, "WATCHKEEPER__DATABASE__URL": url}
            async with daemon(tmp_path, watchers, env, log_file) as process:

                async def alpha_done() -> bool:
                    return await payloads(backend, "alpha") == [1, 2]  # type: ignore[arg-type]

                await wait_until(alpha_done, "the good watcher's events", process)
                (watchers / "beta.py").write_text(asset_file("beta", beta))

                async def beta_done() -> bool:
                    return await payloads(backend, "beta") == [1, 2, 3]  # type: ignore[arg-type]

                await wait_until(beta_done, "the file added at runtime", process)
                assert await terminate(process) == 0
            assert sorted(a.name for a in await backend.events.alist_assets()) == ["alpha", "beta"]
        reasons = refusals(tmp_path)
        assert set(reasons) == set(BAD_NAMES)
        assert "control character '\\x00'" in reasons["nul.py"]
        assert "lone surrogate" in reasons["surrogate.py"]
        assert "3000 bytes in UTF-8, over the limit of 1024" in reasons["long.py"]
        assert not [e for e in log_events(tmp_path) if e["event"] == "watchers_reload_failed"]


async def cli_json(env: dict[str, str], cwd: Path, *args: str) -> Any:
    result = await anyio.run_process(watchkeeper_command(*args), env=env, cwd=cwd, check=False)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


class TestTruthfulStatus:
    async def test_status_after_sigkill_says_stale_and_unknown(
        self,
        tmp_path: Path,
        watchers: Path,
        db_path: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """While the daemon runs, status shows it live with its heartbeat age, its watcher
        running with a labelled counter, and the refused file with its reason; events carry
        the watcher's name. After SIGKILL, once its lease time has passed, the daemon is
        ``stale`` and its watcher ``unknown`` (in the table and in ``--json``)."""
        alpha = tmp_path / "alpha.txt"
        append_lines(alpha, 1, 3)
        (watchers / "alpha.py").write_text(asset_file("alpha", alpha))
        (watchers / "broken.py").write_text("def oops(:\n")
        env = {**env, "WATCHKEEPER__TRIGGERER__LEASE_TTL": "1.0"}
        async with SqliteStateBackend(db_path) as backend:
            async with daemon(tmp_path, watchers, env, log_file) as process:

                async def counted() -> bool:
                    rows = (await status_report(backend))["watchers"]
                    return [r["events_since_start"] for r in rows] == [3]

                await wait_until(counted, "the watcher's saved status", process)
                report = await cli_json(env, tmp_path, "status", "--json")
                (live,) = report["daemons"]
                assert live["state"] == "running"
                assert 0 <= live["heartbeat_age_seconds"] < live["lease_ttl_seconds"] == 1.0
                assert [(r["file"], r["watcher"]) for r in live["refused"]] == [("broken.py", None)]
                assert live["refused"][0]["reason"].startswith("SyntaxError")
                (row,) = report["watchers"]
                assert (row["state"], row["owner"]) == ("running", live["owner"])
                events = await anyio.run_process(
                    watchkeeper_command("events", "--json"), env=env, cwd=tmp_path
                )
                lines = [json.loads(line) for line in events.stdout.decode().splitlines()]
                assert [(e["asset"], e["watcher"]) for e in lines] == [("alpha", "alpha_feed")] * 3
                process.kill()
                with anyio.fail_after(WAIT):
                    assert await process.wait() == -signal.SIGKILL

            async def stale() -> bool:
                daemons = (await status_report(backend))["daemons"]
                return [d["state"] for d in daemons] == ["stale"]

            await wait_until(stale, "the dead daemon to be reported stale")
        report = await cli_json(env, tmp_path, "status", "--json")
        assert [d["state"] for d in report["daemons"]] == ["stale"]
        assert report["daemons"][0]["heartbeat_age_seconds"] > 1.0
        (row,) = report["watchers"]
        assert (row["state"], row["reported_state"]) == ("unknown", "running")
        table = await anyio.run_process(
            watchkeeper_command("status"), env={**env, "COLUMNS": "200"}, cwd=tmp_path
        )
        out = table.stdout.decode()
        for text in ("stale", "unknown", "events since start", "refused definitions", "broken.py"):
            assert text in out, out


class TestReadingProcessLifetime:
    async def test_a_daemon_killed_while_a_file_hangs_leaves_no_reading_process(
        self,
        tmp_path: Path,
        watchers: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """SIGKILL gives the daemon no chance to kill the process reading a hung file: that
        process notices its parent is gone and exits by itself."""
        marker = tmp_path / "busy.pid"
        (watchers / "busy.py").write_text(hanging_file(marker, "sleep"))
        env = {**env, "WATCHKEEPER__TRIGGERER__IMPORT_TIMEOUT": "600"}
        async with daemon(tmp_path, watchers, env, log_file) as process:
            await wait_until(marker.exists, "the hanging import to start", process)
            process.kill()
            with anyio.fail_after(WAIT):
                assert await process.wait() == -signal.SIGKILL
        await wait_until(lambda: gone(int(marker.read_text())), "the orphaned reading process")
