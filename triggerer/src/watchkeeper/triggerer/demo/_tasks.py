"""The task half of ``watchkeeper demo``: a worker process, its SIGKILL, and the check.

The demo's ``orders.py`` also defines the task ``tally_orders``, which runs on the ``orders``
events. :class:`DemoWorker` starts ``watchkeeper worker`` as a child process, kills it with
SIGKILL while a run is executing, and :func:`check_exactly_once` reads the runs back: every
orders event must be in exactly one successful run.
"""

from __future__ import annotations

import collections
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
from rich.console import Console
from watchkeeper.store import SqliteStateBackend

TASK = "tally_orders"
ASSET = "orders"

__all__ = ["ASSET", "TASK", "DemoWorker", "check_exactly_once"]


class DemoWorker:
    """``watchkeeper worker`` as a child process of the demo."""

    def __init__(
        self, command: list[str], workdir: Path, env: dict[str, str], log: IO[bytes]
    ) -> None:
        self.command, self.workdir, self.env, self.log = command, workdir, env, log
        self.process: anyio.abc.Process | None = None
        self.number = 0

    async def start(self) -> anyio.abc.Process:
        self.number += 1
        self.process = await anyio.open_process(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            cwd=self.workdir,
            env=self.env,
        )
        return self.process


async def wait_declared(backend: SqliteStateBackend, alive: Callable[[], None]) -> None:
    """Until the worker has declared its task (so no orders event comes before its cursor)."""
    while True:
        alive()
        if any(info.name == TASK for info in await backend.tasks.alist_tasks()):
            return
        await anyio.sleep(0.05)


async def wait_running(backend: SqliteStateBackend, alive: Callable[[], None]) -> int:
    """Until a run of the task is executing; its id."""
    while True:
        alive()
        running = await backend.tasks.alist_runs(task=TASK, state="running")
        if running:
            return running[0].id
        await anyio.sleep(0.02)


async def all_consumed(backend: SqliteStateBackend) -> bool:
    """Every orders event is in a finished run and no run is open."""
    (info,) = [i for i in await backend.tasks.alist_tasks() if i.name == TASK]
    if info.pending.get(ASSET):
        return False
    open_runs = await backend.tasks.alist_runs(task=TASK, state="queued")
    open_runs += await backend.tasks.alist_runs(task=TASK, state="running")
    return not open_runs


async def check_exactly_once(backend: SqliteStateBackend, console: Console) -> bool:
    """Every orders event in exactly one successful run, and one outlet event per run."""
    expected = [e.id for e in await backend.events.alist_events(asset=ASSET)]
    runs = await backend.tasks.alist_runs(task=TASK)
    succeeded = [r for r in runs if r.state == "success"]
    seen: list[int] = []
    for run in succeeded:
        seen.extend(e.id for e in (await backend.tasks.aget_run(run.id)).events)
    counts = collections.Counter(seen)
    twice = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(set(expected) - set(seen))
    outlets = await backend.events.alist_events(asset="order_totals")
    retried = [r.id for r in succeeded if r.try_number > 1]
    ok = (
        not twice and not missing and len(outlets) == len(succeeded) and len(runs) == len(succeeded)
    )
    if ok:
        again = f", {len(retried)} of them retried after the kill" if retried else ""
        console.print(
            f"  [green]ok[/]      {TASK}: each of the {len(expected)} orders events was in "
            f"exactly one successful run ({len(succeeded)} runs{again}, "
            f"{len(outlets)} order_totals events)"
        )
    else:
        console.print(
            f"  [bold red]FAILED[/]  {TASK}: {len(expected)} orders events, "
            f"{len(succeeded)} successful runs of {len(runs)}; never in a successful run: "
            f"{missing[:10]}; in two: {twice[:10]}; {len(outlets)} order_totals events"
        )
    return ok
