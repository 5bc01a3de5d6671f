"""A Redis stream watcher's position: stream ids, the watermark while running, the stored one."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from watchkeeper.store.protocols import get_logger

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from .redis_stream import RedisStreamWatcher

__all__ = ["Position", "StreamId", "format_id", "parse_id", "stored_watermark"]

log = get_logger("watchkeeper.watchers.redis_stream")

StreamId = tuple[int, int]

_ID = re.compile(r"(\d+)-(\d+)")


def parse_id(value: str | bytes) -> StreamId:
    """``"1700000000000-3"`` as ``(1700000000000, 3)``: ids compare as integers, never as text."""
    text = value.decode() if isinstance(value, bytes) else value
    match = _ID.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Redis stream id (<ms>-<seq>)")
    return int(match.group(1)), int(match.group(2))


def format_id(value: StreamId) -> str:
    return f"{value[0]}-{value[1]}"


class Position:
    """The watermark while running: the last entry's id, and the stream's count up to it."""

    __slots__ = ("entries_read", "last", "reported_gap")

    def __init__(self, last: StreamId, entries_read: int | None) -> None:
        self.last = last
        self.entries_read = entries_read
        self.reported_gap = False

    @classmethod
    async def start(
        cls, client: Redis, watcher: RedisStreamWatcher, stored: dict[str, Any] | None
    ) -> Position:
        if stored is not None:
            return cls(parse_id(stored["id"]), stored.get("entries_read"))
        if watcher.params.start != "$":
            start = (
                watcher.params.start if "-" in watcher.params.start else f"{watcher.params.start}-0"
            )
            begin = parse_id(start)
            return cls(begin, 0 if begin == (0, 0) else None)
        if not await client.exists(watcher.params.stream):
            return cls((0, 0), 0)
        info = await client.xinfo_stream(watcher.params.stream)
        return cls(parse_id(info["last-generated-id"]), info.get("entries-added"))

    def state(self) -> dict[str, Any]:
        return {"id": format_id(self.last), "entries_read": self.entries_read}

    def advance(self, raw_id: bytes | str) -> str:
        """Move past the entry ``raw_id`` (the next one read); return its id as text."""
        self.last = parse_id(raw_id)
        if self.entries_read is not None:
            self.entries_read += 1
        return format_id(self.last)

    def observe(
        self,
        watcher: RedisStreamWatcher,
        entries: list[tuple[bytes, Any]],
        info: dict[str, Any] | None,
    ) -> None:
        """Compare one read with the stream's counters taken in the same transaction: report
        the entries removed before they were read, and learn the count once at the tail."""
        if info is None:
            return
        added = info.get("entries-added")
        length = info.get("length")
        first = info.get("first-entry")
        last = info.get("last-entry")
        if not isinstance(added, int) or not isinstance(length, int):
            return  # Redis before 7 has no entries-added
        if not entries:
            if self.entries_read is None and last and parse_id(last[0]) == self.last:
                self.entries_read = added
            return
        first_read = parse_id(entries[0][0])
        if self.entries_read is not None and first and parse_id(first[0]) == first_read:
            # The stream now starts at the first entry this read returned: every entry added
            # before it (added - length of them) is gone. Those past our count were never read.
            lost = added - length - self.entries_read
            if lost > 0:
                log.warning(
                    "redis_stream_gap",
                    stream=watcher.params.stream,
                    watcher=watcher.watcher_name,
                    after=format_id(self.last),
                    before=format_id(first_read),
                    lost=lost,
                )
                self.entries_read += lost
        elif self.entries_read is None and last and parse_id(last[0]) == parse_id(entries[-1][0]):
            # The read reached the tail: the count up to its last entry is entries-added.
            self.entries_read = added - len(entries)


async def stored_watermark(store: Any, key: str, owner: str) -> dict[str, Any] | None:
    """The most advanced watermark stored on the watched assets (None when there is none)."""
    best: dict[str, Any] | None = None
    for asset in store:
        value = await store[asset].aget(key)
        if value is None:
            continue
        try:
            if not isinstance(value, dict):
                raise TypeError("not an object")
            parse_id(value["id"])
            read = value.get("entries_read")
            if read is not None and (isinstance(read, bool) or not isinstance(read, int)):
                raise TypeError(f"entries_read is {read!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{owner}: the asset state {key!r} is not a Redis stream watermark "
                f"({value!r}): {exc}"
            ) from exc
        if best is None or parse_id(value["id"]) > parse_id(best["id"]):
            best = value
    return best
