"""``watchkeeper watchers``: list the watchers, pause, resume and retry them.

The controls are rows in the store (see :mod:`..daemon._controls`): the command writes the
row and returns; the daemon that runs the watcher acts on it within one heartbeat, and a
paused watcher stays paused across daemon restarts until it is resumed. The HTTP API writes
the same rows.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ._common import (
    CommandError,
    cli_writer,
    console,
    emit,
    emit_listing,
    json_flag,
    store_handler,
)

if TYPE_CHECKING:
    from watchkeeper.store import BaseStateBackend

    from ..daemon import WatcherRow
    from ..settings import Settings
    from ._common import Subparsers

__all__ = ["register"]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


async def _list(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    from ..daemon import watcher_rows
    from ._table import PlainTable

    rows = await watcher_rows(backend)
    now = datetime.now(UTC)
    empty = "no watchers: no daemon has reported one, and none is paused"
    if emit_listing(rows, args.json, lambda row: row.to_json(now), empty):
        return 0
    table = PlainTable(
        "asset", "watcher", "state", "daemon", "last event", "events", "failures", "paused"
    )
    for row in rows:
        table.add_row(
            ", ".join(row.assets) or "-",
            row.watcher,
            row.state,
            row.daemon or "-",
            _age(row.last_event_age(now)),
            str(row.events),
            str(row.failures),
            "yes" if row.paused else "no",
        )
    console().print(table)
    return 0


async def _require_known(backend: BaseStateBackend, name: str) -> WatcherRow:
    """The row of watcher ``name``; an unknown name fails, naming the closest known one."""
    from ..daemon import unknown_watcher, watcher_rows

    rows = {row.watcher: row for row in await watcher_rows(backend)}
    if name not in rows:
        raise CommandError(unknown_watcher(name, rows))
    return rows[name]


async def _set_paused(backend: BaseStateBackend, name: str, paused: bool, done: str) -> int:

    store = backend.controls
    await _require_known(backend, name)
    await store.aset_watcher_paused(name, paused, by=str(cli_writer()))
    emit(f"watcher {name!r} {done}")
    return 0


async def _pause(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    return await _set_paused(
        backend, args.name, True, "paused (its daemon stops it within one heartbeat)"
    )


async def _resume(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    return await _set_paused(
        backend, args.name, False, "resumed (a daemon starts it within one heartbeat)"
    )


async def _retry(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:

    store = backend.controls
    row = await _require_known(backend, args.name)
    await store.arequest_watcher_retry(args.name, by=str(cli_writer()))
    if row.state != "failed":
        emit(f"watcher {args.name!r} is {row.state}, not failed: the retry applies if it fails")
    else:
        emit(f"watcher {args.name!r} retried (its daemon restarts it within one heartbeat)")
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``watchers`` and its actions to the ``watchkeeper`` parser."""
    group = subparsers.add_parser(
        "watchers", help="list watchers; pause, resume or retry one (works without the API)"
    )
    actions = group.add_subparsers(dest="watchers_command", metavar="ACTION", required=True)
    list_ = actions.add_parser(
        "list", help="asset, watcher, state, daemon, last event age, events, failures"
    )
    json_flag(list_, "one watcher per line")
    list_.set_defaults(handler=store_handler(_list))
    for name, fn, text in (
        ("pause", _pause, "stop a watcher and keep it stopped (across restarts) until resumed"),
        ("resume", _resume, "let a paused watcher run again"),
        ("retry", _retry, "restart a watcher that gave up ('failed')"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("name", metavar="NAME", help="the watcher's name (AssetWatcher name)")
        action.set_defaults(handler=store_handler(fn))
