"""The command line next to a real running ``watchkeeper triggerer``: what it refuses while a
watcher runs, and what it says about the daemon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import anyio
from watchkeeper.store import AssetScope, SqliteStateBackend

from tests.support.daemons import asset_file, daemon, terminate, wait_until, watchkeeper_command


async def cli(env: dict[str, str], cwd: Path, *args: str) -> tuple[int, str, str]:
    done = await anyio.run_process(watchkeeper_command(*args), check=False, cwd=cwd, env=env)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def watcher_row(env: dict[str, str], cwd: Path, name: str) -> dict[str, Any] | None:
    code, out, _ = await cli(env, cwd, "watchers", "list", "--json")
    rows = [json.loads(line) for line in out.splitlines()] if code == 0 else []
    return next((row for row in rows if row["watcher"] == name), None)


async def note_entry(db_path: Path) -> object:
    async with SqliteStateBackend(db_path) as backend:
        entry = await backend.aget_entry(AssetScope(name="orders"), "note")
    return None if entry is None else (entry.value, entry.version)


class TestStateStoreSetUnderARunningWatcher:
    async def test_refused_without_force_written_with_it_and_after_pause(
        self,
        tmp_path: Path,
        watchers: Path,
        env: dict[str, str],
        log_file: IO[bytes],
        db_path: Path,
    ) -> None:
        """While ``orders_feed`` runs, ``state-store set --asset orders`` writes nothing and
        exits 1 with one line naming the watcher, ``pause`` and ``--force``; ``--force``
        warns first and writes; once the watcher is paused the plain set writes."""
        (watchers / "orders.py").write_text(asset_file("orders", tmp_path / "orders.txt"))
        async with daemon(tmp_path, watchers, env, log_file) as process:

            async def running() -> bool:
                row = await watcher_row(env, tmp_path, "orders_feed")
                return row is not None and row["state"] == "running"

            await wait_until(running, "orders_feed to run", process)
            code, out, err = await cli(
                env, tmp_path, "state-store", "set", "--asset", "orders", "note", "1"
            )
            assert code == 1 and out == ""
            (line,) = err.splitlines()
            assert line.startswith("watchkeeper: error: watcher 'orders_feed' of asset 'orders'")
            assert "nothing written" in line and "watchers pause orders_feed" in line
            assert "--force" in line
            assert await note_entry(db_path) is None

            code, out, err = await cli(
                env, tmp_path, "state-store", "set", "--asset", "orders", "note", "2", "--force"
            )
            assert code == 0, err
            assert err.startswith("watchkeeper: warning: watcher 'orders_feed'"), err
            assert await note_entry(db_path) == (2, 1)

            assert (await cli(env, tmp_path, "watchers", "pause", "orders_feed"))[0] == 0
            code, _, err = await cli(
                env, tmp_path, "state-store", "set", "--asset", "orders", "note", "3"
            )
            assert (code, err) == (0, "")
            assert await note_entry(db_path) == (3, 2)
            assert await terminate(process) == 0


class TestStatusShowsTheDaemonsOwnSettings:
    async def test_lease_and_heartbeat_are_the_daemons_not_the_readers(
        self,
        tmp_path: Path,
        watchers: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """A daemon renewing its node lease every 0.5 s (a 1.5 s lease) with a heartbeat every
        2 s: ``status``, run with other settings, shows the daemon's 1.5 s lease and 2 s
        heartbeat (it showed 6 s: the time after which the row is stale, as the lease)."""
        (watchers / "orders.py").write_text(asset_file("orders", tmp_path / "orders.txt"))
        own = {
            **env,
            "WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL": "2",
            "WATCHKEEPER__TRIGGERER__LEASE_RENEW_INTERVAL": "0.5",
        }
        reader = {**env, "WATCHKEEPER__TRIGGERER__LEASE_TTL": "9"}
        async with daemon(tmp_path, watchers, own, log_file) as process:

            async def reported() -> list[dict[str, Any]]:
                code, out, _ = await cli(reader, tmp_path, "status", "--json")
                return list(json.loads(out)["daemons"]) if code == 0 and out else []

            await wait_until(reported, "the daemon's status row", process)
            (row,) = await reported()
            code, table, err = await cli({**reader, "COLUMNS": "200"}, tmp_path, "status")
            assert await terminate(process) == 0
        assert row["lease_ttl_seconds"] == 1.5 and row["stale_after_seconds"] == 6.0
        assert row["settings"] == {
            "heartbeat_interval": 2.0,
            "lease_renew_interval": 0.5,
            "lease_ttl": 1.5,
            "reload_interval": 0.2,
        }
        assert code == 0, err
        (line,) = [line for line in table.splitlines() if row["owner"][:20] in line]
        cells = [cell.strip() for cell in line.split("│")]
        assert "2 s" in cells and "1.5 s" in cells and "6 s" not in cells, line
