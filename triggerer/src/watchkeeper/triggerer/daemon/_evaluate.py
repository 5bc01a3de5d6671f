"""Reading watcher files in a separate process, so that no file can hang or kill the daemon.

A watcher file is user code that runs at import: ``while True: pass`` or a connection without
a timeout at module level would freeze the daemon that imports it (a thread cannot be killed,
so a thread alone cannot bound it), and ``os._exit()`` would end it. :func:`aload_watchers`
therefore imports the files in a child process (this interpreter, the daemon's ``sys.path``)
that hands back each file's :class:`~._watcher_files.FileDefinitions` as one line of JSON: asset
names, watcher names and the triggers' ``serialize()``. ``__init__`` and ``serialize()`` run
there too, as the files build their triggers.

The daemon waits at most ``import_timeout`` seconds for each file. Past it, the file is refused
(``watcher_refused``, reason ``import timed out after 30 s``), the child is killed and a new one
reads the files after it; a child that dies refuses the file it was reading the same way. One
child reads all the files, so a load costs one interpreter start (about what importing
watchkeeper costs) plus the files' own import time; a hung file costs its timeout and one more
start. The daemon starts each load's child ahead (:class:`ReadingProcesses`), so a reload does
not wait for that start; and a load after another reads only the files that may define
something else now (:meth:`~._watcher_files.FileReads.stale`, from the imports the child
noted), and rebuilds only their triggers.

The daemon then rebuilds each trigger from its serialization, through the allow-list
(:func:`~._identity.rebuild_trigger`), as :func:`~._loader.load_watchers` does. That imports the trigger's module (often the watcher file
itself) in the daemon: the child has just imported it within the timeout, and the rebuilds run
in a daemon thread, each bounded by the same timeout, so even a file that hangs only sometimes
cannot hold up the daemon (the hung thread is abandoned and the trigger refused; one that was
running keeps running its previous instance).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Self

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from .._core import kept_logging
from ..errors import TriggererError, TriggerImportError
from ..trigger import BaseEventTrigger
from ._identity import rebuild_trigger
from ._import_edges import ImportTracker
from ._loader import (
    LoadResult,
    PendingTrigger,
    WatcherGroup,
    finish,
    group_of,
    missing_path,
    plan_load,
    refuse_group,
    reused_trigger,
)
from ._watcher_files import (
    MODULES,
    FileDefinitions,
    FileReads,
    FileStamp,
    WatcherError,
    default_allowed_modules,
    read_definitions,
    scan_watchers_path,
)

__all__ = [
    "DEFAULT_IMPORT_TIMEOUT",
    "ReadingProcesses",
    "aload_watchers",
    "child_main",
    "evaluate_files",
]

DEFAULT_IMPORT_TIMEOUT: Final = 30.0
_START_TIMEOUT: Final = 60.0
"""Seconds a child gets to start (interpreter and watchkeeper imports, no user code)."""
_MAX_LINE: Final = 64 * 1024 * 1024
_READY: Final = b'{"ready":true}\n'
_CHILD_CODE: Final = "from watchkeeper.triggerer.daemon._evaluate import child_main; child_main()"


class _ChildFailedError(TriggererError):
    """Raised when the reading process could not even start (no user code had run)."""


@dataclass(frozen=True, slots=True)
class _Stuck:
    """A trigger not rebuilt because an import in the daemon hangs (not its file's fault)."""

    reason: str


# -- the child -----------------------------------------------------------------------------------


def _exit_with_parent(parent: int) -> None:
    """End this process once the daemon that started it is gone (killed with -9, say)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def child_main() -> None:
    """The reading process: a request line on stdin, one JSON line per file on stdout.

    The request is ``{"path", "files", "sys_path", "env", "cwd"}``; the process may be started
    ahead of it (see :class:`ReadingProcesses`), and ends quietly when stdin closes first. Each
    answer is a file's definitions with ``"imports"``: the edges :class:`~._import_edges.ImportTracker` noted
    while the file was read. The files' own output (``print`` at import) goes to stderr:
    stdout is kept for the answers only.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the daemon's to handle
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    line = sys.stdin.readline()
    if not line:  # the daemon went away, or no longer needs this process
        os._exit(0)
    request = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    parent = os.getppid()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    sys.path[:] = request["sys_path"]
    if "env" in request:  # as the daemon's environment is now, not when this process started
        os.environ.clear()
        os.environ.update(request["env"])
    if "cwd" in request:
        os.chdir(request["cwd"])
    path = Path(request["path"])
    MODULES.reset(path)
    tracker = ImportTracker(path)
    tracker.install()
    out.write(_READY)
    for rel in request["files"]:
        tracker.current, tracker.edges = rel, {}
        with kept_logging():  # a file importing Airflow would take over the log (stderr here)
            answer = read_definitions(path, path / rel).to_json()
        answer["imports"] = {k: sorted(v) for k, v in tracker.edges.items()}
        out.write(json.dumps(answer, ensure_ascii=True).encode() + b"\n")
    out.close()
    # Without running the files' atexit hooks or joining the threads they started.
    os._exit(0)


# -- the daemon's side ---------------------------------------------------------------------------


def _timed_out(rel: str, timeout: float) -> FileDefinitions:
    return FileDefinitions(
        rel, error=WatcherError(rel, None, f"import timed out after {timeout:g} s")
    )


async def _kill(process: Process) -> None:
    with anyio.move_on_after(5, shield=True):
        if process.returncode is None:
            process.kill()
        await process.wait()
        await process.aclose()


async def _start_child() -> Process:
    return await anyio.open_process(
        [sys.executable, "-P", "-c", _CHILD_CODE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,  # the files' own output, and tracebacks, go where the daemon's go
    )


class ReadingProcesses:
    """Keeps one reading process started ahead of the next load, so that a load does not
    wait for an interpreter to start and import watchkeeper (the larger part of reading a
    few files). Each process still reads for one load only: nothing of one load's imports
    is left for the next. An async context manager: leaving it ends the waiting process."""

    def __init__(self) -> None:
        self._spare: Process | None = None

    def take(self) -> Process | None:
        """The process started ahead, if any (the caller owns it from now on)."""
        spare, self._spare = self._spare, None
        return spare

    async def refill(self) -> None:
        """Start the next load's process, unless one is waiting already."""
        if self._spare is None:
            self._spare = await _start_child()

    async def aclose(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            await _kill(spare)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _read_with_one_child(
    path: Path,
    files: Sequence[str],
    limit: float,
    results: dict[str, FileDefinitions],
    imports: dict[str, set[str]],
    process: Process | None = None,
) -> int:
    """Read ``files`` in order with one child (``process``, or a new one); return how many
    were settled (read or refused), and add the import edges noted to ``imports``.

    Stops after the first file that timed out or ended the child: the caller goes on with a
    new child from the file after it.
    """
    request = {
        "path": str(path),
        "files": list(files),
        "sys_path": sys.path,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
    }
    if process is None:
        process = await _start_child()
    try:
        assert process.stdin is not None and process.stdout is not None
        try:
            await process.stdin.send(json.dumps(request, ensure_ascii=True).encode() + b"\n")
            await process.stdin.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # it ended already: said below
        lines = BufferedByteReceiveStream(process.stdout)
        with anyio.move_on_after(max(_START_TIMEOUT, limit)):
            try:
                ready = await lines.receive_until(b"\n", len(_READY))
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound):
                ready = b""
        if ready + b"\n" != _READY:
            await _kill(process)
            raise _ChildFailedError(
                "the process that reads the watcher files did not start "
                f"(exit status {process.returncode}); see its output above"
            )
        for done, rel in enumerate(files):
            line: bytes | None = None
            reason: str | None = None
            with anyio.move_on_after(limit):
                try:
                    line = await lines.receive_until(b"\n", _MAX_LINE)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    await process.wait()
                    reason = (
                        "import ended the process that reads the watcher files "
                        f"(exit status {process.returncode})"
                    )
                except anyio.DelimiterNotFound:
                    reason = f"its definitions are larger than {_MAX_LINE} bytes of JSON"
            if line is None:
                results[rel] = (
                    _timed_out(rel, limit)
                    if reason is None
                    else FileDefinitions(rel, error=WatcherError(rel, None, reason))
                )
                return done + 1
            answer = json.loads(line)
            results[rel] = FileDefinitions.from_json(answer)
            for importer, imported in answer.get("imports", {}).items():
                imports.setdefault(importer, set()).update(imported)
        return len(files)
    finally:
        await _kill(process)


async def evaluate_files(
    path: Path,
    files: Sequence[str],
    *,
    import_timeout: float = DEFAULT_IMPORT_TIMEOUT,
    processes: ReadingProcesses | None = None,
    imports: dict[str, set[str]] | None = None,
) -> dict[str, FileDefinitions]:
    """Read each file (relative to ``path``) in a child process, ``import_timeout`` seconds
    at most each; a file past it, or that ends the child, is refused and the next child goes on.

    With ``processes``, the first child is the one it started ahead (a new one if that one
    fails to answer), and the next load's is started once the files are read. ``imports``
    receives the edges between the path's files noted while they were read.
    """
    results: dict[str, FileDefinitions] = {}
    edges: dict[str, set[str]] = {} if imports is None else imports
    todo = list(files)
    spare = processes.take() if processes is not None else None
    while todo:
        try:
            settled = await _read_with_one_child(path, todo, import_timeout, results, edges, spare)
        except _ChildFailedError:
            if spare is None:
                raise
            settled = 0  # the process started ahead died meanwhile: a new one reads
        spare = None
        todo = todo[settled:]
    if processes is not None:
        await processes.refill()
    return results


async def rebuild_in_daemon(
    path: Path, entries: Sequence[PendingTrigger], allowed: Sequence[str], limit: float
) -> list[BaseEventTrigger | str | _Stuck]:
    """Rebuild each entry's trigger in this process: the trigger, or why it was refused
    (a :class:`_Stuck` when an import in the daemon hangs).

    The imports run one after another in a daemon thread of their own. The loop waits as long
    as the thread makes progress, at most ``limit`` seconds per trigger: past that, the
    trigger being rebuilt is refused as timed out and the thread is abandoned (it cannot be
    stopped; as a daemon thread it never keeps the process from exiting). The triggers after
    it are refused too, as the hung import holds the loader's lock; a later load waits at most
    ``limit`` for that lock. The caller keeps running the previous instance of a trigger
    that could not be rebuilt for that reason.
    """
    results: list[BaseEventTrigger | str] = []
    locked = threading.Event()
    finished = anyio.Event()
    token = anyio.lowlevel.current_token()

    def work() -> None:
        try:
            if not MODULES.lock.acquire(timeout=limit):
                return
            locked.set()
            try:
                MODULES.reset(path)
                for entry in entries:
                    try:
                        trigger = rebuild_trigger(entry.classpath, entry.kwargs, allowed)
                    except TriggerImportError as exc:
                        results.append(str(exc))
                    else:
                        results.append(trigger)
            finally:
                MODULES.lock.release()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                anyio.from_thread.run_sync(finished.set, token=token)

    threading.Thread(target=work, name="watchkeeper-rebuild", daemon=True).start()
    progress = -1
    while not finished.is_set() and len(results) > progress:
        progress = len(results)
        with anyio.move_on_after(limit):
            await finished.wait()
    settled: list[BaseEventTrigger | str | _Stuck] = list(results)
    if len(settled) < len(entries):
        rest = _Stuck("not rebuilt: an earlier import in the daemon still hangs")
        if locked.is_set() and finished.is_set():
            rest = _Stuck("not rebuilt: the daemon's import thread failed")
        elif locked.is_set():
            settled.append(_Stuck(f"import timed out after {limit:g} s in the daemon"))
        settled.extend(rest for _ in entries[len(settled) :])
    return settled


async def aload_watchers(
    path: Path | str,
    *,
    allowed_modules: Sequence[str] | None = None,
    previous: LoadResult | None = None,
    import_timeout: float = DEFAULT_IMPORT_TIMEOUT,
    processes: ReadingProcesses | None = None,
    stamps: Mapping[str, FileStamp] | None = None,
) -> LoadResult:
    """:func:`~._loader.load_watchers`, with the files read in a child process and every
    import bounded by ``import_timeout`` seconds (see the module's docstring).

    With a ``previous`` load of the same path, only the files that may define something else
    now are read again (:meth:`FileReads.stale`: changed, new, refused last time, or importing
    a file that changed), and only their triggers are rebuilt; the others keep what was read
    and the instances built then. ``processes`` (see :class:`ReadingProcesses`) spares the
    load an interpreter's start. ``stamps``: the path's scan (:func:`scan_watchers_path`), when
    the caller took one just before; otherwise the load takes its own.

    Cancellable at any point (the child is killed). Raises :class:`TriggererError` only when
    the child cannot start at all.
    """
    if import_timeout <= 0:
        raise ValueError(f"import_timeout must be positive, got {import_timeout}")
    path = Path(await anyio.Path(path).resolve())
    if not await anyio.Path(path).is_dir():
        return missing_path(path, previous)
    explicit = tuple(allowed_modules) if allowed_modules else None
    if stamps is None:
        stamps = await anyio.to_thread.run_sync(scan_watchers_path, path)
    rels = list(stamps)
    last = previous.reads if previous is not None and previous.path == path else None
    if last is not None and last.allowed != explicit:
        last = None
    stale = set(rels) if last is None else last.stale(stamps)
    edges: dict[str, set[str]] = {}
    todo = [rel for rel in rels if rel in stale]
    read = (
        await evaluate_files(
            path, todo, import_timeout=import_timeout, processes=processes, imports=edges
        )
        if todo
        else {}
    )
    cached = last.definitions if last is not None else {}  # every file is in one of the two
    definitions = {rel: read[rel] if rel in read else cached[rel] for rel in rels}
    imports = {k: v for k, v in (last.imports.items() if last else ()) if k in stamps}
    for rel in read:  # what they import now, noted anew
        imports.pop(rel, None)
    imports.update((k, frozenset(v)) for k, v in edges.items() if k in stamps)
    reads = FileReads(stamps, definitions, imports, explicit)
    plan = plan_load(definitions, previous)

    # The instance to keep: a carried file's, or one whose files were not read again.
    before = {g.trigger_id: g for g in previous.groups} if previous is not None else {}
    kept: dict[int, BaseEventTrigger] = {}
    for entry in plan.pending:
        reused = reused_trigger(plan, entry)
        if reused is None and last is not None and not any(f in read for f in entry.files):
            reused = plan.before.get(entry.trigger_id)
        if reused is not None:
            kept[id(entry)] = reused
    groups: list[WatcherGroup] = []
    errors: list[WatcherError] = []
    fresh = [entry for entry in plan.pending if id(entry) not in kept]
    # The path's own modules are allowed by default: listed when a trigger is rebuilt. (A
    # kept one stays allowed: had its module gone, the files importing it were read again.)
    allowed: Sequence[str] = explicit or ()
    if fresh and explicit is None:
        allowed = await anyio.to_thread.run_sync(default_allowed_modules, path)
    rebuilt = dict(
        zip(
            (id(entry) for entry in fresh),
            await rebuild_in_daemon(path, fresh, allowed, import_timeout) if fresh else [],
            strict=True,
        )
    )
    for entry in plan.pending:
        trigger = kept.get(id(entry)) or rebuilt[id(entry)]
        if isinstance(trigger, _Stuck):
            # Not this trigger's fault: one that ran before keeps its running instance.
            running = plan.before.get(entry.trigger_id)
            if running is None:
                errors.extend(refuse_group(entry, trigger.reason))
                continue
            errors.extend(refuse_group(entry, f"{trigger.reason}; the running trigger is kept"))
            trigger = running
        elif isinstance(trigger, str):
            errors.extend(refuse_group(entry, trigger))
            continue
        same = before.get(entry.trigger_id)
        if same is not None and same.trigger is trigger:  # its kwargs are decoded already
            groups.append(
                WatcherGroup(
                    entry.trigger_id,
                    entry.classpath,
                    same.kwargs,
                    trigger,
                    tuple(entry.assets),
                    tuple(entry.watchers),
                    tuple(entry.files),
                )
            )
        else:
            groups.append(group_of(entry, trigger))
    return dataclasses.replace(finish(path, plan, groups, errors), reads=reads)
