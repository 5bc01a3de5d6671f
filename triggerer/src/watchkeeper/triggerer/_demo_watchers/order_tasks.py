"""Example task: runs on the ``orders`` events the watchers commit (``watchkeeper worker``).

Each run gets the orders events committed since the previous run (up to 100), adds their
count to a running total in its task state, and emits one ``order_totals`` event. The demo
kills the worker with SIGKILL while a run is inside this function; the run is tried again
(the next ``try_number``), and the check at the end proves every orders event was in exactly
one successful run.
"""

from __future__ import annotations

import time
from typing import Any

from watchkeeper.triggerer import Asset, asset_task

orders = Asset("orders", uri="sqlite://demo/orders")
order_totals = Asset("order_totals")


@asset_task(schedule=[orders], outlets=[order_totals], retries=10, retry_delay=0.1)
def tally_orders(
    *, triggering_asset_events: dict[Asset, list[Any]], outlet_events: Any, **_: Any
) -> None:
    events = triggering_asset_events[orders]
    time.sleep(0.3)  # slow enough for the demo's SIGKILL to land inside a run
    outlet_events[order_totals].extra = {"orders": len(events), "last": events[-1].payload["n"]}
