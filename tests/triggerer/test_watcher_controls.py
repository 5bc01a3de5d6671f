"""Watcher controls: pause, resume and retry as rows in the store, acted on by the daemon.

In-process daemons on the memory backend for the heartbeat logic, the ``watchkeeper
watchers`` and ``state-store set`` commands on a SQLite file, and a real daemon process for a
pause that must survive a restart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from watchkeeper.store import Asset, AssetScope, MemoryStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import DaemonStatus, TriggerStatus
from watchkeeper.triggerer import Settings, TriggererSettings, cli
from watchkeeper.triggerer.daemon import Daemon
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers

from tests.support.daemons import (
    FAILING_WATCHER,
    append_lines,
    asset_file,
    daemon,
    log_events,
    payloads,
    terminate,
    wait_until,
    watchkeeper_command,
)


def _settings(watchers: Path, **triggerer: Any) -> Settings:
    """No renewal unless the test calls ``renew_leases()`` (unless it says otherwise)."""
    triggerer.setdefault("lease_renew_interval", 3600)
    return Settings(
        triggerer=TriggererSettings(
            watchers_path=watchers, gc_interval=0, stop_grace=1, **triggerer
        )
    )


@pytest.fixture(autouse=True)
def _unload() -> Iterator[None]:
    yield
    unload_watchers()


class TestDaemonActsOnControls:
    async def test_pause_stops_at_the_next_heartbeat_and_resume_starts_again(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """A paused watcher is stopped by the next heartbeat, its status says paused, and a
        resume starts it again from its watermark."""
        source = tmp_path / "lines.txt"
        append_lines(source, 1, 2)
        (watchers / "orders.py").write_text(asset_file("orders", source))
        async with (
            MemoryStateBackend() as backend,
            Daemon(_settings(watchers), backend=backend) as d,
        ):

            async def two() -> bool:
                return [e.payload["n"] for e in await backend.events.alist_events()] == [1, 2]

            await wait_until(two, "the first events")
            await backend.controls.aset_watcher_paused("orders_feed", True, by="test")
            report = await d.renew_leases()
            assert len(report.stopped) == 1 and d.groups == {}
            assert [s.state for s in await backend.status.alist_trigger_status()] == ["paused"]
            assert [lease.owner for lease in await backend.leases.alist_leases()] == [None]
            append_lines(source, 3, 3)
            assert (await d.renew_leases()).started == []  # still paused
            await backend.controls.aset_watcher_paused("orders_feed", False, by="test")
            await d.renew_leases()  # (the lease loop, woken by the release, may be first)
            assert len(d.groups) == 1

            async def three() -> bool:
                return [e.payload["n"] for e in await backend.events.alist_events()] == [1, 2, 3]

            await wait_until(three, "the resumed watcher to emit line 3")

    async def test_a_watcher_paused_before_start_is_not_started(self, watchers: Path) -> None:
        """A daemon starting with a paused watcher's row does not run it."""
        (watchers / "broken.py").write_text(FAILING_WATCHER)
        async with MemoryStateBackend() as backend:
            await backend.controls.aset_watcher_paused("broken_feed", True, by="test")
            async with Daemon(_settings(watchers), backend=backend) as d:
                assert d.groups == {}

    async def test_retry_restarts_a_failed_watcher_once(self, watchers: Path) -> None:
        """A retry request restarts a failed watcher at the next heartbeat, and only once."""
        (watchers / "broken.py").write_text(FAILING_WATCHER)
        settings = _settings(watchers, max_failures=1, backoff_initial=0.001, backoff_max=0.001)
        async with MemoryStateBackend() as backend, Daemon(settings, backend=backend) as d:

            def failed() -> bool:
                return [s.state for s in d.runner.statuses()] == ["failed"]

            await wait_until(failed, "the trigger to fail")
            assert (await d.renew_leases()).started == []  # failed stays failed
            await backend.controls.arequest_watcher_retry("broken_feed", by="test")
            assert len((await d.renew_leases()).started) == 1
            await wait_until(failed, "the retried trigger to fail again")
            assert (await d.renew_leases()).started == []


def _status(watcher: str, asset: str, state: str = "running") -> TriggerStatus:
    return TriggerStatus(
        trigger_id=f"t-{watcher}",
        classpath="m.C",
        assets=(asset,),
        watchers=(watcher,),
        state=state,
        failures=1 if state == "failed" else 0,
        events=7,
        owner="host:1:abc",
    )


class TestWatchersCommand:
    @pytest.fixture
    def db(self, tmp_path: Path) -> Path:
        path = tmp_path / "state.db"
        with SqliteStateBackend(path) as backend:
            backend.run_sync(backend.events.aregister_assets, [Asset("orders"), Asset("bills")])
            rows = [_status("orders_feed", "orders"), _status("bills_feed", "bills", "failed")]
            backend.run_sync(backend.status.asave_trigger_status, rows)
            now = backend.clock()  # the daemon that saved them is alive (a fresh heartbeat)
            daemon = DaemonStatus("host:1:abc", now, now, 3600.0, "watchers")
            backend.run_sync(backend.status.asave_daemon_status, daemon)
        return path

    def test_list_json_merges_status_and_controls(
        self, db: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``watchers list --json`` shows each watcher's state, daemon, failures and paused flag."""
        url = f"sqlite:///{db}"
        assert cli.run(["--database-url", url, "watchers", "pause", "orders_feed"]) == 0
        capsys.readouterr()
        assert cli.run(["--database-url", url, "watchers", "list", "--json"]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(r["watcher"], r["state"], r["paused"], r["failures"]) for r in rows] == [
            ("bills_feed", "failed", False, 1),
            ("orders_feed", "pausing", True, 0),
        ]
        assert rows[1]["daemon"] == "host:1:abc" and rows[1]["assets"] == ["orders"]

    def test_pause_resume_retry_write_rows(
        self, db: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """pause, resume and retry record their rows with the CLI user as the writer."""
        url = f"sqlite:///{db}"
        assert cli.run(["--database-url", url, "watchers", "pause", "bills_feed"]) == 0
        assert cli.run(["--database-url", url, "watchers", "resume", "bills_feed"]) == 0
        assert cli.run(["--database-url", url, "watchers", "retry", "bills_feed"]) == 0
        assert "retried" in capsys.readouterr().out
        with SqliteStateBackend(db) as backend:
            assert backend.services.controls is not None
            (row,) = backend.run_sync(backend.controls.alist_watcher_controls)
        assert (row.watcher, row.paused, row.retry_seq) == ("bills_feed", False, 1)
        assert row.updated_by is not None and row.updated_by.startswith("cli:")

    def test_retry_of_an_unknown_watcher_is_an_error(
        self, db: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``watchers retry`` of a name no daemon reported fails with one line, writing nothing."""
        assert cli.run(["--database-url", f"sqlite:///{db}", "watchers", "retry", "nope"]) == 1
        assert "no watcher named 'nope'" in capsys.readouterr().err
        with SqliteStateBackend(db) as backend:
            assert backend.run_sync(backend.controls.alist_watcher_controls) == []

    @pytest.mark.parametrize("action", ["pause", "resume", "retry"])
    def test_a_typo_is_an_error_naming_the_closest_watcher(
        self, db: Path, capsys: pytest.CaptureFixture[str], action: str
    ) -> None:
        """pause, resume or retry of an unknown name exits 1 with one line naming the closest
        known watcher, and records nothing (no phantom paused watcher in the list)."""
        url = f"sqlite:///{db}"
        assert cli.run(["--database-url", url, "watchers", action, "orders_fed"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "no watcher named 'orders_fed'; did you mean 'orders_feed'?" in err
        with SqliteStateBackend(db) as backend:
            assert backend.run_sync(backend.controls.alist_watcher_controls) == []
        assert cli.run(["--database-url", url, "watchers", "list", "--json"]) == 0
        listed = [json.loads(line)["watcher"] for line in capsys.readouterr().out.splitlines()]
        assert listed == ["bills_feed", "orders_feed"]

    def test_state_set_warns_about_a_running_unpaused_watcher(
        self, db: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Setting a key of an asset whose watcher runs is refused (nothing written); with
        ``--force`` it warns and writes; once paused it writes without a word."""
        url = f"sqlite:///{db}"
        base = ["--database-url", url, "state-store", "set", "--asset", "orders", "wm", "5"]
        assert cli.run(base) == 1
        refused = capsys.readouterr()
        assert "'orders_feed' of asset 'orders' is running" in refused.err and refused.out == ""
        assert cli.run([*base, "--force"]) == 0
        assert "warning: watcher 'orders_feed'" in capsys.readouterr().err
        assert cli.run(["--database-url", url, "watchers", "pause", "orders_feed"]) == 0
        capsys.readouterr()
        assert cli.run([*base, "--expected-version", "1"]) == 0
        captured = capsys.readouterr()
        assert captured.err == "" and "version 2" in captured.out
        with SqliteStateBackend(db) as backend:
            assert backend.get(AssetScope(name="orders"), "wm") == 5


async def _cli(environ: dict[str, str], *args: str) -> None:
    """Run ``watchkeeper ARGS`` as its own process (the test's loop is running)."""
    with anyio.fail_after(30):
        await anyio.run_process(watchkeeper_command(*args), env=environ)


@pytest.mark.slow
class TestPauseAcrossRestart:
    async def test_a_paused_watcher_stays_paused_after_a_daemon_restart(
        self,
        tmp_path: Path,
        watchers: Path,
        env: dict[str, str],
        log_file: IO[bytes],
        db_path: Path,
    ) -> None:
        """Paused from the CLI, a watcher stops, a restarted daemon does not start it, and
        after resume it catches up with every line exactly once."""
        source = tmp_path / "lines.txt"
        append_lines(source, 1, 3)
        (watchers / "orders.py").write_text(asset_file("orders", source))
        async with daemon(tmp_path, watchers, env, log_file) as process:
            async with SqliteStateBackend(db_path) as backend:

                async def three() -> bool:
                    return await payloads(backend, "orders") == [1, 2, 3]

                await wait_until(three, "lines 1-3", process)
            await _cli(env, "watchers", "pause", "orders_feed")
            async with SqliteStateBackend(db_path) as backend:

                async def paused() -> bool:
                    return [s.state for s in await backend.status.alist_trigger_status()] == [
                        "paused"
                    ]

                await wait_until(paused, "the daemon to pause the watcher", process)
            assert await terminate(process) == 0
        append_lines(source, 4, 6)
        async with daemon(tmp_path, watchers, env, log_file) as process:

            def started() -> list[int]:
                return [
                    e["triggers"] for e in log_events(tmp_path) if e["event"] == "daemon_started"
                ]

            await wait_until(lambda: len(started()) == 2, "the second daemon to start", process)
            assert started()[1] == 0  # the paused watcher was not started
            async with SqliteStateBackend(db_path) as backend:
                assert await payloads(backend, "orders") == [1, 2, 3]
                await _cli(env, "watchers", "resume", "orders_feed")

                async def six() -> bool:
                    return await payloads(backend, "orders") == [1, 2, 3, 4, 5, 6]

                await wait_until(six, "the resumed watcher to catch up", process)
            assert await terminate(process) == 0
