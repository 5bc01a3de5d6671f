"""The daemon: a real ``watchkeeper triggerer`` process on a SQLite file, and its reloads."""

from __future__ import annotations

import functools
import json
import operator
import signal
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import pytest
from pydantic import SecretStr
from watchkeeper.store import (
    Asset,
    AssetScope,
    BackendUnavailableError,
    EventsSettings,
    MemoryStateBackend,
    SqliteStateBackend,
)
from watchkeeper.store.protocols import DaemonStatus, EventCommit, RefusedDefinition, TriggerStatus
from watchkeeper.store.settings import DatabaseSettings
from watchkeeper.triggerer import Settings, TriggererSettings, cli
from watchkeeper.triggerer.cli._runtime import status_report
from watchkeeper.triggerer.daemon import Daemon
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers

from tests.support.daemons import (
    FAILING_WATCHER,
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
from tests.support.runtime import watch_logs


@pytest.mark.slow
class TestDaemonProcess:
    async def test_runs_watchers_reports_status_and_stops_on_sigterm(
        self,
        tmp_path: Path,
        watchers: Path,
        db_path: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """It registers the assets, commits events, refuses a broken file, shows status, exits 0."""
        alpha, beta = tmp_path / "alpha.txt", tmp_path / "beta.txt"
        append_lines(alpha, 1, 3)
        append_lines(beta, 1, 2)
        (watchers / "alpha.py").write_text(asset_file("alpha", alpha))
        (watchers / "beta.py").write_text(asset_file("beta", beta))
        (watchers / "broken.py").write_text("def oops(:\n")
        async with SqliteStateBackend(db_path) as backend:
            async with daemon(tmp_path, watchers, env, log_file) as process:

                async def committed() -> bool:
                    return await payloads(backend, "alpha") == [1, 2, 3] and await payloads(
                        backend, "beta"
                    ) == [1, 2]

                await wait_until(committed, "the events", process)

                async def both_saved() -> bool:
                    rows = await backend.status.alist_trigger_status()
                    return len(rows) == 2 and all(r.events > 0 for r in rows)

                await wait_until(both_saved, "the trigger statuses", process)
                status = await anyio.run_process(
                    watchkeeper_command("status", "--json"), env=env, cwd=tmp_path, check=False
                )
                assert status.returncode == 0, status.stderr.decode()
                rows = json.loads(status.stdout)["watchers"]
                assert sorted(w for r in rows for w in r["watchers"]) == ["alpha_feed", "beta_feed"]
                by_watcher = {r["watchers"][0]: r for r in rows}
                assert by_watcher["alpha_feed"]["state"] == "running"
                assert by_watcher["alpha_feed"]["assets"] == [
                    {"name": "alpha", "active": True, "state": {"watermark": 3}}
                ]
                assert by_watcher["beta_feed"]["assets"][0]["state"] == {"watermark": 2}
                assert await terminate(process) == 0
            assets = {a.name: a.active for a in await backend.events.alist_assets()}
            assert assets == {"alpha": True, "beta": True}
        events = [e["event"] for e in log_events(tmp_path)]
        assert events.index("daemon_started") < events.index("daemon_stopped")
        refused = [e for e in log_events(tmp_path) if e["event"] == "watcher_refused"]
        assert refused[0]["file"] == "broken.py"
        assert "SyntaxError" in refused[0]["reason"]

    async def test_restart_after_kill_resumes_from_the_watermark(
        self,
        tmp_path: Path,
        watchers: Path,
        db_path: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """After SIGKILL, a restarted daemon continues after the watermark: no gap, no duplicate."""
        alpha = tmp_path / "alpha.txt"
        append_lines(alpha, 1, 5)
        (watchers / "alpha.py").write_text(asset_file("alpha", alpha))
        async with SqliteStateBackend(db_path) as backend:
            async with daemon(tmp_path, watchers, env, log_file) as first:

                async def five() -> bool:
                    return len(await payloads(backend, "alpha")) >= 5

                await wait_until(five, "five events", first)
                first.kill()
                with anyio.fail_after(WAIT):
                    assert await first.wait() == -signal.SIGKILL
            append_lines(alpha, 6, 10)
            async with daemon(tmp_path, watchers, env, log_file) as second:

                async def ten() -> bool:
                    return len(await payloads(backend, "alpha")) >= 10

                await wait_until(ten, "ten events", second)
                assert await terminate(second) == 0
            assert await payloads(backend, "alpha") == list(range(1, 11))
            assert await backend.aget(AssetScope(name="alpha"), "watermark") == 10

    async def test_follows_added_and_removed_watcher_files(
        self,
        tmp_path: Path,
        watchers: Path,
        db_path: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """A new file starts its watcher; a removed file's asset is deactivated and swept by GC."""
        alpha, beta = tmp_path / "alpha.txt", tmp_path / "beta.txt"
        append_lines(alpha, 1, 2)
        append_lines(beta, 1, 4)
        (watchers / "alpha.py").write_text(asset_file("alpha", alpha))
        async with (
            SqliteStateBackend(db_path) as backend,
            daemon(tmp_path, watchers, env, log_file) as process,
        ):

            async def alpha_done() -> bool:
                return await payloads(backend, "alpha") == [1, 2]

            await wait_until(alpha_done, "alpha's events", process)
            (watchers / "beta.py").write_text(asset_file("beta", beta))

            async def beta_done() -> bool:
                return await payloads(backend, "beta") == [1, 2, 3, 4]

            await wait_until(beta_done, "the new watcher's events", process)
            (watchers / "alpha.py").unlink()

            async def alpha_inactive() -> bool:
                active = {a.name for a in await backend.events.alist_assets(active_only=True)}
                return active == {"beta"}

            await wait_until(alpha_inactive, "alpha's deactivation", process)

            def swept() -> bool:
                return any(
                    e["event"] == "gc_done" and e["orphaned"] >= 1 for e in log_events(tmp_path)
                )

            await wait_until(swept, "the GC pass that sweeps alpha's state", process)

            async def status_forgot_alpha() -> bool:
                rows = await backend.status.alist_trigger_status()
                return [r.watchers for r in rows] == [("beta_feed",)]

            await wait_until(status_forgot_alpha, "alpha's status row to go", process)
            assert await terminate(process) == 0
        deactivated = [e for e in log_events(tmp_path) if e["event"] == "asset_deactivated"]
        assert [e["asset"] for e in deactivated] == ["alpha"]


class TestDaemonReload:
    """The reload logic in-process, on the memory backend (no timing involved)."""

    @pytest.fixture(autouse=True)
    def _unload(self) -> Iterator[None]:
        yield
        unload_watchers()

    def settings(self, watchers: Path) -> Settings:
        return Settings(
            triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0, stop_grace=1),
            database=DatabaseSettings(url=SecretStr("sqlite:///:memory:")),
        )

    async def test_changed_kwargs_restart_the_trigger(self, tmp_path: Path, watchers: Path) -> None:
        """Editing a watcher's kwargs stops the old trigger and starts the new one."""
        (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "one.txt"))
        async with (
            MemoryStateBackend() as backend,
            Daemon(self.settings(watchers), backend=backend) as d,
        ):
            (old,) = d.groups
            (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "two.txt"))
            report = await d.reload()
            (new,) = d.groups
            assert report.stopped == [old]
            assert report.started == [new]
            assert report.deactivated == []
            assert d.runner.trigger_ids() == {new}

    async def test_a_reload_whose_apply_failed_is_retried_without_reading_again(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """When registering a new file's assets fails (the store down, say), the next polls
        retry applying what was read, without starting a reading process again."""

        class RegisterFails(MemoryStateBackend):
            failures = 0

            async def _aregister_assets(self, assets: list[Asset]) -> None:
                if self.failures:
                    self.failures -= 1
                    raise BackendUnavailableError("the store is down")
                await super()._aregister_assets(assets)

        reads = tmp_path / "reads.txt"
        counting = asset_file("beta", tmp_path / "two.txt") + textwrap.dedent(
            f"""
            import sys
            if sys.argv[0] == "-c":  # the reading process, not the daemon's own import
                open({str(reads)!r}, "a").write("read\\n")
            """
        )
        (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "one.txt"))
        with watch_logs() as logs:
            async with (
                RegisterFails() as backend,
                Daemon(self.settings(watchers), backend=backend, reload_interval=0.05) as d,
            ):
                backend.failures = 2
                (watchers / "beta.py").write_text(counting)
                await logs.wait_for("watchers_reloaded", count=2)
                assert len(d.groups) == 2
        assert len(logs.named("watchers_reload_failed")) == 2
        assert reads.read_text().splitlines() == ["read"]

    async def test_unchanged_definitions_keep_their_triggers(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """A reload with nothing changed stops and starts nothing."""
        (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "one.txt"))
        async with (
            MemoryStateBackend() as backend,
            Daemon(self.settings(watchers), backend=backend) as d,
        ):
            report = await d.reload()
            assert (report.started, report.stopped) == ([], [])

    async def test_a_file_broken_by_an_edit_keeps_its_watcher(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """A syntax error in an edited file neither stops its trigger nor deactivates its asset."""
        (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "one.txt"))
        async with (
            MemoryStateBackend() as backend,
            Daemon(self.settings(watchers), backend=backend) as d,
        ):
            before = set(d.groups)
            (watchers / "alpha.py").write_text("def oops(:\n")
            report = await d.reload()
            assert report.errors == 1
            assert (report.stopped, report.deactivated) == ([], [])
            assert set(d.groups) == before
            assert [a.name for a in await backend.events.alist_assets(active_only=True)] == [
                "alpha"
            ]

    async def test_exit_stops_every_trigger_and_saves_stopped(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """Leaving the daemon stops its triggers; their saved status reads ``stopped``."""
        (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "one.txt"))
        async with MemoryStateBackend() as backend:
            async with Daemon(self.settings(watchers), backend=backend) as d:
                assert len(d.groups) == 1
            assert [r.state for r in await backend.status.alist_trigger_status()] == ["stopped"]
            assert repr(d).endswith("open=False>")


class TestDaemonGarbageCollection:
    async def test_periodic_gc_deletes_events_past_retention(self, watchers: Path) -> None:
        """The daemon's GC loop applies [events] retention: old events go (the one with a
        dedup_key after its dedup window), recent ones stay, and gc_done counts them."""
        settings = Settings(
            triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0.01, stop_grace=1),
            events=EventsSettings(retention_days=1, dedup_retention_days=3),
        )
        now = datetime.now(UTC)
        async with MemoryStateBackend() as backend:
            await backend.events.aregister_assets([Asset("orders")])
            for age, dedup_key in ((2, None), (2, "kept"), (4, "gone"), (0, None)):
                backend.clock = functools.partial(operator.sub, now, timedelta(days=age))
                await backend.events.acommit(
                    EventCommit("feed", ("orders",), json.dumps(age), dedup_key=dedup_key)
                )
            backend.clock = lambda: now
            with watch_logs() as logs:
                async with Daemon(settings, backend=backend):
                    (done, *_) = await logs.wait_for("gc_done")
            assert done["events"] == 2
            remaining = [(e.payload, e.dedup_key) for e in await backend.events.alist_events()]
            assert remaining == [(2, "kept"), (0, None)]


TWO_NAMES = """
import anyio

from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent


class Echo(BaseEventTrigger):
    def serialize(self):
        return (self.classpath(), {})

    async def run(self):
        yield TriggerEvent(self.watcher_name, state={f"{self.watcher_name}.seen": True})
        await anyio.sleep_forever()


orders = Asset("orders", watchers=[AssetWatcher("first", Echo()), AssetWatcher("second", Echo())])
"""


class TestDaemonWatcherNames:
    @pytest.fixture(autouse=True)
    def _unload(self) -> Iterator[None]:
        yield
        unload_watchers()

    async def test_identical_triggers_under_two_names_run_as_two_watchers(
        self, watchers: Path
    ) -> None:
        """Two AssetWatchers with equal triggers run twice, each bound to its own name."""
        (watchers / "named.py").write_text(TWO_NAMES)
        settings = Settings(triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0))
        async with MemoryStateBackend() as backend, Daemon(settings, backend=backend) as d:
            assert len(d.groups) == 2

            async def both_emitted() -> bool:
                return sorted(e.payload for e in await backend.events.alist_events()) == [
                    "first",
                    "second",
                ]

            await wait_until(both_emitted, "one event from each watcher")
            state = {e.key: e.value for e in await backend.alist(AssetScope(name="orders"))}
            assert state == {"first.seen": True, "second.seen": True}
            assert sorted(s.watchers for s in d.runner.statuses()) == [("first",), ("second",)]


class TestDaemonFailedTriggers:
    @pytest.fixture(autouse=True)
    def _unload(self) -> Iterator[None]:
        yield
        unload_watchers()

    async def test_reload_restarts_a_failed_trigger(self, watchers: Path) -> None:
        """A trigger in the ``failed`` state is started afresh by the next reload."""
        (watchers / "broken.py").write_text(FAILING_WATCHER)
        settings = Settings(
            triggerer=TriggererSettings(
                watchers_path=watchers,
                gc_interval=0,
                stop_grace=1,
                max_failures=1,
                backoff_initial=0.001,
                backoff_max=0.001,
            ),
        )
        async with MemoryStateBackend() as backend, Daemon(settings, backend=backend) as d:
            (trigger_id,) = d.groups

            def failed() -> bool:
                return [s.state for s in d.runner.statuses()] == ["failed"]

            await wait_until(failed, "the trigger to fail")
            report = await d.reload()
            assert report.stopped == [trigger_id]
            assert report.started == [trigger_id]


class TestRuntimeCommands:
    def test_triggerer_without_a_watchers_directory_is_a_usage_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``triggerer`` with a watchers path that is not a directory exits 2 and starts nothing."""
        db = tmp_path / "state.db"
        args = ["--database-url", f"sqlite:///{db}", "triggerer", "--watchers-path"]
        assert cli.run([*args, str(tmp_path / "nowhere")]) == 2
        assert "is not a directory" in capsys.readouterr().err
        assert not db.exists()

    def test_status_without_a_database_is_a_clear_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``status`` on a SQLite file that does not exist says so and creates nothing."""
        missing = tmp_path / "none.db"
        assert cli.run(["--database-url", f"sqlite:///{missing}", "status"]) == 1
        assert "no database at" in capsys.readouterr().err
        assert not missing.exists()

    def test_status_table_shows_watchers_states_and_watermarks(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The human table lists each watcher with its state, asset and watermark."""
        path = tmp_path / "state.db"
        with SqliteStateBackend(path) as backend:
            backend.run_sync(backend.events.aregister_assets, [Asset("orders")])
            backend.set(AssetScope(name="orders"), "watermark", 42)
            status = TriggerStatus(
                trigger_id="abc123",
                classpath="m.C",
                assets=("orders",),
                watchers=("orders_feed",),
                state="backing_off",
                failures=2,
                last_error="RuntimeError: source is down",
                events=42,
            )
            backend.run_sync(backend.status.asave_trigger_status, [status])
        monkeypatch.setenv("COLUMNS", "200")
        assert cli.run(["--database-url", f"sqlite:///{path}", "status"]) == 0
        out = capsys.readouterr().out
        for text in ("orders_feed", "abc123", "backing_off", "watermark=42", "source is down"):
            assert text in out


class TestStaleStatuses:
    @pytest.fixture(autouse=True)
    def _unload(self) -> Iterator[None]:
        yield
        unload_watchers()

    async def test_start_forgets_rows_no_daemon_refreshes(self, watchers: Path) -> None:
        """At start, ``stopped`` and long-silent rows of unknown triggers go; fresh ones stay."""
        now = datetime.now(UTC)

        def row(trigger_id: str, state: str, age: float) -> TriggerStatus:
            return TriggerStatus(
                trigger_id=trigger_id,
                classpath="m.C",
                assets=("x",),
                watchers=("x_feed",),
                state=state,
                updated_at=now - timedelta(seconds=age),
            )

        settings = Settings(
            triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0, stop_grace=1)
        )
        async with MemoryStateBackend() as backend:
            await backend.status.asave_trigger_status(
                [
                    row("exited", "stopped", 1),
                    row("killed", "running", 3600),
                    row("elsewhere", "running", 1),
                ]
            )
            async with Daemon(settings, backend=backend):
                rows = await backend.status.alist_trigger_status()
                assert [r.trigger_id for r in rows] == ["elsewhere"]


STUBBORN_WATCHER = """
import anyio
from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent


class Stubborn(BaseEventTrigger):
    def serialize(self):
        return (self.classpath(), {})

    async def run(self):
        yield TriggerEvent({"n": 1})
        while True:
            try:
                await anyio.sleep(3600)
            except BaseException:  # swallows every cancellation: the bug under test
                pass


stubborn = Asset("stubborn", watchers=[AssetWatcher("stubborn", Stubborn())])
"""


@pytest.mark.slow
class TestShutdownWatchdog:
    async def test_a_trigger_that_swallows_cancellation_cannot_hang_shutdown(
        self, tmp_path: Path, env: dict[str, str], log_file: IO[bytes], db_path: Path
    ) -> None:
        """SIGTERM with a trigger that never lets cancellation through still ends the process:
        the watchdog exits with status 70 after the grace period, and the committed event
        stays committed."""
        watchers = tmp_path / "stubborn"
        watchers.mkdir()
        (watchers / "stubborn.py").write_text(STUBBORN_WATCHER)
        env = {**env, "WATCHKEEPER__TRIGGERER__STOP_GRACE": "0.5"}
        async with daemon(tmp_path, watchers, env, log_file) as process:
            async with SqliteStateBackend(db_path) as backend:
                await wait_until(lambda: payloads(backend, "stubborn"), "the first event", process)
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(WAIT):
                status = await process.wait()
        assert status == 70
        assert any(e.get("event") == "daemon_shutdown_stuck" for e in log_events(tmp_path))
        async with SqliteStateBackend(db_path) as backend:
            assert await payloads(backend, "stubborn") == [1]


class TestStatusReport:
    """What ``status`` concludes from the saved rows: a row is true only while its daemon lives."""

    @pytest.fixture(autouse=True)
    def _unload(self) -> Iterator[None]:
        yield
        unload_watchers()

    NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

    def row(self, trigger_id: str, owner: str | None, state: str = "running") -> TriggerStatus:
        return TriggerStatus(
            trigger_id=trigger_id,
            classpath="m.C",
            assets=("x",),
            watchers=(f"{trigger_id}_feed",),
            state=state,
            events=7,
            owner=owner,
        )

    def daemon(self, owner: str, age: float) -> DaemonStatus:
        return DaemonStatus(
            owner=owner,
            started_at=self.NOW - timedelta(hours=1),
            heartbeat_at=self.NOW - timedelta(seconds=age),
            lease_ttl=15.0,
            watchers_path="/srv/watchers",
            refused=(RefusedDefinition("bad.py", None, "import timed out after 30 s"),),
        )

    async def test_stale_daemons_make_their_watchers_unknown(self) -> None:
        """A daemon whose heartbeat is older than its lease time is stale and its watchers
        unknown; a live daemon's watchers keep their state; a row whose daemon left no
        heartbeat row is unknown unless it said stopped (a clean exit)."""
        async with MemoryStateBackend() as backend:
            backend.clock = lambda: self.NOW
            await backend.status.asave_daemon_status(self.daemon("live", age=3))
            await backend.status.asave_daemon_status(self.daemon("dead", age=16))
            await backend.status.asave_trigger_status(
                [
                    self.row("a", "live", "backing_off"),
                    self.row("b", "dead"),
                    self.row("c", "dead", "failed"),
                    self.row("d", "gone", "stopped"),
                    self.row("e", "gone"),
                ]
            )
            report = await status_report(backend)
        daemons = {d["owner"]: d for d in report["daemons"]}
        assert {o: d["state"] for o, d in daemons.items()} == {"dead": "stale", "live": "running"}
        assert daemons["live"]["heartbeat_age_seconds"] == 3
        assert daemons["dead"]["refused"] == [
            {"file": "bad.py", "watcher": None, "reason": "import timed out after 30 s"}
        ]
        states = {r["trigger_id"]: (r["state"], r["reported_state"]) for r in report["watchers"]}
        assert states == {
            "a": ("backing_off", "backing_off"),
            "b": ("unknown", "running"),
            "c": ("unknown", "failed"),
            "d": ("stopped", "stopped"),
            "e": ("unknown", "running"),
        }
        assert {r["events_since_start"] for r in report["watchers"]} == {7}

    async def test_a_heartbeat_a_day_old_is_stale_by_its_whole_age(self) -> None:
        """The age counts whole days too: a heartbeat a day and 3 s old is stale at 86,403 s,
        not a running daemon 3 s behind."""
        async with MemoryStateBackend() as backend:
            backend.clock = lambda: self.NOW
            await backend.status.asave_daemon_status(self.daemon("old", age=86_403))
            report = await status_report(backend)
        (daemon,) = report["daemons"]
        assert (daemon["state"], daemon["heartbeat_age_seconds"]) == ("stale", 86_403)

    async def test_a_daemon_saves_its_row_and_removes_it_on_a_clean_exit(
        self, watchers: Path, tmp_path: Path
    ) -> None:
        """While it runs the daemon's heartbeat row names it with its refusals; a clean exit
        removes the row, and a starting daemon prunes the row of one long dead."""
        (watchers / "alpha.py").write_text(asset_file("alpha", tmp_path / "one.txt"))
        (watchers / "broken.py").write_text("def oops(:\n")
        settings = Settings(
            triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0, stop_grace=1)
        )
        long_dead = DaemonStatus(
            owner="elsewhere:1:dead00",
            started_at=datetime(2020, 1, 1, tzinfo=UTC),
            heartbeat_at=datetime(2020, 1, 1, tzinfo=UTC),
            lease_ttl=15.0,
            watchers_path="/old",
        )
        async with MemoryStateBackend() as backend:
            await backend.status.asave_daemon_status(long_dead)
            async with Daemon(settings, backend=backend, owner="me:1:abc") as d:
                (row,) = await backend.status.alist_daemon_status()
                assert (row.owner, row.watchers_path) == ("me:1:abc", str(d.watchers_path))
                assert [(r.file, r.watcher) for r in row.refused] == [("broken.py", None)]
                # Stale once three heartbeats were missed, or the lease's ttl if longer.
                t = settings.triggerer
                assert row.lease_ttl == max(t.lease_seconds, 3 * t.heartbeat_interval)
            assert await backend.status.alist_daemon_status() == []
