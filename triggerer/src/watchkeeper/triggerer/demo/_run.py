"""Running the demo: its temporary directory, its event loop, and its log on failure."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import anyio
from rich.console import Console
from rich.text import Text

from .._core import anyio_backend_options
from ._scenario import Demo

__all__ = ["run_demo"]


def run_demo(items: int = 200, *, keep: bool = False) -> int:
    """Run the demo in a fresh temporary directory, printing its progress and verdict.

    :param items: items the fake source produces per table.
    :param keep: keep the temporary directory (databases, source, logs) and print its path.
    :returns: 0 when the exactly-once checks pass, 1 otherwise. A failed demo keeps its directory
        and prints the end of the daemon's log.

    :raises DemoError: a child process died or a phase did not finish in time.
    """
    console = Console(highlight=False)
    workdir = Path(tempfile.mkdtemp(prefix="watchkeeper-demo-"))
    status = 1
    try:
        with (workdir / "daemon.log").open("ab") as log:
            demo = Demo(workdir, items, console, log)
            status = _run(demo)
        return status
    finally:
        if keep or status != 0:
            if status != 0:
                _show_log_tail(console, workdir / "daemon.log")
            console.print(f"kept {workdir} (daemon.log holds the daemon's JSON logs)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(demo: Demo) -> int:
    """``demo.main`` on the default event loop (uvloop when installed, as the CLI's); a lone
    error is raised as itself rather than inside the task groups' exception groups."""
    try:
        return anyio.run(
            demo.main, backend="asyncio", backend_options=anyio_backend_options("auto")
        )
    except BaseExceptionGroup as group:
        lone = _lone_error(group)
        if lone is None:
            raise
        raise lone from None


def _lone_error(group: BaseExceptionGroup[BaseException]) -> Exception | None:
    """The only exception inside (possibly nested) groups, or None when there are several."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner if isinstance(inner, Exception) else None


def _show_log_tail(console: Console, path: Path, lines: int = 15) -> None:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return
    if tail:
        console.print()
        console.print(f"last lines of {path.name}:", style="bold")
        console.print(Text("\n".join(tail), style="dim"))
