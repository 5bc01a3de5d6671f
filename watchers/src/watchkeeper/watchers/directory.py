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
- the recently emitted names travel in the state (key ``"recent"``), at most
  :attr:`DirectoryWatcher.recent_limit` names and about 32 KiB; a burst larger than that inside
  the window shrinks the window instead of emitting anything twice;
- a file rewritten in place gets a newer mtime and is emitted again, as a new version.

``min_age`` defers files modified less than that many seconds ago, so a file still being
written is emitted once it has settled (with its final size).
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
from watchkeeper.store import get_logger
from watchkeeper.triggerer import TriggerEvent

from ._common import (
    SerializedEquality,
    check_non_negative,
    check_positive,
    check_str,
    read_states,
    sleep_jittered,
    sleep_spread,
)
from ._window import LagWindow

__all__ = ["DirectoryWatcher"]

log = get_logger(__name__)

_STATE_KEYS = ("watermark", "recent")
_MAX_RECENT_BYTES = 32 * 1024
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
    the epoch). Each event carries ``state={"watermark": {"mtime_ns", "name"}, "recent": ...}``,
    committed with the event, so a restarted watcher neither misses nor repeats a file. On the
    first run (no watermark yet) every file already present is emitted.

    ``pattern`` matches names inside ``path`` (case-sensitively, no subdirectories).
    ``poll_interval`` seconds separate scans, with jitter. ``lag_window`` seconds behind the
    watermark are searched for late files; ``min_age`` seconds must pass after a file's last
    modification before it is emitted. A missing directory is waited for (and logged once).
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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "path": self.path,
            "pattern": self.pattern,
            "poll_interval": self.poll_interval,
            "lag_window": self.lag_window,
            "min_age": self.min_age,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        window = self._load_window(await read_states(self.asset_state_store, _STATE_KEYS))
        min_age_ns = round(self.min_age * _NS)
        reported_missing = False
        reported_overflow = False
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
            for file in files:
                if not window.accepts(file.mtime_ns, file.name):
                    continue
                if not window.is_new(file.mtime_ns, file.name):
                    log.info("late_file", path=self.path, name=file.name, mtime_ns=file.mtime_ns)
                window.record(file.mtime_ns, file.name)
                if window.overflowed and not reported_overflow:
                    log.warning("lag_window_overflow", path=self.path, limit=self.recent_limit)
                    reported_overflow = True
                yield TriggerEvent(self._payload(file), state=self._state(window))
            await sleep_jittered(self.poll_interval)

    def _payload(self, file: _File) -> dict[str, Any]:
        return {
            "path": os.path.join(self.path, file.name),
            "name": file.name,
            "size": file.size,
            "mtime": file.mtime_ns / _NS,
            "mtime_ns": file.mtime_ns,
        }

    # -- state ---------------------------------------------------------------------------------

    def _new_window(
        self,
        watermark: tuple[int, str] | None = None,
        recent: list[tuple[int, str]] | None = None,
        floor: int | None = None,
    ) -> LagWindow[int, str]:
        lag_ns = round(self.lag_window * _NS)
        return LagWindow(
            lower=lambda mtime_ns: mtime_ns - lag_ns,
            size_of=lambda _mtime_ns, name: len(name.encode()) + 26,
            max_keys=self.recent_limit,
            max_bytes=_MAX_RECENT_BYTES,
            watermark=watermark,
            recent=recent or (),
            floor=floor,
        )

    def _load_window(self, states: list[dict[str, Any]]) -> LagWindow[int, str]:
        best: LagWindow[int, str] | None = None
        for state in states:
            watermark = state.get("watermark")
            if watermark is None:
                continue
            recent = state.get("recent") or {"floor": None, "names": [], "mtimes_ns": []}
            try:
                window = self._new_window(
                    _item(watermark["mtime_ns"], watermark["name"]),
                    [
                        _item(mtime_ns, name)
                        for mtime_ns, name in zip(recent["mtimes_ns"], recent["names"], strict=True)
                    ],
                    None if recent["floor"] is None else _item(recent["floor"], "")[0],
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"{type(self).__name__}({self.path!r}): the asset state 'watermark'/"
                    f"'recent' is not a DirectoryWatcher watermark ({watermark!r}): {exc}"
                ) from exc
            if best is None or _ahead(window, best):
                best = window
        return best if best is not None else self._new_window()

    def _state(self, window: LagWindow[int, str]) -> dict[str, Any]:
        assert window.watermark is not None  # recorded before every event
        mtime_ns, name = window.watermark
        return {
            "watermark": {"mtime_ns": mtime_ns, "name": name},
            "recent": {
                "floor": window.floor,
                "names": window.keys(),
                "mtimes_ns": window.encoded_cursors(),
            },
        }


def _item(mtime_ns: object, name: object) -> tuple[int, str]:
    if isinstance(mtime_ns, bool) or not isinstance(mtime_ns, int) or not isinstance(name, str):
        raise TypeError(f"expected (int, str), got ({mtime_ns!r}, {name!r})")
    return mtime_ns, name


def _ahead(window: LagWindow[int, str], other: LagWindow[int, str]) -> bool:
    if window.watermark is None or other.watermark is None:
        return other.watermark is None and window.watermark is not None
    return window.watermark > other.watermark
