"""``watchkeeper state-store``: get, set, delete, clear, list and clean task and asset state
(``clean`` also deletes the asset events past ``[events]`` retention).

A key is addressed by ``--asset NAME`` or by ``--task DAG_ID RUN_ID TASK_ID [--map-index N]``.
Values go in and come out as JSON; writes are recorded as ``Writer("cli", <user>)``. Bad input
is rejected before anything is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from watchkeeper.store import (
    MAX_BIGINT,
    MAX_KEY_LENGTH,
    MAX_MAP_INDEX,
    MAX_VALUE_DEPTH,
    NEVER_EXPIRE,
    AssetScope,
    StateEntry,
    StateScope,
    TaskScope,
)

from ._common import (
    CommandError,
    UsageError,
    cli_writer,
    compact_json,
    console,
    emit,
    emit_json,
    int_between,
    json_flag,
    printable,
    store_handler,
)

if TYPE_CHECKING:
    from watchkeeper.store import BaseStateBackend

    from ..settings import Settings
    from ._common import Subparsers

__all__ = ["register_state_store"]

_KEY_HELP = (
    f"a non-empty key of at most {MAX_KEY_LENGTH} characters (1,024 UTF-8 bytes), "
    "without control characters"
)
_MAX_RETENTION_DAYS: Final = timedelta.max.days


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _TooLong(ValueError):
    """An integer literal past Python's int-to-text digit limit: valid JSON, not storable."""


def _parse_int(digits: str) -> int:
    try:
        return int(digits)
    except ValueError:
        raise _TooLong(
            f"its integer of {len(digits.lstrip('-'))} digits is longer than the "
            f"{sys.get_int_max_str_digits()} the store can keep"
        ) from None


def _json_value(text: str) -> Any:
    """argparse ``type=``: the JSON document ``text`` (``-``: read it from stdin)."""
    if text == "-":
        text = sys.stdin.read()
    shown = text if len(text) <= 40 else text[:37] + "..."
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:
        raise argparse.ArgumentTypeError(
            f"{shown!r} is nested too deeply (the store keeps at most {MAX_VALUE_DEPTH} levels)"
        ) from None
    except _TooLong as exc:
        raise argparse.ArgumentTypeError(f"{shown!r}: {exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not JSON ({exc}); quote a string as '\"text\"'"
        ) from None


# -- addressing: --asset NAME | --task DAG_ID RUN_ID TASK_ID [--map-index N] -------------------


def _scope_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    exclusive = parent.add_mutually_exclusive_group(required=True)
    exclusive.add_argument("--asset", metavar="NAME", help="the state of this asset")
    exclusive.add_argument(
        "--task",
        nargs=3,
        metavar=("DAG_ID", "RUN_ID", "TASK_ID"),
        help="the state of this task instance",
    )
    parent.add_argument(
        "--map-index",
        type=int_between(-1, MAX_MAP_INDEX),
        metavar="N",
        help="map index of the task instance (default -1: not mapped)",
    )
    return parent


def _scope(args: argparse.Namespace) -> StateScope:
    if args.asset is not None:
        if args.map_index is not None:
            raise UsageError("--map-index applies to --task only")
        if not args.asset:
            raise UsageError("--asset needs a non-empty asset name")
    map_index = -1 if args.map_index is None else args.map_index
    try:
        if args.asset is not None:
            return AssetScope(name=args.asset)
        dag_id, run_id, task_id = args.task
        return TaskScope(dag_id, run_id, task_id, map_index)
    except ValueError as exc:  # the store's naming rule, or a number out of range
        raise UsageError(str(exc)) from None


def _check_options(args: argparse.Namespace) -> None:
    """Reject option combinations argparse cannot express, before the store is opened."""
    if not isinstance(_scope(args), AssetScope):
        return
    retention = getattr(args, "retention_days", None) is not None
    if retention or getattr(args, "never_expire", False):
        raise UsageError("--retention-days and --never-expire apply to --task only")
    if getattr(args, "all_map_indices", False):
        raise UsageError("--all-map-indices applies to --task only")


def _describe(scope: StateScope, *, all_map_indices: bool = False) -> str:
    if isinstance(scope, AssetScope):
        return f"asset {scope.name!r}"
    if all_map_indices:
        where = printable(f"{scope.dag_id}/{scope.run_id}/{scope.task_id}")
        return f"task {where} (every map index)"
    return f"task {printable(str(scope))}"


def _entry_record(entry: StateEntry) -> dict[str, Any]:
    return {
        "key": entry.key,
        "value": entry.value,
        "version": entry.version,
        "updated_at": entry.updated_at.isoformat(),
        "writer": None if entry.writer is None else str(entry.writer),
    }


# -- state-store --------------------------------------------------------------------------------


async def _state_get(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    scope = _scope(args)
    entry = await backend.aget_entry(scope, args.key)
    if entry is None:
        raise CommandError(f"key {args.key!r} is not set for {_describe(scope)}")
    if args.json:
        emit_json(entry.value)
    else:
        emit(json.dumps(entry.value, ensure_ascii=False, indent=2))
    return 0


async def _guard_running_watchers(backend: BaseStateBackend, asset: str, force: bool) -> None:
    """Before a write to ``asset``'s state: refuse it (:class:`CommandError`, nothing written)
    while an unpaused watcher of the asset runs, since its next event may overwrite the key;
    with ``force``, warn on stderr and let the write go ahead."""
    from ..daemon import watcher_rows

    running = [
        row.watcher
        for row in await watcher_rows(backend)
        if asset in row.assets and not row.paused and row.state in ("running", "backing_off")
    ]
    if not running:
        return
    names = ", ".join(repr(printable(name)) for name in running)
    said = f"watcher {names} of asset {printable(asset)!r} is running and may overwrite this key"
    if not force:
        raise CommandError(
            f"{said}; nothing written. Pause it first (watchkeeper watchers pause "
            f"{printable(running[0])}), or pass --force to write anyway"
        )
    sys.stderr.write(f"watchkeeper: warning: {said}; writing anyway (--force)\n")
    sys.stderr.flush()


async def _state_set(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    scope = _scope(args)
    retention: object = None
    if args.never_expire:
        retention = NEVER_EXPIRE
    elif args.retention_days is not None:
        retention = timedelta(days=args.retention_days)
    if isinstance(scope, AssetScope) and scope.name is not None:
        await _guard_running_watchers(backend, scope.name, args.force)
    version = await backend.aset(
        scope,
        args.key,
        args.value,
        retention=retention,
        expected_version=args.expected_version,
        writer=cli_writer(),
    )
    if args.json:
        emit_json({"key": args.key, "version": version})
    else:
        emit(f"set {args.key!r} on {_describe(scope)} (version {version})")
    return 0


async def _state_delete(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    scope = _scope(args)
    existed = await backend.aget_raw(scope, args.key) is not None
    await backend.adelete(scope, args.key)
    if existed:
        emit(f"deleted {args.key!r} from {_describe(scope)}")
    else:
        emit(f"{args.key!r} was not set for {_describe(scope)}; nothing deleted")
    return 0


async def _state_clear(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    scope = _scope(args)
    count = await backend.aclear(scope, all_map_indices=args.all_map_indices)
    noun = "key" if count == 1 else "keys"
    emit(f"cleared {count} {noun} from {_describe(scope, all_map_indices=args.all_map_indices)}")
    return 0


async def _state_list(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    from ._table import PlainTable

    scope = _scope(args)
    entries = await backend.alist(scope)
    if args.json:
        for entry in entries:
            emit_json(_entry_record(entry))
        return 0
    if not entries:
        emit(f"no keys for {_describe(scope)}")
        return 0
    table = PlainTable("key", "value", "version", "updated_at", "writer", title=_describe(scope))
    for entry in entries:
        record = _entry_record(entry)
        table.add_row(
            entry.key,
            compact_json(entry.value),
            str(entry.version),
            record["updated_at"],
            record["writer"] or "",
        )
    console().print(table)
    return 0


def _event_rule(retention_days: int, dedup_retention_days: int) -> str:
    """The event retention in force, in words (the rule is the store's ``_gc`` module's)."""
    if not dedup_retention_days:
        dedup = "with a dedup_key: kept forever"
    else:
        dedup = f"with a dedup_key: older than {max(retention_days, dedup_retention_days)} days"
    return f"older than {retention_days} days; {dedup}"


async def _state_clean(backend: BaseStateBackend, args: argparse.Namespace, s: Settings) -> int:

    events = s.events
    report = await backend.gc.acollect_garbage(
        default_retention_days=s.state_store.default_retention_days,
        batch_size=s.state_store.state_cleanup_batch_size,
        dry_run=args.dry_run,
        event_retention_days=events.retention_days,
        dedup_retention_days=events.dedup_retention_days,
    )
    rows = len(report.expired) + len(report.retention) + len(report.orphaned)
    if args.json:
        emit_json(
            {
                "dry_run": report.dry_run,
                "rows": rows,
                "expired": [_task_row(scope, key) for scope, key in report.expired],
                "retention": [_task_row(scope, key) for scope, key in report.retention],
                "orphaned": [{"asset": name, "key": key} for name, key in report.orphaned],
                "events": report.events,
                "logs": report.logs,
                "event_retention_days": events.retention_days,
                "dedup_retention_days": events.dedup_retention_days,
            }
        )
        return 0
    lines = [("expired", f"task {printable(str(scope))}", key) for scope, key in report.expired]
    lines += [
        ("retention", f"task {printable(str(scope))}", key) for scope, key in report.retention
    ]
    lines += [("orphaned", f"asset {name!r}", key) for name, key in report.orphaned]
    verb = "would delete" if args.dry_run else "deleted"
    for reason, where, key in lines:
        emit(f"{verb} {reason}: {where} key {key!r}")
    emit(
        f"{verb} {rows} {'row' if rows == 1 else 'rows'} "
        f"({len(report.expired)} expired, {len(report.retention)} past retention, "
        f"{len(report.orphaned)} of inactive assets)"
    )
    if events.retention_days:
        rule = _event_rule(events.retention_days, events.dedup_retention_days)
        noun = "event" if report.events == 1 else "events"
        emit(f"{verb} {report.events} {noun} ({rule})")
    else:
        emit(f"{verb} 0 events ([events] retention_days = 0 keeps them forever)")
    if report.logs:
        noun = "chunk" if report.logs == 1 else "chunks"
        emit(f"{verb} {report.logs} log {noun} of runs finished before the events' retention")
    return 0


def _task_row(scope: TaskScope, key: str) -> dict[str, Any]:
    return {
        "dag_id": scope.dag_id,
        "run_id": scope.run_id,
        "task_id": scope.task_id,
        "map_index": scope.map_index,
        "key": key,
    }


# -- the parser --------------------------------------------------------------------------------


def register_state_store(subparsers: Subparsers) -> None:
    """Add ``state-store`` and its actions to the ``watchkeeper`` parser."""
    group = subparsers.add_parser("state-store", help="read and write task and asset state")
    actions = group.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    scope = _scope_options()
    _add_get(actions, scope)
    _add_set(actions, scope)
    _add_delete_and_clear(actions, scope)
    _add_list(actions, scope)
    _add_clean(actions)


def _add_get(actions: Subparsers, scope: argparse.ArgumentParser) -> None:
    get = actions.add_parser("get", parents=[scope], help="print the value of a key")
    get.add_argument("key", metavar="KEY", help=_KEY_HELP)
    json_flag(get, "the value")
    get.set_defaults(handler=store_handler(_state_get, check=_check_options))


def _add_set(actions: Subparsers, scope: argparse.ArgumentParser) -> None:
    """``set``: the key, its JSON value, a compare-and-set version, task state's retention."""
    set_ = actions.add_parser("set", parents=[scope], help="write a JSON value to a key")
    set_.add_argument("key", metavar="KEY", help=_KEY_HELP)
    set_.add_argument(
        "value", type=_json_value, metavar="VALUE", help="a JSON document ('-' reads stdin)"
    )
    set_.add_argument(
        "--expected-version",
        type=int_between(0, MAX_BIGINT),
        metavar="N",
        help="write only if the key is at version N (0: only if it does not exist)",
    )
    retention = set_.add_mutually_exclusive_group()
    retention.add_argument(
        "--retention-days",
        type=int_between(0, _MAX_RETENTION_DAYS),
        metavar="N",
        help="task state: expire N days after this write",
    )
    retention.add_argument(
        "--never-expire", action="store_true", help="task state: never collect this key"
    )
    set_.add_argument(
        "--force",
        action="store_true",
        help="asset state: write even while a watcher of the asset runs (it may overwrite it)",
    )
    json_flag(set_, "the key and its new version")
    set_.set_defaults(handler=store_handler(_state_set, check=_check_options))


def _add_delete_and_clear(actions: Subparsers, scope: argparse.ArgumentParser) -> None:
    delete = actions.add_parser("delete", parents=[scope], help="delete a key")
    delete.add_argument("key", metavar="KEY", help=_KEY_HELP)
    delete.set_defaults(handler=store_handler(_state_delete, check=_check_options))

    clear = actions.add_parser("clear", parents=[scope], help="delete every key of a scope")
    clear.add_argument(
        "--all-map-indices",
        action="store_true",
        help="with --task: every map index of the task in this run",
    )
    clear.set_defaults(handler=store_handler(_state_clear, check=_check_options))


def _add_list(actions: Subparsers, scope: argparse.ArgumentParser) -> None:
    list_ = actions.add_parser("list", parents=[scope], help="list the keys of a scope")
    json_flag(list_, "one entry per line")
    list_.set_defaults(handler=store_handler(_state_list, check=_check_options))


def _add_clean(actions: Subparsers) -> None:
    clean = actions.add_parser(
        "clean", help="garbage-collect expired and orphaned state and events past retention"
    )
    clean.add_argument(
        "--dry-run", action="store_true", help="print what would be deleted; delete nothing"
    )
    json_flag(clean, "the report (one document)")
    clean.set_defaults(handler=store_handler(_state_clean))
