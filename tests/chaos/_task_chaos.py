"""The harness of the task chaos runs: real ``watchkeeper worker`` processes, killed and restarted.

Events are committed from this process; the workers run two tasks (``consume`` on the source
asset, with an outlet, and ``chained`` on that outlet). A killer SIGKILLs a random worker at
random moments and starts it again. The verdict is read with raw SQL (sqlite3, asyncpg), never
through watchkeeper's API.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from watchkeeper.store import (
    Asset,
    BaseStateBackend,
)
from watchkeeper.store.protocols import EventCommit

COMMAND = [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]

DEFINITIONS = textwrap.dedent(
    """
    import random
    import time

    from watchkeeper.triggerer import Asset, asset_task

    src = Asset("chaos_src")
    mid = Asset("chaos_mid")


    @asset_task(schedule=[src], outlets=[mid], retries=100000, retry_delay=0.01)
    def consume(*, triggering_asset_events, task_state_store, outlet_events, try_number, **_):
        events = triggering_asset_events[src]
        task_state_store.set("tries", try_number)
        time.sleep(random.uniform(0.05, 0.3))  # long enough for kills to land inside
        outlet_events[mid].extra = {"first": events[0].id, "count": len(events)}


    @asset_task(schedule=[mid], retries=100000, retry_delay=0.01)
    def chained(*, triggering_asset_events, **_):
        time.sleep(random.uniform(0.01, 0.1))
    """
)

SOURCE = Asset("chaos_src")


@dataclass
class Verdict:
    """What raw SQL says about one task after the run."""

    task: str
    expected: set[int]
    in_success: list[int]  # event ids in successful runs, one entry per (run, event)
    in_any_run: list[int]
    failed_runs: int
    success_runs: int
    retried_runs: int = 0
    outlets: list[int] = field(default_factory=list)

    @property
    def missing(self) -> set[int]:
        return self.expected - set(self.in_success)

    @property
    def twice(self) -> int:
        return len(self.in_success) - len(set(self.in_success))


def _sqlite(path: Path, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


class Raw:
    """Raw SQL over the store's tables (sqlite3 or asyncpg; ``$n`` becomes ``?`` on SQLite)."""

    def __init__(self, *, path: Path | None = None, dsn: str | None = None) -> None:
        self.path, self.dsn = path, dsn

    async def rows(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        if self.path is not None:
            text = sql
            for n in range(len(args), 0, -1):
                text = text.replace(f"${n}", f"?{n}")
            path = self.path
            return await anyio.to_thread.run_sync(_sqlite, path, text, args)
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            return [tuple(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    async def events(self, asset: str) -> set[int]:
        return {
            r[0]
            for r in await self.rows("SELECT id FROM asset_events WHERE asset_name = $1", asset)
        }

    async def verdict(self, task: str, asset: str) -> Verdict:
        in_success = await self.rows(
            "SELECT e.event_id FROM task_run_events e JOIN task_runs r ON r.id = e.run_id "
            "WHERE r.task = $1 AND r.state = 'success'",
            task,
        )
        in_any = await self.rows("SELECT event_id FROM task_run_events WHERE task = $1", task)
        states = dict(
            await self.rows(
                "SELECT state, count(*) FROM task_runs WHERE task = $1 GROUP BY state", task
            )
        )
        outlets = await self.rows(
            "SELECT outlet_event_ids FROM task_runs WHERE task = $1 AND state = 'success'", task
        )
        import json

        (retried,) = await self.rows(
            "SELECT count(*) FROM task_runs WHERE task = $1 AND state = 'success' "
            "AND try_number > 1",
            task,
        )
        return Verdict(
            task=task,
            expected=await self.events(asset),
            in_success=[r[0] for r in in_success],
            in_any_run=[r[0] for r in in_any],
            failed_runs=int(states.get("failed", 0)),
            success_runs=int(states.get("success", 0)),
            retried_runs=int(retried[0]),
            outlets=[i for (text,) in outlets for i in json.loads(text)],
        )

    async def done(self, task: str, asset: str) -> bool:
        """Every event of ``asset`` is in a finished run of ``task`` and none is open."""
        (row,) = await self.rows(
            "SELECT (SELECT count(*) FROM asset_events WHERE asset_name = $1), "
            "(SELECT count(*) FROM task_run_events e JOIN task_runs r ON r.id = e.run_id "
            "WHERE r.task = $2 AND r.state IN ('success', 'failed')), "
            "(SELECT count(*) FROM task_runs WHERE task = $2 AND state IN ('queued', 'running'))",
            asset,
            task,
        )
        return bool(row[0] > 0 and row[0] == row[1] and row[2] == 0)


class TaskChaos:
    """Workers on one database, killed ``kills`` times while ``events`` are committed."""

    def __init__(
        self,
        work: Path,
        url: str,
        *,
        workers: int,
        events: int,
        kills: int,
        seed: int,
        isolation: str = "none",
    ) -> None:
        self.work, self.url, self.isolation = work, url, isolation
        self.workers, self.events, self.kills_wanted = workers, events, kills
        self.rng = random.Random(seed)
        self.defs = work / "defs"
        self.defs.mkdir(parents=True, exist_ok=True)
        (self.defs / "chaos_tasks.py").write_text(DEFINITIONS)
        self.log_path = work / "workers.log"
        self.kills = 0
        self.committed = 0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            {
                "WATCHKEEPER__DATABASE__URL": self.url,
                "WATCHKEEPER__WORKER__POLL_INTERVAL": "0.02",
                "WATCHKEEPER__WORKER__HEARTBEAT_INTERVAL": "0.3",
                "WATCHKEEPER__WORKER__LEASE_TTL": "1.5",
                "WATCHKEEPER__WORKER__CONCURRENCY": "4",
                "WATCHKEEPER__WORKER__ISOLATION": self.isolation,
                "WATCHKEEPER__LOGGING__FORMAT": "json",
                "WATCHKEEPER__LOGGING__LEVEL": "warning",
            }
        )
        return env

    async def start(self) -> Process:
        log = await anyio.to_thread.run_sync(lambda: self.log_path.open("ab"))
        try:
            return await anyio.open_process(
                [*COMMAND, "worker", "--watchers-path", str(self.defs)],
                cwd=self.work,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    async def produce(self, backend: BaseStateBackend) -> None:
        """Commit the events in bursts of concurrent commits (group commit), with short gaps."""
        await backend.events.aregister_assets([SOURCE])
        events = backend.events
        while self.committed < self.events:
            burst = min(self.rng.randint(20, 200), self.events - self.committed)
            async with anyio.create_task_group() as tg:
                for i in range(burst):
                    commit = EventCommit("chaos", (SOURCE.name,), f'{{"n": {self.committed + i}}}')
                    tg.start_soon(events.acommit, commit)
            self.committed += burst
            await anyio.sleep(self.rng.uniform(0.05, 0.25))  # spread over the kills

    async def run(self, backend: BaseStateBackend, raw: Raw, *, deadline: float = 240) -> None:
        """Start the workers, produce while killing, then let them finish everything."""
        procs = [await self.start() for _ in range(self.workers)]
        try:
            with anyio.fail_after(deadline):
                await self._wait_declared(raw)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.produce, backend)
                    while self.kills < self.kills_wanted:
                        await anyio.sleep(self.rng.uniform(0.3, 1.2))
                        index = await self._target(procs, raw)
                        procs[index].send_signal(signal.SIGKILL)
                        await procs[index].wait()
                        self.kills += 1
                        procs[index] = await self.start()
                while not (
                    self.committed >= self.events
                    and await raw.done("consume", "chaos_src")
                    and await raw.done("chained", "chaos_mid")
                ):
                    for proc in procs:
                        if proc.returncode is not None:
                            raise RuntimeError(f"a worker exited:\n{self.log_tail()}")
                    await anyio.sleep(0.2)
        except TimeoutError:
            raise RuntimeError(f"the chaos run did not finish:\n{self.log_tail()}") from None
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(20, shield=True):
                for proc in procs:
                    await proc.wait()
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()

    async def _target(self, procs: list[Process], raw: Raw) -> int:
        """The worker to kill: any, for odd kills; for even ones, one that holds the lease of
        a running run, waited for up to 5 s (a restarted worker spends a second starting, so
        random kills alone may all miss the runs)."""
        if self.kills % 2 == 0:
            with anyio.move_on_after(5):
                while True:
                    with contextlib.suppress(Exception):  # a read that fails: look again
                        owners = await raw.rows(
                            "SELECT DISTINCT lease_owner FROM task_runs WHERE state = 'running'"
                        )
                        pids = {int(o.split(":")[1]) for (o,) in owners if o and o.count(":") == 2}
                        busy = [i for i, proc in enumerate(procs) if proc.pid in pids]
                        if busy:
                            return self.rng.choice(busy)
                    await anyio.sleep(0.2)  # each look is a new connection: not too many
        return self.rng.randrange(len(procs))

    async def _wait_declared(self, raw: Raw) -> None:
        while True:
            with contextlib.suppress(Exception):  # the schema may not exist yet
                if len(await raw.rows("SELECT name FROM tasks")) == 2:
                    return
            await anyio.sleep(0.1)
