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
from pydantic import field_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._common import sleep_jittered, sleep_spread
from ._params import Count, ReadyMadeWatcher, Seconds, SecondsOrZero, Text, WatcherParams
from ._window_state import WindowState

__all__ = ["DirectoryParams", "DirectoryWatcher"]

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


class DirectoryParams(WatcherParams):
    """The parameters of :class:`DirectoryWatcher`."""

    path: Text
    """The directory to watch (a ``str`` or an ``os.PathLike``). A missing directory is
    waited for, and logged once."""
    pattern: Text = "*"
    """A glob matched against the names inside ``path`` (case-sensitively; no ``/``: no
    subdirectories)."""
    poll_interval: Seconds = 1.0
    """Seconds between two scans, with jitter."""
    lag_window: SecondsOrZero = 60.0
    """Seconds behind the watermark searched for late files."""
    min_age: SecondsOrZero = 0.0
    """Seconds that must pass after a file's last modification before it is emitted."""
    batch_size: Count = 500
    """At most this many events per transaction."""

    @field_validator("path", mode="before")
    @classmethod
    def _path_text(cls, value: object) -> object:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("pattern")
    @classmethod
    def _pattern_names_files(cls, value: str) -> str:
        if "/" in value or os.sep in value:
            raise ValueError(f"pattern {value!r} must match file names, not paths (no '/')")
        return value


class DirectoryWatcher(ReadyMadeWatcher[DirectoryParams]):
    """Yields one event per new file in a directory whose name matches a glob.

    The payload is ``{"path", "name", "size", "mtime", "mtime_ns"}`` (``mtime`` in seconds since
    the epoch). The events of a scan commit with the watcher's state, at most ``batch_size``
    per transaction (a :class:`~watchkeeper.triggerer.TriggerEventBatch`), so a restarted
    watcher neither misses nor repeats a file. On the first run (no watermark yet) every file
    already present is emitted.

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

    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = DirectoryParams

    recent_limit: int = 1000
    """At most this many recently emitted names are kept in the state."""

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        lag_ns = round(self.params.lag_window * _NS)
        state: WindowState[int, str] = WindowState(
            f"{type(self).__name__}({self.params.path!r})",
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
        min_age_ns = round(self.params.min_age * _NS)
        reported_missing = False
        await sleep_spread(self.params.poll_interval)
        while True:
            files = await anyio.to_thread.run_sync(
                _scan, self.params.path, self.params.pattern, min_age_ns
            )
            if files is None:
                if not reported_missing:
                    log.warning("directory_missing", path=self.params.path)
                    reported_missing = True
                files = []
            else:
                reported_missing = False
            events: list[TriggerEvent] = []
            for file in files:
                if not window.accepts(file.mtime_ns, file.name):
                    continue
                if not window.is_new(file.mtime_ns, file.name):
                    log.info(
                        "late_file", path=self.params.path, name=file.name, mtime_ns=file.mtime_ns
                    )
                window.record(file.mtime_ns, file.name)
                events.append(TriggerEvent(self._payload(file)))
                if len(events) == self.params.batch_size:
                    yield TriggerEventBatch(events, state=state.state(window))
                    events = []
            if events:
                yield TriggerEventBatch(events, state=state.state(window))
            await sleep_jittered(self.params.poll_interval)

    def _payload(self, file: _File) -> dict[str, Any]:
        return {
            "path": os.path.join(self.params.path, file.name),
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
