"""Subcommands of the runtime: ``triggerer`` (the daemon), ``status`` and ``demo``.

``watchkeeper triggerer`` runs :func:`~watchkeeper.triggerer.run_daemon` in the
foreground until SIGTERM or SIGINT, on the loop ``[triggerer] event_loop`` names (uvloop when
it is installed, by default). ``watchkeeper status``
reads what a daemon saved (its trigger statuses and the watched assets' state) from the same
database, so it works while the daemon runs. ``watchkeeper demo`` runs
:mod:`watchkeeper.triggerer.demo`.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from watchkeeper.store.errors import MissingCapabilityError

from .._core import DEFAULT_RELOAD_INTERVAL
from ._common import (
    CommandError,
    UsageError,
    describe_validation_error,
    emit_json,
    open_backend,
    redacted,
    run_async,
)

__all__ = ["register", "status_report", "status_rows"]

if TYPE_CHECKING:
    from rich.table import Table
    from watchkeeper.store import BaseStateBackend
    from watchkeeper.store.protocols import TriggerStatus

    from ..settings import Settings

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

T = TypeVar("T")


def _positive(kind: Callable[[str], T]) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:  # type: ignore[operator]
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return value

    return parse


# -- watchkeeper triggerer ---------------------------------------------------------------------


_TRIGGERER_OPTIONS = ("watchers_path", "capacity", "reload_interval")
"""The ``watchkeeper triggerer`` options that override ``[triggerer]`` keys of the same name."""


def with_triggerer_options(settings: Settings, args: argparse.Namespace) -> Settings:
    """``settings`` with the ``[triggerer]`` keys given as options of ``triggerer`` replaced
    (validated like the file's: ``--reload-interval`` must exceed 0, and so on)."""
    from pydantic import ValidationError

    from ..settings import TriggererSettings

    updates = {
        name: getattr(args, name)
        for name in _TRIGGERER_OPTIONS
        if getattr(args, name, None) is not None
    }
    if not updates:
        return settings
    try:
        triggerer = TriggererSettings.model_validate(settings.triggerer.model_dump() | updates)
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc)) from None
    return settings.model_copy(update={"triggerer": triggerer})


def _triggerer(args: argparse.Namespace, settings: Settings) -> int:
    settings = with_triggerer_options(settings, args)
    path = Path(settings.triggerer.watchers_path)
    if not path.is_dir():
        raise UsageError(
            f"watchers path {str(path)!r} is not a directory "
            "(use --watchers-path or [triggerer] watchers_path)"
        )
    open_backend(settings)  # a configuration mistake is a usage error before anything starts
    from ..daemon import run_daemon

    run_async(functools.partial(run_daemon, settings), event_loop=settings.triggerer.event_loop)
    return 0


# -- watchkeeper status ------------------------------------------------------------------------
#
# A status row is what a daemon last saved about a trigger; it is true only while that daemon
# lives. Each daemon refreshes its own row every heartbeat: once that is older than the
# daemon's lease time to live (its leases have lapsed too), the daemon is shown as "stale" and
# its watchers as "unknown". A watcher whose daemon left no row is "stopped" if that is what
# it saved (a clean exit removes the daemon's row), else "unknown".


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _printable(text: str) -> str:
    """``text`` with control characters and lone surrogates escaped, for a terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


async def status_report(backend: BaseStateBackend) -> dict[str, Any]:
    """What ``watchkeeper status --json`` prints: the daemons, the watchers, the refusals."""

    from ..daemon import daemon_report

    daemons = await daemon_report(backend)
    watchers: list[dict[str, Any]] = []
    for status in await backend.status.alist_trigger_status():
        state = daemons.watcher_state(status.state, status.owner)
        watchers.append(_status_json(status, state, await _asset_states(backend, status)))
    return {"daemons": daemons.rows, "watchers": watchers}


async def status_rows(backend: BaseStateBackend) -> list[dict[str, Any]]:
    """Each saved trigger status with the state of the assets it watches, as JSON data."""
    rows: list[dict[str, Any]] = (await status_report(backend))["watchers"]
    return rows


async def _asset_states(backend: BaseStateBackend, status: TriggerStatus) -> list[dict[str, Any]]:
    from watchkeeper.store import AssetNotFoundError, AssetScope

    assets = []
    for name in status.assets:
        try:
            entries = await backend.alist(AssetScope(name=name))
        except AssetNotFoundError:  # deactivated since the status was saved
            assets.append({"name": name, "active": False, "state": {}})
            continue
        state = {e.key: e.value for e in sorted(entries, key=lambda e: e.key)}
        assets.append({"name": name, "active": True, "state": state})
    return assets


def _status_json(status: TriggerStatus, state: str, assets: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "trigger_id": status.trigger_id,
        "watchers": list(status.watchers),
        "classpath": status.classpath,
        "state": state,
        "reported_state": status.state,
        "assets": assets,
        # Counted by the daemon that runs the trigger, since it started it: not a total.
        "events_since_start": status.events,
        "last_event_at": _iso(status.last_event_at),
        "failures": status.failures,
        "last_error": status.last_error,
        "owner": status.owner,
        "updated_at": _iso(status.updated_at),
    }


_STATE_STYLE = {
    "running": "green",
    "backing_off": "yellow",
    "failed": "bold red",
    "stopped": "dim",
    "stale": "bold red",
    "unknown": "bold yellow",
}


def _short(value: object, limit: int = 40) -> str:
    text = _printable(str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _seconds(value: object) -> str:
    return f"{value:g} s" if isinstance(value, int | float) else "-"


def _daemon_table(daemons: list[dict[str, Any]]) -> Table:
    from rich.text import Text

    from ._table import PlainTable

    table = PlainTable(title="watchkeeper daemons", title_justify="left", pad_edge=False)
    table.add_column("daemon", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("last heartbeat", justify="right")
    table.add_column("heartbeat every", justify="right")
    table.add_column("lease ttl", justify="right")
    table.add_column("started", overflow="fold")
    table.add_column("refused", justify="right")
    for row in daemons:
        table.add_row(
            Text(_printable(row["owner"])),
            Text(row["state"], style=_STATE_STYLE.get(row["state"], "")),
            Text(f"{row['heartbeat_age_seconds']:.1f} s ago"),
            Text(_seconds(row["settings"].get("heartbeat_interval"))),
            Text(_seconds(row["lease_ttl_seconds"])),
            Text((row["started_at"] or "-")[:19].replace("T", " ")),
            Text(str(len(row["refused"]))),
        )
    return table


def _refused_table(daemons: list[dict[str, Any]]) -> Table | None:
    from rich.text import Text

    from ._table import PlainTable

    seen: dict[tuple[str, str | None, str], None] = {}
    for row in daemons:
        for refused in row["refused"]:
            seen.setdefault((refused["file"], refused["watcher"], refused["reason"]), None)
    if not seen:
        return None
    table = PlainTable(title="refused definitions", title_justify="left", pad_edge=False)
    table.add_column("file", overflow="fold")
    table.add_column("watcher", overflow="fold")
    table.add_column("reason", overflow="fold")
    for file, watcher, reason in seen:
        table.add_row(
            Text(_printable(file)),
            Text(_printable(watcher) if watcher is not None else "(whole file)"),
            Text(_short(reason, 200)),
        )
    return table


def _status_table(rows: list[dict[str, Any]]) -> Table:
    from rich.text import Text

    from ._table import PlainTable

    table = PlainTable(title="watchkeeper watchers", title_justify="left", pad_edge=False)
    table.add_column("watcher", overflow="fold", min_width=16)
    table.add_column("state", no_wrap=True)
    table.add_column("assets: state", overflow="fold")
    table.add_column("events since start", justify="right")
    table.add_column("last event", overflow="fold")
    table.add_column("fails", justify="right")
    errors = any(row["last_error"] for row in rows)
    if errors:  # only when there is one: an 80-column terminal has no room to spare
        table.add_column("last error", overflow="fold")
    for row in rows:
        # Text cells: names and errors are shown as written, never parsed as rich markup.
        watcher = Text(_printable(", ".join(row["watchers"])) or "-")
        watcher.append("\n" + row["trigger_id"], style="dim")
        assets = Text()
        for i, asset in enumerate(row["assets"]):
            items = ", ".join(f"{_printable(k)}={_short(v, 24)}" for k, v in asset["state"].items())
            assets.append(("\n" if i else "") + _printable(asset["name"]), style="bold")
            assets.append(" (inactive)" if not asset["active"] else "", style="dim")
            assets.append(f": {items}" if items else "")
        last = row["last_event_at"]
        state = Text(row["state"], style=_STATE_STYLE.get(row["state"], ""))
        if row["state"] != row["reported_state"]:
            state.append(f"\n(last said {row['reported_state']})", style="dim")
        cells = [
            watcher,
            state,
            assets,
            Text(str(row["events_since_start"])),
            Text(last[:19].replace("T", " ") if last else "-"),
            Text(str(row["failures"])),
        ]
        if errors:
            cells.append(Text(_short(row["last_error"] or "", 120)))
        table.add_row(*cells)
    return table


def _status(args: argparse.Namespace, settings: Settings) -> int:
    backend = open_backend(settings)
    missing = backend.missing_database()
    if missing is not None:
        # Opening it would create an empty database: say instead that nothing ran there.
        raise CommandError(f"no database at {missing} (has a daemon run with this [database] url?)")

    async def read() -> dict[str, Any]:
        async with backend:
            return await status_report(backend)

    try:
        # A one-shot read: the standard loop, not the daemon's choice (uvloop loads slower).
        report = redacted(
            run_async(read, event_loop="asyncio")
        )  # errors and state may quote a URL with a password
    except MissingCapabilityError as exc:  # a custom backend without trigger status
        raise CommandError(str(exc)) from exc
    if args.json:
        emit_json(report)
        return 0
    from rich.console import Console  # the tables only

    console = Console()
    daemons, rows = report["daemons"], report["watchers"]
    if not rows and not daemons:
        console.print("no watcher status saved yet (is `watchkeeper triggerer` running?)")
        return 0
    if daemons:
        console.print(_daemon_table(daemons))
    if rows:
        console.print(_status_table(rows))
    refused = _refused_table(daemons)
    if refused is not None:
        console.print(refused)
    return 0


# -- registration ------------------------------------------------------------------------------


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from ..demo import DemoError, run_demo  # rich's live display and the demo load on demand

    try:
        return run_demo(args.items, keep=args.keep)
    except DemoError as exc:
        raise CommandError(str(exc)) from exc


def register(subparsers: Subparsers) -> None:
    """Add ``triggerer``, ``status`` and ``demo`` to the ``watchkeeper`` parser."""
    _add_triggerer(subparsers)
    _add_status(subparsers)
    _add_demo(subparsers)


def _add_triggerer(subparsers: Subparsers) -> None:
    triggerer = subparsers.add_parser(
        "triggerer",
        help="run the daemon in the foreground (SIGTERM/SIGINT stop it cleanly)",
        description="Run the watchers defined under the watchers path until SIGTERM or SIGINT.",
    )
    triggerer.add_argument(
        "--watchers-path",
        metavar="DIR",
        type=Path,
        help="directory of watcher definition files (overrides [triggerer] watchers_path)",
    )
    triggerer.add_argument(
        "--capacity",
        metavar="N",
        type=_positive(int),
        help="most triggers run at once (overrides [triggerer] capacity)",
    )
    triggerer.add_argument(
        "--reload-interval",
        metavar="SECONDS",
        type=_positive(float),
        help=(
            "seconds between scans of the watchers path (overrides [triggerer] "
            f"reload_interval, default {DEFAULT_RELOAD_INTERVAL:g})"
        ),
    )
    triggerer.set_defaults(handler=_triggerer, long_running=True)


def _add_status(subparsers: Subparsers) -> None:
    status = subparsers.add_parser(
        "status",
        help="show each daemon and watcher: liveness, state, watermark, failures, refusals",
        description=(
            "Show what the daemons saved about themselves and their watchers (works while they "
            "run): a daemon whose heartbeat is older than its lease time is 'stale' and its "
            "watchers 'unknown'; refused watcher files are listed with the reason."
        ),
    )
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.set_defaults(handler=_status)


def _add_demo(subparsers: Subparsers) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="run the example watchers, kill -9 the daemon mid-stream, check exactly-once",
        description=(
            "Run the example watchers on a throwaway SQLite database in a temporary directory "
            "(the configured database is not used), SIGKILL the daemon mid-stream, restart it, "
            "and check that every item arrived exactly once. Exits 0 when the check passes."
        ),
    )
    demo.add_argument(
        "--items",
        metavar="N",
        type=_positive(int),
        default=200,
        help="items the fake source produces per table (default 200)",
    )
    demo.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (database, source, logs) and print its path",
    )
    demo.set_defaults(handler=_demo, long_running=True)
