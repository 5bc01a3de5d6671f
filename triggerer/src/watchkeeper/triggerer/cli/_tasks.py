"""Subcommands of tasks on asset events: ``worker``, ``up``, ``tasks ...`` and ``runs ...``.

``watchkeeper worker`` runs the ``asset_task`` tasks of the definition files (the watchers
path) until SIGTERM or SIGINT; ``watchkeeper up`` runs a triggerer and a worker in one process
on one store. ``tasks`` and ``runs`` read and steer what the workers do, through the store, so
they work while workers run.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from .._core import iso, run_record, task_record
from ._api import api_options, with_api_options
from ._common import (
    PROG,
    CommandError,
    UsageError,
    cli_writer,
    compact_json,
    console,
    emit,
    emit_json,
    emit_listing,
    int_at_least,
    json_flag,
    open_backend,
    run_async,
    store_handler,
)
from ._run_logs import register_logs
from ._runtime import with_triggerer_options

__all__ = ["register"]

if TYPE_CHECKING:
    from watchkeeper.store import BaseStateBackend
    from watchkeeper.store.protocols import TaskQueue

    from ..settings import ApiSettings, Settings
    from ..worker import AssetTask, TaskFiles

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def _queue(backend: BaseStateBackend) -> TaskQueue:
    queue = backend.services.tasks
    if queue is None:
        raise CommandError(f"{type(backend).__name__} does not support tasks")
    return queue


def _load_tasks(settings: Settings) -> tuple[tuple[AssetTask, ...], TaskFiles]:
    """The tasks of the definition files, and the files, for the worker to follow."""
    from ..worker import TaskFiles

    path = Path(settings.triggerer.watchers_path)
    if not path.is_dir():
        raise UsageError(
            f"watchers path {str(path)!r} is not a directory "
            "(use --watchers-path or [triggerer] watchers_path)"
        )
    files = TaskFiles(path, import_timeout=settings.triggerer.import_timeout)
    load = files.load()  # refusals are logged
    return tuple(load.tasks.values()), files


# -- watchkeeper worker / up ---------------------------------------------------------------------


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from ..daemon import unload_watchers
    from ..worker import configure_connections, run_worker

    settings = with_triggerer_options(settings, args)
    tasks, files = _load_tasks(settings)
    if not tasks:
        raise UsageError(
            f"no asset_task is defined under {str(settings.triggerer.watchers_path)!r}"
        )
    backend = open_backend(settings)
    configure_connections(backend, settings.worker, "watchkeeper worker")

    async def main() -> None:
        async with backend:
            await run_worker(
                backend,
                tasks,
                settings.worker,
                stop_grace=settings.triggerer.stop_grace,
                process_settings=settings,
                files=files,
            )

    try:
        run_async(main, event_loop=settings.triggerer.event_loop)
    finally:
        unload_watchers()
    return 0


async def run_up(
    settings: Settings, tasks: tuple[AssetTask, ...], files: TaskFiles | None = None
) -> None:
    """A triggerer and a worker on one store until SIGTERM or SIGINT; both stop cleanly.

    The tasks are declared before the triggerer starts, so no event its watchers commit
    comes before a task's cursor. The worker follows ``files`` (the definition files the
    tasks came from), when given. With ``[api] enabled`` the HTTP API is served in the same
    task group, as ``watchkeeper triggerer`` does; it stops with the worker.
    """
    import anyio
    from watchkeeper.store.protocols import get_logger

    from .._core import notify
    from ..daemon import Daemon, start_api
    from ..worker import Worker, configure_connections

    log = get_logger(__name__)

    if settings.api.enabled:
        importlib.import_module("watchkeeper.triggerer.api")  # before any trigger runs
    backend = open_backend(settings)
    configure_connections(backend, settings.worker, "watchkeeper up")
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async with backend:
            worker = Worker(backend, tasks, process_settings=settings, files=files)
            await worker.declare()
            async with (
                Daemon(settings, backend=backend, tune_gc=True) as daemon,
                anyio.create_task_group() as tg,
            ):
                port = await start_api(tg, daemon) if settings.api.enabled else None
                await tg.start(worker.run)
                if port is not None:
                    say_where_the_page_is(settings.api, port)
                notify(READY=1, STATUS=f"watching {daemon.watchers_path}")
                async for signum in received:
                    log.info("up_stopping", signal=signal.Signals(signum).name)
                    notify(STOPPING=1)
                    worker.stop_claiming()
                    with anyio.move_on_after(settings.triggerer.stop_grace):
                        await worker.drained()
                    tg.cancel_scope.cancel()
                    break


def say_where_the_page_is(api: ApiSettings, port: int) -> None:
    """Tell the person who ran ``up`` where the page is (https when the API serves TLS) and
    how to get a token for it (on stderr: stdout stays free for what a command prints)."""
    host = api.host
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    scheme = "https" if api.tls_certfile is not None else "http"
    sys.stderr.write(
        f"{PROG} up: the web page and the API are at {scheme}://{shown}:{port}/\n"
        f"{PROG} up: the page asks for a token; create one with:"
        f" {PROG} tokens create NAME --scope read --scope operate\n"
    )
    sys.stderr.flush()


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from ..daemon import unload_watchers

    settings = with_triggerer_options(settings, args)
    settings = with_api_options(settings, args)
    tasks, files = _load_tasks(settings)
    try:
        run_async(
            functools.partial(run_up, settings, tasks, files),
            event_loop=settings.triggerer.event_loop,
        )
    finally:
        unload_watchers()
    return 0


# -- watchkeeper tasks ---------------------------------------------------------------------------


async def _tasks_list(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    from ._table import PlainTable

    infos = await _queue(backend).alist_tasks()
    empty = "no tasks registered (a worker registers its tasks when it starts)"
    if emit_listing(infos, args.json, task_record, empty):
        return 0
    table = PlainTable("task", "schedule", "pending", "paused", "removed", title="tasks")
    for info in infos:
        names = ", ".join(info.spec.assets)
        schedule = f"AnyOf({names})" if info.spec.mode == "any" else f"[{names}]"
        pending = " ".join(f"{a}={n}" for a, n in info.pending.items())
        table.add_row(
            info.name, schedule, pending, "yes" if info.paused else "no",
            "yes" if info.removed else "no",
        )  # fmt: skip
    console().print(table)
    return 0


async def _tasks_pause(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    paused = args.tasks_command == "pause"
    await _queue(backend).aset_task_paused(args.name, paused)
    emit(f"task {args.name!r} {'paused' if paused else 'resumed'}")
    return 0


async def _tasks_delete(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    from watchkeeper.store import TaskNotFoundError

    queue = _queue(backend)
    if args.name not in {info.name for info in await queue.alist_tasks()}:
        raise CommandError(f"no task named {args.name!r}")
    if not args.yes:
        await _confirm(
            f"forget task {args.name!r} for good (its cursors and pending events; its runs "
            "are kept until retention)"
        )
    try:
        await queue.adelete_task(args.name)
    except TaskNotFoundError:  # deleted meanwhile
        raise CommandError(f"no task named {args.name!r}") from None
    emit(f"task {args.name!r} deleted (its runs are kept until retention)")
    return 0


async def _confirm(what: str) -> None:
    """Ask on the terminal whether to ``what``; anything but yes changes nothing. Without a
    terminal to ask on, the command is refused: a script says ``--yes``."""
    import anyio.to_thread

    if not sys.stdin.isatty():
        raise UsageError(f"not deleted: confirm on a terminal, or pass --yes to {what}")
    sys.stderr.write(f"{PROG}: {what}? [y/N] ")
    sys.stderr.flush()
    answer = await anyio.to_thread.run_sync(sys.stdin.readline)
    if answer.strip().lower() not in {"y", "yes"}:
        raise CommandError("not deleted")


async def _tasks_rewind(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    await _queue(backend).arewind_task(args.name, args.asset, args.to_event, writer=cli_writer())
    emit(
        f"task {args.name!r}: events of {args.asset!r} from id {args.to_event} will be redelivered"
    )
    return 0


# -- watchkeeper runs ----------------------------------------------------------------------------


async def _runs_list(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    from ._table import PlainTable

    runs = await _queue(backend).alist_runs(
        task=args.task, state=args.state, limit=args.limit, before=args.before,
        event_ids=args.json,
    )  # fmt: skip
    if emit_listing(runs, args.json, run_record, "no runs"):
        return 0
    table = PlainTable(
        "run", "task", "state", "try", "events", "created_at", "finished_at", title="runs"
    )
    for run in runs:
        table.add_row(
            str(run.id), run.task, run.state, str(run.try_number), str(run.event_count),
            run.created_at.isoformat(), iso(run.finished_at) or "",
        )  # fmt: skip
    console().print(table)
    return 0


async def _runs_show(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    run = await _queue(backend).aget_run(args.run_id)
    record = run_record(run, events=True)
    if args.json:
        emit_json(record)
        return 0
    for key in ("id", "task", "state", "try_number", "max_tries", "event_count", "created_at",
                "started_at", "finished_at", "duration_seconds", "lease_owner"):  # fmt: skip
        emit(f"{key}: {record[key] if record[key] is not None else ''}")
    emit("event ids: " + compact_json([e["id"] for e in record["events"]]))
    for error in record["errors"]:
        emit(f"try {error['try']} failed at {error['at']}: {error['error']}")
        if error["traceback"]:
            emit(error["traceback"].rstrip())
    return 0


async def _runs_retry(backend: BaseStateBackend, args: argparse.Namespace, _: Settings) -> int:
    queue = _queue(backend)
    if (args.run_id is None) == (args.task is None):
        raise UsageError("give a RUN_ID, or --task NAME to retry every failed run of a task")
    if args.run_id is not None:
        run = await queue.aretry_run(args.run_id)
        emit(f"run {run.id} queued for try {run.try_number + 1}")
        return 0
    from watchkeeper.store import TaskNotFoundError

    from .._core import retry_failed_runs  # loads the store: not for --help

    try:
        retried = await retry_failed_runs(queue, args.task)
    except TaskNotFoundError:
        raise CommandError(f"no task named {args.task!r}") from None
    emit(f"task {args.task!r}: {len(retried)} failed run(s) queued for one more try")
    return 0


# -- the parsers ---------------------------------------------------------------------------------


def _runtime_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--watchers-path", type=Path, metavar="DIR", help="overrides [triggerer] watchers_path"
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="TOML settings file (as the global --config)",
    )


def register(subparsers: Subparsers) -> None:
    """Add ``worker``, ``up``, ``tasks`` and ``runs`` to the ``watchkeeper`` parser."""
    worker = subparsers.add_parser("worker", help="run the asset_task tasks of the definitions")
    _runtime_options(worker)
    worker.set_defaults(handler=_worker, long_running=True)

    up = subparsers.add_parser("up", help="run a triggerer and a worker in one process")
    _runtime_options(up)
    api_options(up)
    up.set_defaults(handler=_up, long_running=True)

    tasks = subparsers.add_parser("tasks", help="tasks on asset events")
    actions = tasks.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    list_ = actions.add_parser("list", help="tasks, their schedule and pending events")
    json_flag(list_, "one task per line")
    list_.set_defaults(handler=store_handler(_tasks_list))
    for name, text in (("pause", "create no new run of a task"), ("resume", "undo pause")):
        action = actions.add_parser(name, help=text)
        action.add_argument("name", metavar="NAME")
        action.set_defaults(handler=store_handler(_tasks_pause))
    delete = actions.add_parser(
        "delete", help="forget a task for good: its cursors and pending events (runs are kept)"
    )
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(handler=store_handler(_tasks_delete))
    rewind = actions.add_parser("rewind", help="redeliver past events of one asset to a task")
    rewind.add_argument("name", metavar="NAME")
    rewind.add_argument("--asset", required=True, metavar="A", help="a scheduled asset")
    rewind.add_argument(
        "--to-event", required=True, type=int_at_least(1), metavar="ID",
        help="redeliver the events from this id on",
    )  # fmt: skip
    rewind.set_defaults(handler=store_handler(_tasks_rewind))

    runs = subparsers.add_parser("runs", help="runs of tasks")
    actions = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    rlist = actions.add_parser("list", help="runs, newest first")
    rlist.add_argument("--task", metavar="NAME", help="only this task's runs")
    rlist.add_argument(
        "--state", choices=("queued", "running", "success", "failed"), help="only runs in it"
    )
    rlist.add_argument("--limit", type=int_at_least(1), default=100, metavar="N")
    rlist.add_argument(
        "--before", type=int_at_least(1), metavar="RUN_ID",
        help="only runs older than this one (the next page after a run id)",
    )  # fmt: skip
    json_flag(rlist, "one run per line")
    rlist.set_defaults(handler=store_handler(_runs_list))
    show = actions.add_parser("show", help="one run: its events, tries, errors, durations")
    show.add_argument("run_id", type=int_at_least(1), metavar="RUN_ID")
    json_flag(show, "the run")
    show.set_defaults(handler=store_handler(_runs_show))
    retry = actions.add_parser(
        "retry", help="queue a failed run (or every failed run of a task) for one more try"
    )
    retry.add_argument("run_id", type=int_at_least(1), metavar="RUN_ID", nargs="?")
    retry.add_argument("--task", metavar="NAME", help="every failed run of this task")
    retry.add_argument(
        "--state", choices=("failed",), default="failed",
        help="the runs to retry with --task (only failed runs can be retried)",
    )  # fmt: skip
    retry.set_defaults(handler=store_handler(_runs_retry))
    register_logs(actions)
