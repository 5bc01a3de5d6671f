"""Subcommands that work on the store directly: ``db``, ``state-store``, ``assets``, ``events``.

They need no running daemon: each opens the configured backend with ``async with`` inside
``anyio.run(..., backend="asyncio")``, does one thing, and closes it; SQLite and PostgreSQL let
them run beside a daemon that uses the same database. Values go in and come out as JSON.
Human output is a rich table; ``--json`` prints one JSON document per line for programs.
"""

from __future__ import annotations

import argparse
import signal
from typing import TYPE_CHECKING, Any

from watchkeeper.store import MAX_BIGINT, Asset, AssetEvent, AssetInfo

from .._core import event_record
from ._common import (
    CommandError,
    UsageError,
    compact_json,
    console,
    emit,
    emit_json,
    emit_listing,
    int_between,
    json_flag,
    printable,
    store_handler,
)
from ._state import register_state_store

if TYPE_CHECKING:
    import anyio
    import anyio.abc
    from watchkeeper.store import BaseStateBackend

    from ..settings import Settings
    from ._common import Subparsers

__all__ = ["register"]

FOLLOW_INTERVAL = 0.5
"""Seconds between polls of ``events --follow``."""


# -- db -------------------------------------------------------------------------------------------


async def _db_migrate(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    # Opening already migrates; every backend records what that applied.
    applied = [*backend.applied_migrations, *await backend.amigrate()]
    if applied:
        emit(f"applied migrations {', '.join(str(v) for v in applied)}")
    else:
        emit("database schema is up to date")
    return 0


# -- assets -------------------------------------------------------------------------------------


def _asset_record(info: AssetInfo) -> dict[str, Any]:
    return {
        "asset_id": info.asset_id,
        "name": info.name,
        "uri": info.uri,
        "active": info.active,
        "updated_at": info.updated_at.isoformat(),
    }


async def _assets_list(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:

    from ._table import PlainTable

    assets = await backend.events.alist_assets(active_only=not args.all)
    empty = "no assets registered" if args.all else "no active assets"
    if emit_listing(assets, args.json, _asset_record, empty):
        return 0
    table = PlainTable("name", "uri", "active", "updated_at", title="assets")
    for info in assets:
        table.add_row(
            info.name,
            info.uri or "",
            "yes" if info.active else "no",
            info.updated_at.isoformat(),
        )
    console().print(table)
    return 0


def _check_asset(args: argparse.Namespace) -> None:
    from watchkeeper.store.protocols import check_name

    if not args.name:
        raise UsageError("an asset name must not be empty")
    if getattr(args, "uri", None) == "":
        raise UsageError("--uri must not be empty")
    try:
        check_name(args.name, what="asset name")
        if getattr(args, "uri", None) is not None:
            check_name(args.uri, what="asset URI")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def _assets_register(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:

    await backend.events.aregister_assets([Asset(args.name, uri=args.uri)])
    emit(f"registered asset {args.name!r}" + (f" ({args.uri})" if args.uri else ""))
    return 0


async def _assets_deactivate(
    backend: BaseStateBackend, args: argparse.Namespace, _: Settings
) -> int:

    if await backend.events.adeactivate_asset(args.name):
        emit(f"deactivated asset {args.name!r}; its state is removed by the next clean")
        return 0
    known = {info.name for info in await backend.events.alist_assets()}
    if args.name not in known:
        raise CommandError(f"asset {args.name!r} is not registered")
    emit(f"asset {args.name!r} is already inactive")
    return 0


# -- events -------------------------------------------------------------------------------------


def _event_line(event: AssetEvent) -> str:
    from watchkeeper.store.protocols import redact_secrets

    dedup = f" dedup_key={event.dedup_key!r}" if event.dedup_key is not None else ""
    return redact_secrets(
        f"{event.id} {event.created_at.isoformat()} asset={event.asset!r} "
        f"watcher={event.watcher!r} payload={printable(compact_json(event.payload))}{dedup}"
    )


async def _cancel_on_signal(
    scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    """Cancel ``scope`` at the first SIGINT or SIGTERM (Ctrl-C ends ``--follow`` cleanly)."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
            return


async def _follow(backend: BaseStateBackend, args: argparse.Namespace, since: int) -> None:
    import anyio

    printed = 0
    while args.limit is None or printed < args.limit:
        remaining = None if args.limit is None else args.limit - printed
        batch = await backend.events.alist_events(asset=args.asset, since_id=since, limit=remaining)
        for event in batch:
            if args.json:
                emit_json(event_record(event))
            else:
                emit(_event_line(event))
            since = max(since, event.id)
        printed += len(batch)
        if not batch:
            await anyio.sleep(FOLLOW_INTERVAL)


async def _events(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    import anyio

    from ._table import PlainTable

    if args.asset is not None:
        known = {info.name for info in await backend.events.alist_assets()}
        if args.asset not in known:
            raise CommandError(f"asset {args.asset!r} is not registered")
    if args.follow:
        async with anyio.create_task_group() as tg:
            await tg.start(_cancel_on_signal, tg.cancel_scope)
            await _follow(backend, args, args.since)
            tg.cancel_scope.cancel()
        return 0
    events = await backend.events.alist_events(
        asset=args.asset, since_id=args.since, limit=args.limit
    )
    if emit_listing(events, args.json, event_record, "no events"):
        return 0
    table = PlainTable(
        "id", "asset", "watcher", "payload", "dedup_key", "created_at", title="events"
    )
    for event in events:
        record = event_record(event)  # passwords masked
        table.add_row(
            str(record["id"]),
            record["asset"],
            record["watcher"],
            compact_json(record["payload"]),
            record["dedup_key"] or "",
            record["created_at"],
        )
    console().print(table)
    return 0


# -- the parsers --------------------------------------------------------------------------------


def _add_db(subparsers: Subparsers) -> None:
    db = subparsers.add_parser("db", help="database schema")
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    migrate = actions.add_parser("migrate", help="create or upgrade the schema")
    migrate.set_defaults(handler=store_handler(_db_migrate))


def _add_assets(subparsers: Subparsers) -> None:
    group = subparsers.add_parser("assets", help="registered assets")
    actions = group.add_subparsers(dest="assets_command", metavar="ACTION", required=True)

    list_ = actions.add_parser("list", help="list the active assets")
    list_.add_argument("--all", action="store_true", help="include inactive assets")
    json_flag(list_, "one asset per line")
    list_.set_defaults(handler=store_handler(_assets_list))

    register_ = actions.add_parser("register", help="register (or reactivate) an asset")
    register_.add_argument("name", metavar="NAME")
    register_.add_argument("--uri", metavar="URI", help="the asset's URI")
    register_.set_defaults(handler=store_handler(_assets_register, check=_check_asset))

    deactivate = actions.add_parser(
        "deactivate", help="mark an asset inactive (its state is swept by clean)"
    )
    deactivate.add_argument("name", metavar="NAME")
    deactivate.set_defaults(handler=store_handler(_assets_deactivate, check=_check_asset))


def _add_events(subparsers: Subparsers) -> None:
    events = subparsers.add_parser("events", help="committed asset events, in commit order")
    events.add_argument("--asset", metavar="NAME", help="only the events of this asset")
    events.add_argument(
        "--since",
        type=int_between(0, MAX_BIGINT),
        default=0,
        metavar="ID",
        help="only events with an id above ID",
    )
    events.add_argument(
        "--limit", type=int_between(1, MAX_BIGINT), metavar="N", help="at most N events"
    )
    events.add_argument(
        "--follow",
        action="store_true",
        help=f"keep printing new events (polls every {FOLLOW_INTERVAL} s) until interrupted",
    )
    json_flag(events, "one event per line")
    events.set_defaults(handler=store_handler(_events))


def register(subparsers: Subparsers) -> None:
    """Add ``db``, ``state-store``, ``assets`` and ``events`` to the ``watchkeeper`` parser."""
    _add_db(subparsers)
    register_state_store(subparsers)
    _add_assets(subparsers)
    _add_events(subparsers)
