"""kill -9 of a real ``watchkeeper triggerer`` running an Airflow watcher written as Airflow's
documents write one (an Airflow ``BaseEventTrigger``, no watchkeeper import: set the
watermark, then yield): nothing is lost, nothing repeated, because the watermark written
before the yield commits with the event.

The daemon is SIGKILLed ten times at random moments while it emits the lines added before each
start, then restarted to finish; the events are counted with raw SQL (sqlite3). Each run's log must be
JSON lines only, each once: importing Airflow in the daemon must not take its logging over.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import textwrap
from pathlib import Path

import anyio
import anyio.abc
import pytest

from tests.support.daemons import free_port, reap, terminate, watchkeeper_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
KILLS = 10
LINES_PER_RUN = 200
STARTUP = 120.0

WATCHER = '''
"""An asset watcher as Airflow's asset store documentation writes one."""

import asyncio
from pathlib import Path

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class NewLinesTrigger(BaseEventTrigger):
    """One event per new line of a text file; the watermark is the last line's number."""

    def __init__(self, path, poll=0.01):
        super().__init__()
        self.path = path
        self.poll = poll

    def serialize(self):
        return (f"{__name__}.NewLinesTrigger", {"path": self.path, "poll": self.poll})

    async def run(self):
        asset_store = self.asset_state_store[Asset(name="orders")]
        while True:
            watermark = asset_store.get("watermark") or 0
            text = await asyncio.to_thread(Path(self.path).read_text)
            lines = text.splitlines()
            for n in range(watermark + 1, len(lines) + 1):
                asset_store.set("watermark", n)
                yield TriggerEvent({"n": n, "line": lines[n - 1]})
            await asyncio.sleep(self.poll)


orders = Asset(
    name="orders",
    uri="file:///data/orders",
    watchers=[AssetWatcher(name="orders_feed", trigger=NewLinesTrigger(PATH))],
)
'''


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _raw(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the daemon has not created its tables yet
        return []
    finally:
        conn.close()


def _event_count(path: Path) -> int:
    rows = _raw(path, "SELECT count(*) FROM asset_events WHERE asset_name = 'orders'")
    return int(rows[0][0]) if rows else 0  # type: ignore[call-overload]


def _check_log(log: Path) -> int:
    """Fail unless every whole line of ``log`` is a JSON object and no line comes twice;
    the number of lines. (A SIGKILL may cut the last line: it is left out.)"""
    text = log.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    repeated = {line for line in lines if lines.count(line) > 1}
    assert not repeated, f"lines logged twice in {log.name}: {sorted(repeated)[:3]}"
    return len(lines)


async def _wait_for_events(db: Path, count: int, process: anyio.abc.Process, log: Path) -> None:
    """Wait until ``count`` events are stored; a daemon's start imports Airflow twice (in the
    child that reads the files, then in the daemon), which takes long on a loaded machine."""
    with anyio.move_on_after(STARTUP):
        while True:
            if _event_count(db) >= count:
                return
            if process.returncode is not None:
                break
            await anyio.sleep(0.05)
    tail = _tail(log)
    pytest.fail(
        f"{_event_count(db)} events, not {count} (daemon exit status {process.returncode});"
        f" its log ends with:\n{tail}"
    )


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-20:])


def _append(path: Path, start: int, count: int) -> int:
    """Append lines ``start + 1`` to ``start + count``; the last line's number."""
    with path.open("a") as f:
        f.writelines(f"order {n}\n" for n in range(start + 1, start + count + 1))
    return start + count


async def test_airflow_watcher_is_exactly_once_under_sigkill(tmp_path: Path) -> None:
    """Ten SIGKILLs of the daemon mid-stream: every line becomes exactly one event."""
    print(f"chaos seed {SEED} (WATCHKEEPER_CHAOS_SEED={SEED} replays it)")
    rng = random.Random(SEED)
    source = tmp_path / "orders.txt"
    watchers = tmp_path / "watchers"
    watchers.mkdir()
    (watchers / "orders.py").write_text(textwrap.dedent(WATCHER).replace("PATH", repr(str(source))))
    db = tmp_path / "state.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        WATCHKEEPER__DATABASE__URL=f"sqlite:///{db}",
        WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL="0.5",
        WATCHKEEPER__TRIGGERER__GC_INTERVAL="0",
        WATCHKEEPER__TRIGGERER__BACKOFF_INITIAL="0.05",
        WATCHKEEPER__TRIGGERER__STOP_GRACE="5",
        # Importing Airflow in the child that reads the file takes seconds, more when loaded.
        WATCHKEEPER__TRIGGERER__IMPORT_TIMEOUT="100",
        WATCHKEEPER__LOGGING__FORMAT="json",
    )
    source.write_text("")
    total = 0

    async def start(run: int) -> anyio.abc.Process:
        env["WATCHKEEPER__API__PORT"] = str(free_port())
        with (tmp_path / f"daemon-{run}.log").open("ab") as log:
            return await anyio.open_process(
                watchkeeper_command("triggerer", "--watchers-path", str(watchers)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=tmp_path,
                env=env,
            )

    for run in range(KILLS):
        total = _append(source, total, LINES_PER_RUN)
        process = await start(run)
        try:
            # Killed at a random moment once it emits: in the middle of the new lines.
            await _wait_for_events(
                db, _event_count(db) + 1, process, tmp_path / f"daemon-{run}.log"
            )
            await anyio.sleep(rng.uniform(0.0, 0.5))
        finally:
            process.kill()
            await reap(process)
    process = await start(KILLS)
    last_log = tmp_path / f"daemon-{KILLS}.log"
    try:
        await _wait_for_events(db, total, process, last_log)
        # The last kill may have landed after the last line's commit, so the events can all be
        # in before this daemon has even set up its signal handlers: a SIGTERM then would end
        # it by the default action. It is stopped once it says it runs its watchers.
        with anyio.fail_after(120):  # its first load imports Airflow: slow on a loaded host
            while "daemon_started" not in _read(last_log):
                assert process.returncode is None, _read(last_log)[-2000:]
                await anyio.sleep(0.1)
        assert await terminate(process) == 0
    finally:
        await reap(process)

    rows = _raw(db, "SELECT payload FROM asset_events WHERE asset_name = 'orders' ORDER BY id")
    numbers = [json.loads(str(payload))["n"] for (payload,) in rows]
    lost = sorted(set(range(1, total + 1)) - set(numbers))
    repeated = sorted({n for n in numbers if numbers.count(n) > 1})
    print(f"chaos: {KILLS} kills, {total} lines, lost {len(lost)}, repeated {len(repeated)}")
    assert not lost, f"lost: {lost[:20]}"
    assert not repeated, f"repeated: {repeated[:20]}"
    assert numbers == sorted(numbers)
    (watermark,) = _raw(
        db,
        "SELECT s.value FROM asset_state s JOIN assets a ON a.id = s.asset_id "
        "WHERE a.name = 'orders' AND s.key = 'watermark'",
    )
    assert json.loads(str(watermark[0])) == total
    started = 0
    for run in range(KILLS + 1):
        log = tmp_path / f"daemon-{run}.log"
        assert _check_log(log) > 0
        started += '"classpath": "watchkeeper.airflow.AirflowTrigger"' in log.read_text()
    assert started == KILLS + 1
