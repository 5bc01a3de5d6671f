"""Example watchers: the ``orders`` and ``payments`` tables of an application database.

Each table gets numbered rows (ids 1, 2, 3, ... committed in order by one writer), and each
asset has one watcher that turns every new row into an asset event. The watcher follows the
recommended pattern: it reads its start point from its asset's state, and every event it
yields carries the watermark it advances to, so the event and the watermark commit together.
Kill the daemon at any moment and the restarted watcher continues after the last committed
row: no row is lost and none is emitted twice.

This file ships inside the watchkeeper-triggerer package: ``watchkeeper demo`` copies it into
the watchers path of its temporary directory and points ``WATCHKEEPER_DEMO_SOURCE`` at its fake
source there (``watchkeeper demo --keep`` leaves that directory, with this file, the databases
and the daemon's log, for you to look at).
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent, asset_task

SOURCE = os.environ.get("WATCHKEEPER_DEMO_SOURCE", "demo-source.db")
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SequenceWatcher(BaseEventTrigger):
    """Emits each row of ``table`` in ``source`` (a SQLite file) once, in id order.

    A watermark on the id is safe here because a single writer commits the ids in order; a
    table written by concurrent transactions needs a lag window behind the watermark instead.
    """

    def __init__(
        self, source: str, table: str, poll_interval: float = 0.1, batch_size: int = 100
    ) -> None:
        super().__init__()
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        if poll_interval <= 0 or batch_size <= 0:
            raise ValueError("poll_interval and batch_size must be positive")
        self.source = source
        self.table = table
        self.poll_interval = poll_interval
        self.batch_size = batch_size

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            self.classpath(),
            {
                "source": self.source,
                "table": self.table,
                "poll_interval": self.poll_interval,
                "batch_size": self.batch_size,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # The start point is the watermark committed with the last event (0 the first time).
        watermark = await self.asset_state_store.aget("watermark", default=0)
        while True:
            # sqlite3 blocks, so each read runs in a worker thread; the loop stays free.
            rows = await anyio.to_thread.run_sync(self._rows_after, watermark)
            if not rows:
                await anyio.sleep(self.poll_interval)
                continue
            for row_id, item in rows:
                # The event and its watermark commit in one transaction; the code after
                # ``yield`` runs once both are durable.
                yield TriggerEvent({"n": row_id, "item": item}, state={"watermark": row_id})
                watermark = row_id

    def _rows_after(self, watermark: int) -> list[tuple[int, str]]:
        uri = f"file:{self.source}?mode=ro"  # read-only: never create the source by mistake
        conn = sqlite3.connect(uri, uri=True, timeout=5)
        try:
            query = f"SELECT id, item FROM {self.table} WHERE id > ? ORDER BY id LIMIT ?"
            return [(int(i), str(v)) for i, v in conn.execute(query, (watermark, self.batch_size))]
        finally:
            conn.close()


orders = Asset(
    "orders",
    uri="sqlite://demo/orders",
    watchers=[AssetWatcher("orders_feed", SequenceWatcher(SOURCE, "orders"))],
)

payments = Asset(
    "payments",
    uri="sqlite://demo/payments",
    watchers=[AssetWatcher("payments_feed", SequenceWatcher(SOURCE, "payments"))],
)

order_totals = Asset("order_totals")


@asset_task(schedule=[orders], outlets=[order_totals], retries=10, retry_delay=0.1)
def tally_orders(
    *, triggering_asset_events: dict[Asset, list[Any]], outlet_events: Any, **_: Any
) -> None:
    """A task on the orders events (``watchkeeper worker`` runs it): each run gets the events
    committed since the previous run and emits one ``order_totals`` event. The demo kills the
    worker with SIGKILL while a run is inside this function; the run is tried again, and the
    check at the end proves every orders event was in exactly one successful run."""
    events = triggering_asset_events[orders]
    time.sleep(0.3)  # slow enough for the demo's SIGKILL to land inside a run
    outlet_events[order_totals].extra = {"orders": len(events), "last": events[-1].payload["n"]}
