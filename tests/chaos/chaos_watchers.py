"""The watchers the kill test runs inside a real ``watchkeeper triggerer`` process.

The test copies this file into the daemon's watchers path (so its classes are importable there
under the module name ``chaos_watchers``) and writes a definitions file next to it. Each watcher
follows a stream of sequence-numbered items from a cross-process
:class:`~watchkeeper.triggerer.testing.FakeEventSource` (a SQLite file the test feeds) and emits
``{"seq": n}`` per item:

- :class:`PollWatcher` ``pattern="state"``: the recommended pattern, the watermark rides on the
  event (``TriggerEvent(payload, state={"watermark": n})``), so both commit together;
- :class:`PollWatcher` ``pattern="airflow"``: Airflow's pattern, ``await
  self.asset_state_store.aset("watermark", n)`` and then a plain ``yield TriggerEvent(payload)``.
  At the items listed in ``pause_at`` it stops right after the ``aset`` and signals the test
  through a file in ``pause_dir``, so the test can kill it exactly there;
- :class:`QueueWatcher`: a push source; each message is yielded with a ``dedup_key`` (and its
  sequence number as ``state``) and acked only after its event committed, ``ack_every``
  messages at a time (as consumers that acknowledge several deliveries at once do). A killed
  consumer's unacked messages are redelivered, among them messages whose event had already
  committed: a suppressed duplicate writes neither event nor state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
from watchkeeper.triggerer.testing import FakeEventSource, SourceItem

IDLE_POLL = 0.005
"""Seconds a poll watcher waits when its source had nothing new."""


class PollWatcher(BaseEventTrigger):
    """Polls ``source`` (a FakeEventSource address) after its watermark; see the module doc."""

    def __init__(
        self,
        source: str,
        pattern: str = "state",
        batch_size: int = 500,
        pause_dir: str | None = None,
        pause_at: list[int] | None = None,
    ) -> None:
        super().__init__()
        if pattern not in ("state", "airflow"):
            raise ValueError(f"pattern must be 'state' or 'airflow', got {pattern!r}")
        self.source = source
        self.pattern = pattern
        self.batch_size = batch_size
        self.pause_dir = pause_dir
        self.pause_at = sorted(pause_at or [])

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "source": self.source,
            "pattern": self.pattern,
            "batch_size": self.batch_size,
            "pause_dir": self.pause_dir,
            "pause_at": self.pause_at,
        }

    async def _pause_here(self, seq: int) -> None:
        """At a pause point not yet used: tell the test, then wait for the SIGKILL."""
        if self.pause_dir is None or seq not in self.pause_at:
            return
        directory = anyio.Path(self.pause_dir)
        if await (directory / f"{seq}.done").exists():
            return
        flag = directory / f"{seq}.paused"
        await (directory / f"{seq}.tmp").write_text(str(seq))
        await (directory / f"{seq}.tmp").rename(flag)
        await anyio.sleep_forever()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = self.asset_state_store
        watermark: int = await store.aget("watermark", 0)
        async with FakeEventSource.connect(self.source) as source:
            while True:
                items = await source.poll(after=watermark, limit=self.batch_size)
                for item in items:
                    if self.pattern == "state":
                        yield TriggerEvent({"seq": item.seq}, state={"watermark": item.seq})
                    else:
                        await store.aset("watermark", item.seq)
                        await self._pause_here(item.seq)
                        yield TriggerEvent({"seq": item.seq})
                    watermark = item.seq
                if not items:
                    await anyio.sleep(IDLE_POLL)


class QueueWatcher(BaseEventTrigger):
    """Listens to ``source``; yields each message with a ``dedup_key`` and acks it once its
    event is durable, in batches of ``ack_every``."""

    def __init__(self, source: str, prefetch: int = 100, ack_every: int = 1) -> None:
        super().__init__()
        if ack_every < 1:
            raise ValueError(f"ack_every must be at least 1, got {ack_every}")
        self.source = source
        self.prefetch = prefetch
        self.ack_every = ack_every

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "source": self.source,
            "prefetch": self.prefetch,
            "ack_every": self.ack_every,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        durable: list[SourceItem] = []  # committed, not acknowledged yet
        async with FakeEventSource.connect(self.source) as source:
            async for message in source.listen(prefetch=self.prefetch):
                yield TriggerEvent(
                    {"seq": message.seq},
                    dedup_key=f"seq-{message.seq}",
                    state={"watermark": message.seq},
                )
                durable.append(message)  # the generator resumes only after the commit
                if len(durable) >= self.ack_every:
                    for done in durable:
                        await source.ack(done)
                    durable.clear()
