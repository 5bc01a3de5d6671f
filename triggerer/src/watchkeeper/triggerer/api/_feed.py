"""The live event streams' shared reads: one read and one encoding per batch, for every client.

Every Server-Sent Events client of the same filter (every event, or one asset's) is served from
one :class:`EventFeed`: when new events are due, one client (whichever asks first) reads the
next batch from the store's event log and encodes it into frames; the others wait for that read
and take the same bytes. So N clients cost one query and one encoding per batch, and nothing is
done on the commit path: the writer never waits for a stream.

The feed keeps the frames of the last ``keep`` events it read: every event with ``base < id <=
position``, in id order (event ids are commit order on every backend, so reading after a
position misses nothing). A new feed starts at the log's head, whoever its first client is; a
client whose position is older than ``base`` (resumed with an old ``Last-Event-ID``, or slower
than the feed) reads from the log on its own until it catches up, so no client's position moves
the feed another client waits on.
"""

from __future__ import annotations

import time
from bisect import bisect_right

import anyio
from watchkeeper.store import StoreUnavailableError
from watchkeeper.store.protocols import EventLog, redact_secrets

__all__ = ["SSE_BATCH", "EventFeed", "encode_frames", "join_frames"]

SSE_BATCH = 2000
"""Events per read of the event log."""


def encode_frames(events: list[tuple[int, str]]) -> list[bytes]:
    """One SSE frame per ``(id, json)``, without its closing blank line, URL passwords masked.

    The batch is joined and masked once; the frames are then cut at their ends (the JSON is one
    line, so a frame holds no blank line, and masking never spans a line).
    """
    text = "\n\n".join([f"id: {i}\nevent: asset_event\ndata: {data}" for i, data in events])
    return redact_secrets(text).encode().split(b"\n\n")


def join_frames(frames: list[bytes]) -> bytes:
    """Frames of :func:`encode_frames` as one chunk of the stream."""
    return b"\n\n".join(frames) + b"\n\n"


class EventFeed:
    """The frames of the events after ``base``, read once for every client of one filter."""

    def __init__(self, events: EventLog, asset: str | None, *, keep: int) -> None:
        self.events = events
        self.asset = asset
        self.keep = keep
        self.base = 0
        self.position = 0
        self.clients = 0
        self._ids: list[int] = []
        self._frames: list[bytes] = []
        self._reading = False
        self._read_at = float("-inf")
        self._more = False  # the last read was a full batch: read again without waiting
        self._changed = anyio.Event()

    def __repr__(self) -> str:
        return (
            f"<EventFeed asset={self.asset!r} base={self.base} position={self.position} "
            f"clients={self.clients}>"
        )

    def start_at(self, position: int) -> None:
        """Set the first position of a feed no read has moved yet: the log's head when it is
        made (never a client's position, which could be far behind or past the head)."""
        if not self._ids and self._read_at == float("-inf"):
            self.base = self.position = position

    def frames_after(self, after: int) -> tuple[bytes, int] | None:
        """The frames held after event ``after`` (``after >= base``) and the last one's id."""
        start = bisect_right(self._ids, after)
        if start == len(self._ids):
            return None
        return join_frames(self._frames[start:]), self._ids[-1]

    async def advance(self, poll: float) -> None:
        """Read the next batch if it is due and no client is reading it; otherwise wait (at
        most ``poll`` seconds) for the read in progress or the next due time."""
        changed = self._changed
        wait = 0.0 if self._more else self._read_at + poll - time.monotonic()
        if self._reading or wait > 0:
            with anyio.move_on_after(poll if self._reading else wait):
                await changed.wait()
            return
        self._reading = True
        try:
            try:
                events = await self.events.alist_events(
                    asset=self.asset, since_id=self.position, limit=SSE_BATCH, raw=True
                )
            except StoreUnavailableError:
                events = []  # the clients keep their places; the next read tries again
            self._read_at = time.monotonic()
            self._more = len(events) == SSE_BATCH
            if events:
                self._append([i for i, _ in events], encode_frames(events))
        finally:
            self._reading = False
            self._changed = anyio.Event()
            changed.set()

    def _append(self, ids: list[int], frames: list[bytes]) -> None:
        self._ids.extend(ids)
        self._frames.extend(frames)
        self.position = ids[-1]
        drop = len(self._ids) - self.keep
        if drop > 0:
            self.base = self._ids[drop - 1]
            del self._ids[:drop]
            del self._frames[:drop]
