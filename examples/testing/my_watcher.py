"""A user-written watermark watcher: emits one asset event per new order of an orders feed.

The feed answers ``poll(after=cursor, limit=n)`` with the orders whose sequence number is past
the cursor, like a REST API or a table read by id. In production it would be your API client;
in the tests next to this file it is a :class:`~watchkeeper.triggerer.testing.FakeEventSource`,
and the watcher keeps only the feed's address, so it serializes to JSON and a restarted daemon
can rebuild it.

The watcher stores its watermark with ``TriggerEvent(state=...)``: the event and the watermark
that produced it commit in one transaction, so a crash at any point neither loses an order
(the watermark never runs ahead of its event) nor emits one twice (it never lags behind).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
from watchkeeper.triggerer.testing import FakeEventSource


class OrdersWatcher(BaseEventTrigger):
    """Polls the feed at ``feed`` every ``interval`` seconds, resuming from its watermark."""

    def __init__(self, feed: str, batch_size: int = 100, interval: float = 0.01) -> None:
        super().__init__()
        self.feed = feed
        self.batch_size = batch_size
        self.interval = interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "feed": self.feed,
            "batch_size": self.batch_size,
            "interval": self.interval,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watermark: int = await self.asset_state_store.aget("watermark", 0)
        async with FakeEventSource.connect(self.feed) as feed:
            while True:
                batch = await feed.poll(after=watermark, limit=self.batch_size)
                # A feed may repeat an item or answer out of order: take each new one once,
                # in sequence order.
                for item in sorted(batch, key=lambda item: item.seq):
                    if item.seq <= watermark:
                        continue  # already emitted
                    watermark = item.seq
                    yield TriggerEvent(
                        {"order": item.payload, "seq": item.seq},
                        state={"watermark": watermark},
                    )
                if len(batch) < self.batch_size:
                    await anyio.sleep(self.interval)
