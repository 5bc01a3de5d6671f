"""``watchkeeper runs logs RUN_ID [--try N] [--follow] [--json]``: a run's logs, as its
tries wrote them (stdout, stderr and the log records of the task's code).

The text is printed as the task wrote it, with every character that could steer a terminal
(controls other than a newline or a tab, bidirectional overrides) escaped. With ``--follow``
the command reads the store again every :data:`FOLLOW_INTERVAL` seconds and ends once the
run is no longer queued or running and everything it wrote is printed (a worker stores a
try's last output before it records the try's outcome).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Final

from .._core import log_record
from ._common import CommandError, emit_json, int_at_least, json_flag, store_handler

__all__ = ["FOLLOW_INTERVAL", "register_logs"]

if TYPE_CHECKING:
    from watchkeeper.store import BaseStateBackend, LogChunk
    from watchkeeper.store.protocols import RunLogs

    from ..settings import Settings

FOLLOW_INTERVAL: Final = 0.5
"""Seconds between two reads of a followed run's logs."""

_PAGE: Final = 1000
_OPEN_STATES: Final = ("queued", "running")


def _logs(backend: BaseStateBackend) -> RunLogs:
    logs = backend.services.logs
    if logs is None:
        raise CommandError(f"{type(backend).__name__} does not keep run logs")
    return logs


def _shown(text: str) -> str:
    """``text`` with what could steer a terminal escaped; newlines and tabs kept."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in "\n\t" else repr(ch)[1:-1] for ch in text)


def _print(chunks: list[LogChunk], as_json: bool, last_try: int, headers: bool) -> int:
    """Print ``chunks``; with ``headers``, a line before each try's first chunk (``last_try``:
    the try printed last, 0 for none). The try printed last."""
    for chunk in chunks:
        if as_json:
            emit_json(log_record(chunk))
            continue
        if headers and chunk.try_number != last_try:
            sys.stdout.write(f"--- try {chunk.try_number} ---\n")
        sys.stdout.write(_shown(chunk.text))
        last_try = chunk.try_number
    sys.stdout.flush()
    return last_try


async def _runs_logs(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    import anyio

    queue, logs = backend.tasks, _logs(backend)
    run = await queue.aget_run(args.run_id)  # an unknown run: the store's error names it
    tries = run.try_number + (1 if run.state == "queued" else 0)
    if args.try_number is not None and args.try_number > max(tries, 1):
        raise CommandError(
            f"run {run.id} has no try {args.try_number} (tries so far: {run.try_number})"
        )
    after, last_try = 0, 0
    while True:
        done = run.state not in _OPEN_STATES  # read before the logs: none come after it
        headers = args.try_number is None and run.try_number > 1  # one try needs no header
        while page := await logs.alist(
            run.id, try_number=args.try_number, after_seq=after, limit=_PAGE
        ):
            last_try = _print(page, args.json, last_try, headers)
            after = page[-1].seq
        if not args.follow or done:
            break
        await anyio.sleep(FOLLOW_INTERVAL)
        run = await queue.aget_run(run.id)
    if not after and not args.json:
        sys.stderr.write(f"run {run.id} has no logs\n")
    return 0


def register_logs(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``logs`` to the ``runs`` actions."""
    logs = actions.add_parser("logs", help="a run's logs: what its tries printed and logged")
    logs.add_argument("run_id", type=int_at_least(1), metavar="RUN_ID")
    logs.add_argument(
        "--try", dest="try_number", type=int_at_least(1), metavar="N", help="only this try's"
    )
    logs.add_argument(
        "--follow", action="store_true", help="keep printing until the run is no longer running"
    )
    json_flag(logs, "one chunk per line")
    logs.set_defaults(handler=store_handler(_runs_logs))
