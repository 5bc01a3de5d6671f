"""Where a watcher's lag window lives in the asset state: one key layout, under its name.

Every lag-window watcher (see :mod:`._window`) keeps two keys in each watched asset's state,
prefixed with the name it runs under (``self.watcher_name``, the ``AssetWatcher``'s name), so
two watchers of one asset never share a key:

``<watcher name>.watermark``
    ``{"kind": "int", "cursor": 1700000000000000000, "key": "b.csv"}``: the greatest item
    emitted, as ``(cursor, key)``. ``kind`` is the cursor's type (``int``, ``float``, ``str``,
    or ``datetime``, stored as ISO 8601 text).
``<watcher name>.recent``
    ``{"floor": null, "cursors": [...], "keys": [...]}``: the items emitted inside the lag
    window (``cursors[i]`` is the cursor of ``keys[i]``), and the floor the window shrank to
    after an overflow (``null`` when it did not).

Both are written with every event (``TriggerEvent(state=...)``), so they always describe the
last committed event. To rewind a watcher, stop it (a running watcher keeps its position in
memory and writes it with its next event), set ``<name>.watermark`` to the item ``(C, K)`` it
should resume after and ``<name>.recent`` to ``{"floor": C, "cursors": [], "keys": []}``, and
start it again: it emits the items after ``(C, K)``. (Deleting ``<name>.recent`` instead also
re-reads the lag window behind ``C``.) To start over, delete both keys.

**Migration.** Before the keys were namespaced, both watchers wrote ``watermark`` and
``recent`` (the directory watcher with the fields ``mtime_ns``/``name`` and
``mtimes_ns``/``names``). A watcher that finds none of its own keys on any watched asset adopts
those old keys when they parse as its own kind of state (log ``watcher_state_migrated``), so it
resumes where it stopped; its first event then writes the new keys. A value that does not parse
is another watcher's (or a task's) and is left alone (log ``legacy_state_ignored``).

The watcher leaves the old keys in place. An event's state can write keys but not delete them,
so removing them would take a second write after the event; and watchers that shared them
before the upgrade (the collision the names fix) each need to read them once: one that found
them gone would start over and emit everything again. Delete them yourself once every watcher
of the asset has committed an event under its name (``watchkeeper state-store delete --asset
NAME watermark``, then ``recent``). Until then, deleting a watcher's new keys makes it adopt
the old ones again instead of starting over.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from watchkeeper.store import AssetStateStoreAccessors
from watchkeeper.store.protocols import get_logger

from ._window import LagWindow

__all__ = ["LEGACY_KEYS", "MAX_RECENT_BYTES", "WindowState"]

log = get_logger(__name__)

C = TypeVar("C")
K = TypeVar("K")

LEGACY_KEYS = ("watermark", "recent")
"""The keys every watcher shared before they were namespaced."""

Legacy = Callable[[Any, Any], tuple[Any, Any]]
"""Turns an old ``(watermark, recent)`` pair into this layout's; raises when it is not one."""

MAX_RECENT_BYTES = 32 * 1024
"""About how many bytes of JSON the recent items of one window may take in the state."""


def _cursor_kind(cursor: object) -> str:
    """The ``kind`` stored next to a cursor, so its JSON form decodes to the same type."""
    if isinstance(cursor, dt.datetime):
        return "datetime"
    if isinstance(cursor, bool) or not isinstance(cursor, int | float | str):
        raise TypeError(f"a cursor is an int, float, str or datetime, got {cursor!r}")
    return type(cursor).__name__


def _encode_cursor(cursor: Any) -> Any:
    """A cursor's JSON form: itself, or ISO 8601 text for a datetime."""
    return cursor.isoformat() if isinstance(cursor, dt.datetime) else cursor


def _decode_cursor(kind: object, value: object) -> Any:
    if kind == "datetime":
        if not isinstance(value, str):
            raise TypeError(f"a datetime cursor is stored as ISO text, got {value!r}")
        return dt.datetime.fromisoformat(value)
    if isinstance(value, bool):
        raise TypeError(f"a {kind} cursor cannot be {value!r}")
    if kind == "int" and isinstance(value, int):
        return value
    if kind == "float" and isinstance(value, int | float) and math.isfinite(value):
        return value
    if kind == "str" and isinstance(value, str):
        return value
    if kind not in {"int", "float", "str"}:
        raise ValueError(f"unknown cursor kind {kind!r}")
    raise TypeError(f"a {kind} cursor cannot be {value!r}")


class WindowState(Generic[C, K]):
    """The two state keys of one watcher's lag window: reading them at start, writing them.

    ``owner`` names the watcher in errors (``DirectoryWatcher('/in')``), ``what`` its class.
    ``lower``, ``size_of`` and ``max_keys`` shape its :class:`LagWindow` (at most
    :data:`MAX_RECENT_BYTES` of recent items). ``kinds`` and ``key_types`` are the cursor kinds
    and key types the watcher stores; ``legacy`` reads its state from before the keys were
    namespaced (None: the layout was already this one).
    """

    __slots__ = (
        "_key_types",
        "_kinds",
        "_legacy",
        "_lower",
        "_max_keys",
        "_reported_overflow",
        "_size_of",
        "owner",
        "recent_key",
        "watcher_name",
        "watermark_key",
        "what",
    )

    def __init__(
        self,
        owner: str,
        what: str,
        watcher_name: str,
        *,
        lower: Callable[[C], C],
        size_of: Callable[[C, K], int],
        max_keys: int,
        kinds: Sequence[str],
        key_types: tuple[type, ...],
        legacy: Legacy | None = None,
    ) -> None:
        self.owner = owner
        self.what = what
        self.watcher_name = watcher_name
        self.watermark_key = f"{watcher_name}.watermark"
        self.recent_key = f"{watcher_name}.recent"
        self._lower = lower
        self._size_of = size_of
        self._max_keys = max_keys
        self._reported_overflow = False
        self._kinds = tuple(kinds)
        self._key_types = key_types
        self._legacy = legacy

    def __repr__(self) -> str:
        return f"<WindowState {self.watermark_key!r} {self.recent_key!r}>"

    async def aload(self, store: AssetStateStoreAccessors) -> LagWindow[C, K]:
        """The window to resume from: the most advanced one stored on the watched assets.

        Identical triggers watching several assets commit the same state to each, so the
        assets normally agree; one attached later has none yet (it receives events from then
        on, not the history). Without a window of its own anywhere, the watcher adopts the
        legacy keys (see the module's docstring); without those, it starts from nothing.
        """
        own = await self._read(store, self.watermark_key, self.recent_key)
        windows = [
            self._decode(watermark, recent) for _, watermark, recent in own if watermark is not None
        ]
        if not windows:
            windows = self._adopt(await self._read(store, *LEGACY_KEYS))
        best: LagWindow[C, K] | None = None
        for window in windows:
            if best is None or _ahead(window, best):
                best = window
        return best if best is not None else self.new_window()

    def new_window(
        self,
        watermark: tuple[C, K] | None = None,
        recent: Sequence[tuple[C, K]] = (),
        floor: C | None = None,
    ) -> LagWindow[C, K]:
        """A window of this watcher, empty or at the given position."""
        return LagWindow(
            lower=self._lower,
            size_of=self._size_of,
            max_keys=self._max_keys,
            max_bytes=MAX_RECENT_BYTES,
            encode=_encode_cursor,
            watermark=watermark,
            recent=recent,
            floor=floor,
        )

    def state(self, window: LagWindow[C, K]) -> dict[str, Any]:
        """The state an event commits: both keys, describing ``window`` after that event.

        The first time the window overflowed (and shrank), ``lag_window_overflow`` is logged.
        """
        assert window.watermark is not None  # recorded before every event
        if window.overflowed and not self._reported_overflow:
            self._reported_overflow = True
            log.warning(
                "lag_window_overflow",
                watcher=self.watcher_name,
                source=self.owner,
                limit=window.max_keys,
            )
        cursor, key = window.watermark
        return {
            self.watermark_key: {
                "kind": _cursor_kind(cursor),
                "cursor": _encode_cursor(cursor),
                "key": key,
            },
            self.recent_key: {
                "floor": None if window.floor is None else _encode_cursor(window.floor),
                "cursors": window.encoded_cursors(),
                "keys": window.keys(),
            },
        }

    # -- reading ---------------------------------------------------------------------------------

    @staticmethod
    async def _read(
        store: AssetStateStoreAccessors, watermark_key: str, recent_key: str
    ) -> list[tuple[str, Any, Any]]:
        found: list[tuple[str, Any, Any]] = []
        for asset in store:
            accessor = store[asset]
            watermark = await accessor.aget(watermark_key)
            recent = await accessor.aget(recent_key) if watermark is not None else None
            found.append((asset.name, watermark, recent))
        return found

    def _adopt(self, legacy: list[tuple[str, Any, Any]]) -> list[LagWindow[C, K]]:
        windows: list[LagWindow[C, K]] = []
        for asset, watermark, recent in legacy:
            if watermark is None:
                continue
            try:
                if self._legacy is not None:
                    watermark, recent = self._legacy(watermark, recent)
                windows.append(self._parse(watermark, recent))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning(
                    "legacy_state_ignored",
                    watcher=self.watcher_name,
                    asset=asset,
                    key=LEGACY_KEYS[0],
                    reason=f"not a {self.what} watermark: {exc}",
                )
                continue
            log.info(
                "watcher_state_migrated",
                watcher=self.watcher_name,
                asset=asset,
                keys=list(LEGACY_KEYS),
                to=[self.watermark_key, self.recent_key],
            )
        return windows

    def _decode(self, watermark: Any, recent: Any) -> LagWindow[C, K]:
        try:
            return self._parse(watermark, recent)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{self.owner}: the asset state {self.watermark_key!r}/{self.recent_key!r} is "
                f"not a {self.what} watermark ({watermark!r}): {exc}"
            ) from exc

    def _parse(self, watermark: Any, recent: Any) -> LagWindow[C, K]:
        kind = watermark["kind"]
        if kind not in self._kinds:
            raise ValueError(f"a cursor of kind {kind!r} (expected {' or '.join(self._kinds)})")
        if recent is None:
            recent = {"floor": None, "cursors": [], "keys": []}
        floor = recent["floor"]
        return self.new_window(
            (_decode_cursor(kind, watermark["cursor"]), self._key(watermark["key"])),
            [
                (_decode_cursor(kind, cursor), self._key(key))
                for cursor, key in zip(recent["cursors"], recent["keys"], strict=True)
            ],
            None if floor is None else _decode_cursor(kind, floor),
        )

    def _key(self, key: object) -> Any:
        if isinstance(key, bool) or not isinstance(key, self._key_types):
            raise TypeError(f"a key cannot be {key!r}")
        return key


def _ahead(window: LagWindow[Any, Any], other: LagWindow[Any, Any]) -> bool:
    if window.watermark is None or other.watermark is None:
        return other.watermark is None and window.watermark is not None
    return bool(window.watermark > other.watermark)
