"""``DirectoryWatcher``: one event per new file in a directory, exactly once.

The watermark is the greatest ``(modification time in ns, name)`` emitted, so files that share a
timestamp are ordered by name and none is missed or repeated. Late files (see
:mod:`._window`) are caught inside ``lag_window`` seconds behind the watermark:

- a file that shows up later with an *earlier* mtime than the watermark (copied with
  ``cp -p``/``rsync -t``, or written during a scan within the same timestamp tick) is emitted
  once, if its mtime is at most ``lag_window`` seconds older than the watermark and its name
  was not emitted inside the window already;
- a file older than that is never emitted: raise ``lag_window`` if your producers preserve
  older mtimes, or let them stamp the file when it lands;
- the recently emitted names travel in the state (``<watcher name>.recent``), at most
  :attr:`DirectoryWatcher.recent_limit` names and about 32 KiB; a burst larger than that inside
  the window shrinks the window instead of emitting anything twice;
- a file rewritten in place gets a newer mtime and is emitted again, as a new version.

``min_age`` defers files modified less than that many seconds ago, so a file still being
written is emitted once it has settled (with its final size).

The new files of a scan are committed ``batch_size`` at a time, each group as one
:class:`~watchkeeper.triggerer.TriggerEventBatch` (its events and the state after the last of
them, in one transaction).
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._common import (
    SerializedEquality,
    check_non_negative,
    check_positive,
    check_positive_int,
    check_str,
    sleep_jittered,
    sleep_spread,
)
from ._window_state import WindowState

__all__ = ["DirectoryWatcher"]

log = get_logger(__name__)

_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class _File:
    mtime_ns: int
    name: str
    size: int


def _scan(path: str, pattern: str, min_age_ns: int) -> list[_File] | None:
    """List the matching regular files, oldest first; ``None`` when the directory is missing.

    Runs in a worker thread: ``scandir`` and ``stat`` block.
    """
    cutoff = time.time_ns() - min_age_ns if min_age_ns else None
    files: list[_File] = []
    try:
        entries = os.scandir(path)
    except FileNotFoundError:
        return None
    with entries:
        for entry in entries:
            if not fnmatch.fnmatchcase(entry.name, pattern):
                continue
            try:
                if not entry.is_file():
                    continue
                stat = entry.stat()
            except FileNotFoundError:
                continue  # removed between the listing and the stat
            if cutoff is not None and stat.st_mtime_ns > cutoff:
                continue  # still settling; a later scan takes it
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:
                continue  # a name that is not UTF-8 cannot travel in JSON state
            files.append(_File(stat.st_mtime_ns, entry.name, stat.st_size))
    files.sort(key=lambda f: (f.mtime_ns, f.name))
    return files


class DirectoryWatcher(SerializedEquality):
    """Yields one event per new file in ``path`` whose name matches the glob ``pattern``.

    The payload is ``{"path", "name", "size", "mtime", "mtime_ns"}`` (``mtime`` in seconds since
    the epoch). The events of a scan commit with the watcher's state, at most ``batch_size``
    per transaction (a :class:`~watchkeeper.triggerer.TriggerEventBatch`), so a restarted
    watcher neither misses nor repeats a file. On the first run (no watermark yet) every file
    already present is emitted.

    ``pattern`` matches names inside ``path`` (case-sensitively, no subdirectories).
    ``poll_interval`` seconds separate scans, with jitter. ``lag_window`` seconds behind the
    watermark are searched for late files; ``min_age`` seconds must pass after a file's last
    modification before it is emitted. A missing directory is waited for (and logged once).

    State keys (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name; the layout
    is the one of every lag-window watcher, see :mod:`._window_state`):

    - ``<name>.watermark``: ``{"kind": "int", "cursor": <mtime in ns>, "key": <file name>}``,
      the last file emitted;
    - ``<name>.recent``: ``{"floor", "cursors", "keys"}``, the names (and mtimes) emitted inside
      the lag window.

    How to rewind it: stop the watcher, set ``<name>.watermark`` to
    ``{"kind": "int", "cursor": M, "key": N}`` and ``<name>.recent`` to
    ``{"floor": M, "cursors": [], "keys": []}``, start it again: it emits the files after
    ``(M, N)`` in (mtime, name) order. Delete both keys to emit every file present again. The
    keys ``watermark``/``recent`` of earlier versions are adopted once, when the watcher has
    none of its own.
    """

    recent_limit: int = 1000
    """At most this many recently emitted names are kept in the state."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        pattern: str = "*",
        poll_interval: float = 1.0,
        lag_window: float = 60.0,
        min_age: float = 0.0,
        batch_size: int = 500,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.path: str = check_str(
            owner, "path", os.fspath(path) if isinstance(path, os.PathLike) else path
        )
        self.pattern: str = check_str(owner, "pattern", pattern)
        if "/" in pattern or os.sep in pattern:
            raise ValueError(
                f"{owner}: pattern {pattern!r} must match file names, not paths (no '/')"
            )
        check_positive(owner, "poll_interval", poll_interval)
        check_non_negative(owner, "lag_window", lag_window)
        check_non_negative(owner, "min_age", min_age)
        self.poll_interval = poll_interval
        self.lag_window = lag_window
        self.min_age = min_age
        self.batch_size = check_positive_int(owner, "batch_size", batch_size)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "path": self.path,
            "pattern": self.pattern,
            "poll_interval": self.poll_interval,
            "lag_window": self.lag_window,
            "min_age": self.min_age,
            "batch_size": self.batch_size,
        }

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        lag_ns = round(self.lag_window * _NS)
        state: WindowState[int, str] = WindowState(
            f"{type(self).__name__}({self.path!r})",
            type(self).__name__,
            self.watcher_name,
            lower=lambda mtime_ns: mtime_ns - lag_ns,
            size_of=lambda _mtime_ns, name: len(name.encode()) + 26,
            max_keys=self.recent_limit,
            kinds=("int",),
            key_types=(str,),
            legacy=_legacy,
        )
        window = await state.aload(self.asset_state_store)
        min_age_ns = round(self.min_age * _NS)
        reported_missing = False
        await sleep_spread(self.poll_interval)
        while True:
            files = await anyio.to_thread.run_sync(_scan, self.path, self.pattern, min_age_ns)
            if files is None:
                if not reported_missing:
                    log.warning("directory_missing", path=self.path)
                    reported_missing = True
                files = []
            else:
                reported_missing = False
            events: list[TriggerEvent] = []
            for file in files:
                if not window.accepts(file.mtime_ns, file.name):
                    continue
                if not window.is_new(file.mtime_ns, file.name):
                    log.info("late_file", path=self.path, name=file.name, mtime_ns=file.mtime_ns)
                window.record(file.mtime_ns, file.name)
                events.append(TriggerEvent(self._payload(file)))
                if len(events) == self.batch_size:
                    yield TriggerEventBatch(events, state=state.state(window))
                    events = []
            if events:
                yield TriggerEventBatch(events, state=state.state(window))
            await sleep_jittered(self.poll_interval)

    def _payload(self, file: _File) -> dict[str, Any]:
        return {
            "path": os.path.join(self.path, file.name),
            "name": file.name,
            "size": file.size,
            "mtime": file.mtime_ns / _NS,
            "mtime_ns": file.mtime_ns,
        }


def _legacy(watermark: Any, recent: Any) -> tuple[Any, Any]:
    """The state of earlier versions (``watermark``/``recent``) in the shared layout."""
    recent = recent or {"floor": None, "names": [], "mtimes_ns": []}
    return (
        {"kind": "int", "cursor": watermark["mtime_ns"], "key": watermark["name"]},
        {"floor": recent["floor"], "cursors": recent["mtimes_ns"], "keys": recent["names"]},
    )
