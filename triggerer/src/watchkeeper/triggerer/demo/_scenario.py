"""The demo's scenario: the child daemon and worker, their kills, the live view, the checks.

:class:`Demo` runs in a directory of its own with an embedded SQLite database:

1. it creates the fake source (:mod:`._source`) and starts its producer;
2. it copies the demo's watcher files (``_watchers/``) into ``watchers/`` of its directory,
   starts ``watchkeeper triggerer`` on them as a child process and shows the committed events
   and watermarks live;
3. it kills the daemon with SIGKILL once a third of the items are committed, restarts it, and
   waits until every item is committed; then stops it with SIGTERM;
4. meanwhile it runs ``watchkeeper worker`` on the same files, kills it with SIGKILL while a
   run of the task ``tally_orders`` executes, and restarts it (see :mod:`._tasks`);
5. it reads every committed event back and checks, per table, that items 1..N each arrived
   exactly once and that the watermark is N, and that every orders event was in exactly one
   successful run of the task.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import anyio.to_thread
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from watchkeeper.store import AssetNotFoundError, AssetScope, SqliteStateBackend

from ..errors import TriggererError
from . import _source as source
from . import _tasks as tasks

__all__ = ["FAILED", "PASSED", "Demo", "DemoError", "copy_demo_watchers"]

RATE = 50.0
"""Items the producer appends per table per second."""
KILL_AT = 1 / 3
"""Fraction of the items committed when the daemon is killed."""
DEADLINE = 90.0
"""Seconds after which a phase that has not finished fails the demo."""
STOP_GRACE = 5.0
PASSED = "PASSED"
FAILED = "FAILED"


class DemoError(TriggererError):
    """Raised when the demo cannot go on: a child process died, or a phase timed out."""


@dataclass(slots=True)
class _Progress:
    """What the demo has seen committed for one asset."""

    committed: int = 0
    last: int = 0
    watermark: Any = None


def copy_demo_watchers(target: Path) -> list[Path]:
    """Copy the demo's watcher files (package data of this package) into ``target``.

    They are read through :mod:`importlib.resources`, so this works wherever the package is
    installed; returns the files written.
    """
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for resource in (files("watchkeeper.triggerer.demo") / "_watchers").iterdir():
        if resource.name.endswith(".py"):
            path = target / resource.name
            path.write_text(resource.read_text(encoding="utf-8"), encoding="utf-8")
            written.append(path)
    if not written:  # a broken installation: say what is missing instead of running nothing
        raise DemoError("no demo watcher files in watchkeeper.triggerer.demo (_watchers/)")
    return written


def _command() -> list[str]:
    script = Path(sys.executable).with_name("watchkeeper")
    if script.is_file():
        return [str(script)]
    # not installed as a script next to this interpreter: same code, same interpreter
    return [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()"]


def _daemon_command(watchers: Path) -> list[str]:
    return [*_command(), "triggerer", "--watchers-path", str(watchers), "--reload-interval", "0.5"]


class Demo:
    """One run of the demo in ``workdir``: ``items`` per table, progress printed on ``console``,
    the child processes' logs appended to ``log``."""

    def __init__(self, workdir: Path, items: int, console: Console, log: IO[bytes]) -> None:
        self.workdir = workdir
        self.watchers = workdir / "watchers"
        self.items = items
        self.console = console
        self.log = log
        self.tables: tuple[str, ...] = source.TABLES
        self.source_path = workdir / "source.db"
        self.db_path = workdir / "watchkeeper.db"
        self.progress = {t: _Progress() for t in self.tables}
        self.recent: collections.deque[str] = collections.deque(maxlen=6)
        self.produced = 0
        self.phase = "starting"
        self.process: anyio.abc.Process | None = None
        self.seen_id = 0
        self.t0 = time.monotonic()
        worker = [*_command(), "worker", "--watchers-path", str(self.watchers)]
        self.worker = tasks.DemoWorker(worker, workdir, self._env(), log)
        self._polled: anyio.Event  # created in main(), inside the event loop
        self._declared: anyio.Event  # set once the worker has declared its task

    def _say(self, message: str) -> None:
        elapsed = time.monotonic() - self.t0
        self.console.print(f"[dim]{elapsed:5.1f} s[/]  {message}")

    # -- the child daemon ------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            WATCHKEEPER__DATABASE__URL=f"sqlite:///{self.db_path}",
            WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL="0.5",
            WATCHKEEPER__TRIGGERER__STOP_GRACE=str(STOP_GRACE),
            WATCHKEEPER__TRIGGERER__GC_INTERVAL="0",
            WATCHKEEPER__WORKER__POLL_INTERVAL="0.05",
            WATCHKEEPER__WORKER__HEARTBEAT_INTERVAL="0.5",
            WATCHKEEPER__LOGGING__FORMAT="json",
            WATCHKEEPER_DEMO_SOURCE=str(self.source_path),
        )
        return env

    async def _start_daemon(self, number: int) -> anyio.abc.Process:
        process = await anyio.open_process(
            _daemon_command(self.watchers),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            cwd=self.workdir,  # no stray ./watchkeeper.toml from where the demo was started
            env=self._env(),
        )
        self.process = process
        self.phase = f"daemon #{number} running (pid {process.pid})"
        self._say(f"started daemon #{number}: pid {process.pid}")
        return process

    async def _wait_until_started(
        self, backend: SqliteStateBackend, process: anyio.abc.Process
    ) -> None:
        """Wait until ``process`` has written its first heartbeat row (its owner names its pid)."""
        marker = f":{process.pid}:"
        with anyio.fail_after(DEADLINE):
            while not any(marker in d.owner for d in await backend.status.alist_daemon_status()):
                if process.returncode is not None:
                    raise DemoError(
                        f"the daemon exited with status {process.returncode} while starting"
                    )
                await anyio.sleep(0.05)

    async def _wait_for(self, what: str, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` (re-checked after each poll of the database) or fail."""
        with anyio.move_on_after(DEADLINE) as scope:
            while not done():
                process = self.process
                if process is not None and process.returncode is not None:
                    raise DemoError(
                        f"the daemon exited with status {process.returncode} while the demo "
                        f"waited for {what}"
                    )
                await self._polled.wait()
        if scope.cancelled_caught:
            raise DemoError(f"gave up after {DEADLINE:g} s waiting for {what}")

    # -- watching the database -------------------------------------------------------------------

    async def _poll(self, backend: SqliteStateBackend) -> None:
        events = await backend.events.alist_events(since_id=self.seen_id, limit=2000)
        for event in events:
            self.seen_id = event.id
            progress = self.progress.get(event.asset)
            if progress is None:
                continue
            progress.committed += 1
            progress.last = int(event.payload["n"])
            self.recent.append(f"#{event.id} {event.asset}: {event.payload['item']}")
        for table, progress in self.progress.items():
            try:
                progress.watermark = await backend.aget(AssetScope(name=table), "watermark")
            except AssetNotFoundError:  # the daemon has not registered it yet
                progress.watermark = None
        self._polled.set()  # wake the waiters, then arm a fresh event for the next poll
        self._polled = anyio.Event()

    async def _monitor(self, backend: SqliteStateBackend, live: Live) -> None:
        while True:
            await self._poll(backend)
            live.update(self._render(), refresh=True)
            await anyio.sleep(0.1)

    def _render(self) -> Group:
        table = Table(title=Text(f"watchkeeper demo: {self.phase}"), title_justify="left")
        for column in ("asset", "produced", "committed events", "last item", "watermark"):
            table.add_column(column, justify="left" if column == "asset" else "right")
        for name, progress in self.progress.items():
            table.add_row(
                name,
                str(self.produced),
                str(progress.committed),
                str(progress.last or "-"),
                str(progress.watermark if progress.watermark is not None else "-"),
            )
        recent = Text("\n".join(self.recent) or "(no event yet)", style="dim")
        return Group(table, recent)

    # -- the scenario ----------------------------------------------------------------------------

    async def _produce(self) -> None:
        await self._declared.wait()  # the task's cursor starts before the first orders event
        for n in range(1, self.items + 1):
            await anyio.to_thread.run_sync(source.append, self.source_path, n, self.tables)
            self.produced = n
            await anyio.sleep(1 / RATE)

    def _worker_alive(self) -> None:
        process = self.worker.process
        if process is not None and process.returncode is not None:
            raise DemoError(f"the worker exited with status {process.returncode}")

    async def _start_worker(self) -> anyio.abc.Process:
        process = await self.worker.start()
        self._say(f"started worker #{self.worker.number}: pid {process.pid}")
        return process

    async def _kill_worker_mid_run(self, backend: SqliteStateBackend) -> None:
        with anyio.fail_after(DEADLINE):
            run_id = await tasks.wait_running(backend, self._worker_alive)
        process = self.worker.process
        assert process is not None
        process.kill()  # SIGKILL inside the task function
        await process.wait()
        self._say(
            f"[bold red]SIGKILL[/] worker #{self.worker.number} (pid {process.pid}) "
            f"while run {run_id} of {tasks.TASK} was executing"
        )
        await self._start_worker()

    async def _scenario(self, backend: SqliteStateBackend) -> int | None:
        kill_at = max(1, int(self.items * KILL_AT))
        await self._start_worker()
        with anyio.fail_after(DEADLINE):
            await tasks.wait_declared(backend, self._worker_alive)
        self._declared.set()
        first = await self._start_daemon(1)
        await self._wait_for(
            f"{kill_at} committed items", lambda: self.progress[self.tables[0]].committed >= kill_at
        )
        committed = {t: p.committed for t, p in self.progress.items()}
        first.kill()  # SIGKILL: no cleanup, no flush, mid-stream
        await first.wait()
        self._say(
            f"[bold red]SIGKILL[/] daemon #1 (pid {first.pid}) with "
            + ", ".join(f"{t} {n}/{self.items}" for t, n in committed.items())
            + f" committed and the producer at {self.produced}"
        )
        second = await self._start_daemon(2)
        await self._kill_worker_mid_run(backend)
        await self._wait_for(
            "every item to be committed",
            lambda: all(p.last >= self.items for p in self.progress.values()),
        )
        # Daemon #2 may find every item committed already (when #1 was killed late); a
        # SIGTERM before it has started would find no handler yet and end it with -15.
        await self._wait_until_started(backend, second)
        self.phase = "stopping daemon #2 with SIGTERM"
        second.send_signal(signal.SIGTERM)
        with anyio.move_on_after(STOP_GRACE + 10):
            await second.wait()
        code = second.returncode
        self._say(f"SIGTERM daemon #2 (pid {second.pid}): exit status {code}")
        self.phase = "waiting for the worker to consume every orders event"
        with anyio.fail_after(DEADLINE):
            while not await tasks.all_consumed(backend):
                self._worker_alive()
                await anyio.sleep(0.1)
        worker = self.worker.process
        assert worker is not None
        worker.send_signal(signal.SIGTERM)
        with anyio.move_on_after(STOP_GRACE + 10):
            await worker.wait()
        self._say(
            f"SIGTERM worker #{self.worker.number} (pid {worker.pid}): exit status {worker.returncode}"
        )
        self.phase = "done"
        return code if worker.returncode == 0 else worker.returncode

    async def _check(self, backend: SqliteStateBackend) -> bool:
        """Every item 1..N exactly once per asset, in order, and the watermark at N."""
        expected = list(range(1, self.items + 1))
        ok = True
        for table in self.tables:
            events = await backend.events.alist_events(asset=table)
            got = [int(e.payload["n"]) for e in events]
            counts = collections.Counter(got)
            duplicates = sorted(n for n, c in counts.items() if c > 1)
            missing = sorted(set(expected) - set(got))
            watermark = await backend.aget(AssetScope(name=table), "watermark")
            if got == expected and watermark == self.items:
                self.console.print(
                    f"  [green]ok[/]      {table}: items 1..{self.items} each committed once, "
                    f"in order; watermark {watermark}"
                )
                continue
            ok = False
            self.console.print(
                f"  [bold red]FAILED[/]  {table}: {len(got)} events for {self.items} items; "
                f"missing {missing[:10]}; committed twice {duplicates[:10]}; "
                f"watermark {watermark}"
            )
        return ok

    async def main(self) -> int:
        """Run the scenario and the checks; print the verdict and return the exit status."""
        self._polled = anyio.Event()
        self._declared = anyio.Event()
        await self._prepare()
        try:
            async with SqliteStateBackend(self.db_path) as backend:
                code = await self._run_live(backend)
                ok = await self._run_checks(backend)
        finally:
            await self._kill_leftovers()
        return self._verdict(ok, code)

    async def _prepare(self) -> None:
        """The watcher files and the empty fake source in the demo's directory."""
        await anyio.to_thread.run_sync(copy_demo_watchers, self.watchers)
        await anyio.to_thread.run_sync(source.create, self.source_path, self.tables)
        self.console.print(
            f"demo directory {self.workdir}: SQLite state in watchkeeper.db, fake source in "
            f"source.db ({self.items} items per table: {', '.join(self.tables)})"
        )

    async def _run_live(self, backend: SqliteStateBackend) -> int | None:
        """The scenario beside the producer and the live view; the daemon's exit status."""
        code: int | None = None
        live = Live(self._render(), console=self.console, auto_refresh=False)
        with live:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._produce)
                tg.start_soon(self._monitor, backend, live)
                code = await self._scenario(backend)
                tg.cancel_scope.cancel()
            await self._poll(backend)
            live.update(self._render(), refresh=True)
        return code

    async def _run_checks(self, backend: SqliteStateBackend) -> bool:
        self.console.print()
        self.console.print("[bold]the checks[/]")
        ok = await self._check(backend)
        return await tasks.check_exactly_once(backend, self.console) and ok

    async def _kill_leftovers(self) -> None:
        """Kill a child the scenario left running (it failed midway)."""
        for process in (self.process, self.worker.process):
            if process is not None and process.returncode is None:
                process.kill()
                with anyio.move_on_after(5, shield=True):
                    await process.wait()

    def _verdict(self, ok: bool, code: int | None) -> int:
        total = self.items * len(self.tables)
        self.console.print()
        if ok and code == 0:
            self.console.print(
                f"[bold green]{PASSED}[/]: the daemon was killed with kill -9 mid-stream and "
                f"the task's worker mid-run; after their restarts nothing was lost and nothing "
                f"was done twice: all {total} items arrived exactly once, and every orders "
                "event was in exactly one successful task run."
            )
            return 0
        if ok:
            self.console.print(
                f"[bold red]{FAILED}[/]: every item arrived exactly once, but the daemon did "
                f"not stop cleanly when asked to (exit status {code})."
            )
        else:
            self.console.print(
                f"[bold red]{FAILED}[/]: the checks marked FAILED above found items lost or "
                "done twice after a kill -9."
            )
        return 1
