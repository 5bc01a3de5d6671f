"""The lag window: what a watcher emitted just behind its watermark, so late items come once.

A watermark watcher orders its items by ``(cursor, key)`` (a file's modification time and name,
a row's cursor column and primary key) and remembers the greatest item it emitted. An item above
the watermark is *new*. An item at or below it is *late*: it appeared after the watcher had
moved past its position (a transaction that took its id earlier and committed later, a file
copied with a preserved modification time, a second file with the same timestamp written
during the scan). Late items are caught inside a window behind the watermark: the window starts
at ``lower(watermark cursor)``, and a late item inside it is emitted unless its key is among the
keys recently emitted.

The set of recent keys is what makes this exactly-once, so it travels in the state of every
event, and so it must stay small: at most ``max_keys`` keys and about ``max_bytes`` of JSON.
When a burst overflows it, the keys of the oldest cursor value are forgotten together and the
*floor* rises to that cursor; late items at or below the floor are then no longer emitted (the
window shrinks rather than emit anything twice). Items below the window are never emitted: that
is the bound on how late an item may be.

Only cursors are compared to the floor and the window's start, never keys: a database may order
text keys by a collation that Python does not know, so what is *new* may also be decided by the
caller (``record(..., new=True)`` for rows a ``(cursor, key) > watermark`` query returned).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["LagWindow"]

C = TypeVar("C")  # the cursor: an int, float, datetime or str
K = TypeVar("K", bound=Hashable)  # the key: unique per item


class LagWindow(Generic[C, K]):
    """The watermark, the recently emitted keys inside the window, and the floor.

    ``lower(cursor)`` returns the first cursor inside the window that ends at ``cursor``;
    ``encode(cursor)`` its JSON form; ``size_of(cursor, key)`` estimates the JSON bytes one
    remembered item costs. Items are kept in the order they were emitted (oldest first in the
    usual case), so pruning and the state written with every event cost no sort.
    """

    __slots__ = (
        "_bytes",
        "_encode",
        "_encoded",
        "_lower",
        "_recent",
        "_size_of",
        "floor",
        "max_bytes",
        "max_keys",
        "overflowed",
        "watermark",
    )

    def __init__(
        self,
        *,
        lower: Callable[[C], C],
        size_of: Callable[[C, K], int],
        max_keys: int,
        max_bytes: int,
        encode: Callable[[C], Any] = lambda cursor: cursor,
        watermark: tuple[C, K] | None = None,
        recent: Iterable[tuple[C, K]] = (),
        floor: C | None = None,
    ) -> None:
        self._lower = lower
        self._size_of = size_of
        self._encode = encode
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.watermark = watermark
        self.floor = floor
        self.overflowed = False
        self._recent: OrderedDict[K, C] = OrderedDict()
        self._encoded: OrderedDict[K, tuple[Any, int]] = OrderedDict()  # JSON form, size
        self._bytes = 0
        for cursor, key in sorted(recent, key=_order):
            self._remember(cursor, key)
        self._prune()

    def __repr__(self) -> str:
        return (
            f"<LagWindow watermark={self.watermark!r} floor={self.floor!r} "
            f"recent={len(self._recent)}>"
        )

    @property
    def low(self) -> C | None:
        """The first cursor inside the window, or ``None`` before the first item."""
        if self.watermark is None:
            return None
        return self._lower(self.watermark[0])

    def is_new(self, cursor: C, key: K) -> bool:
        """True when the item lies above the watermark."""
        return self.watermark is None or _above((cursor, key), self.watermark)

    def is_late(self, cursor: C, key: K) -> bool:
        """True when the item lies at or below the watermark, inside the window, not yet seen."""
        low = self.low
        if low is None or self.is_new(cursor, key):
            return False
        if _lt(cursor, low):
            return False
        if self.floor is not None and not _lt(self.floor, cursor):
            return False
        return key not in self._recent

    def accepts(self, cursor: C, key: K) -> bool:
        """True when the item must be emitted: it is new, or late and unseen."""
        return self.is_new(cursor, key) or self.is_late(cursor, key)

    def record(self, cursor: C, key: K, *, new: bool | None = None) -> None:
        """Note that the item was emitted: advance the watermark, remember the key, prune.

        ``new`` says whether the item lies above the watermark; ``None`` compares in Python.
        """
        if new is None:
            new = self.is_new(cursor, key)
        if new:
            self.watermark = (cursor, key)
        self._remember(cursor, key)
        self._prune()

    def record_many(self, items: Iterable[tuple[C, K]], *, new: bool) -> None:
        """Note that ``items`` were emitted together, in order, pruning once at the end.

        ``new`` says whether they lie above the watermark (each above the one before). The
        window ends accepting exactly what :meth:`record` called for each item would leave it
        accepting: the same watermark and floor, the same keys remembered inside the window
        above the floor. It may drop sooner a key below the window's start or at the floor
        (never accepted again either way), and an overflow that only the middle of the batch
        would have met goes unnoticed: a batch commits one state, its end's.
        """
        batch = list(items)
        if new and batch:
            self.watermark = batch[-1]
        low = self.low  # where the window starts once the batch is recorded
        recent, remember = self._recent, self._remember
        for cursor, key in batch:
            if low is not None and _lt(cursor, low):
                # Behind the window at the batch's end: never accepted again, so not kept
                # (a backfill remembers only its last lag window, not every row).
                if key in recent:
                    self._forget(key)
                continue
            remember(cursor, key)
        self._prune()

    def keys(self) -> list[K]:
        """The remembered keys (every key emitted inside the window above the floor)."""
        return list(self._recent)

    def encoded_cursors(self) -> list[Any]:
        """The JSON forms of the remembered keys' cursors, in the order of :meth:`keys`."""
        return [encoded for encoded, _ in self._encoded.values()]

    def items(self) -> list[tuple[C, K]]:
        """The remembered ``(cursor, key)`` items, in the order they were emitted."""
        return [(cursor, key) for key, cursor in self._recent.items()]

    def _remember(self, cursor: C, key: K) -> None:
        if key in self._recent:
            self._forget(key)
        self._recent[key] = cursor
        size = self._size_of(cursor, key)
        self._encoded[key] = (self._encode(cursor), size)
        self._bytes += size

    def _forget(self, key: K) -> C:
        cursor = self._recent.pop(key)
        self._bytes -= self._encoded.pop(key)[1]
        return cursor

    def _over(self) -> bool:
        return len(self._recent) > self.max_keys or self._bytes > self.max_bytes

    def _prune(self) -> None:
        low = self.low
        if low is None:
            return
        # The oldest items sit at the front: drop those that left the window (amortized O(1)).
        while self._recent:
            key, cursor = next(iter(self._recent.items()))
            if not _lt(cursor, low):
                break
            self._forget(key)
        if self.floor is not None and _lt(self.floor, low):
            self.floor = None  # the window's own start is the stricter bound now
        if not self._over():
            return
        # A late item sits behind newer ones; sweep the whole window before forgetting anything
        # still inside it.
        for key in [key for key, cursor in self._recent.items() if _lt(cursor, low)]:
            self._forget(key)
        while self._recent and self._over():
            oldest = min(self._recent.values(), key=_order)
            for key in [key for key, cursor in self._recent.items() if not _lt(oldest, cursor)]:
                self._forget(key)
            if self.floor is None or _lt(self.floor, oldest):
                self.floor = oldest
            self.overflowed = True


def _order(item: Any) -> Any:
    return item


def _lt(left: Any, right: Any) -> bool:
    return bool(left < right)


def _above(item: tuple[Any, Any], other: tuple[Any, Any]) -> bool:
    return bool(item > other)
