"""The orders pipeline: two sources of orders, two chained tasks.

- ``orders``: every message of the NATS JetStream stream ``ORDERS`` (one JSON order each).
- ``order_files``: every ``*.json`` file dropped into the inbox folder (one order each).
- ``load_orders`` runs on either, checks each order and emits the valid ones on ``loaded_orders``.
- ``summarize`` runs on ``loaded_orders`` and keeps the running totals per customer in the
  asset state of ``order_summary``, emitting the run's totals there too.

Where the sources are comes from the environment, so one file serves every environment:
``ORDERS_NATS_URL`` (default ``nats://127.0.0.1:4222``), ``ORDERS_STREAM`` (default
``ORDERS``) and ``ORDERS_INBOX`` (default ``./inbox``, relative to where the daemon runs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from watchkeeper.triggerer import AnyOf, Asset, AssetWatcher, asset_task
from watchkeeper.watchers import DirectoryWatcher, NatsJetStreamWatcher

NATS_URL = os.environ.get("ORDERS_NATS_URL", "nats://127.0.0.1:4222")
INBOX = os.environ.get("ORDERS_INBOX", "inbox")
STREAM = os.environ.get("ORDERS_STREAM", "ORDERS")

orders = Asset(
    "orders",
    watchers=[AssetWatcher("orders_stream", NatsJetStreamWatcher(STREAM, servers=NATS_URL))],
)
order_files = Asset(
    "order_files",
    watchers=[AssetWatcher("orders_inbox", DirectoryWatcher(INBOX, pattern="*.json"))],
)
loaded_orders = Asset("loaded_orders")
order_summary = Asset("order_summary")


def order_of(event_payload: dict[str, Any]) -> dict[str, Any]:
    """The order an event carries: a NATS message's data, or a dropped file's content."""
    if "data" in event_payload:  # a NATS message: the body, decoded as JSON
        data = event_payload["data"]
        return data if isinstance(data, dict) else {"invalid": data}
    return dict(json.loads(Path(event_payload["path"]).read_text()))


def is_valid(order: dict[str, Any]) -> bool:
    return (
        isinstance(order.get("id"), str)
        and isinstance(order.get("customer"), str)
        and isinstance(order.get("amount"), int | float)
        and order["amount"] > 0
    )


@asset_task(schedule=AnyOf(orders, order_files), outlets=[loaded_orders], retries=2)
def load_orders(*, triggering_asset_events: Any, outlet_events: Any, **_: Any) -> None:
    """Reads each order of the run, keeps the valid ones and emits them as one batch."""
    loaded: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for events in triggering_asset_events.values():
        for event in events:
            order = order_of(event.payload)
            (loaded if is_valid(order) else rejected).append(order)
    outlet_events[loaded_orders].extra = {"orders": loaded, "rejected": len(rejected)}


@asset_task(schedule=[loaded_orders], outlets=[order_summary])
def summarize(*, triggering_asset_events: Any, outlet_events: Any, **context: Any) -> None:
    """Adds the run's loaded orders to the totals per customer kept in the asset state."""
    store = context["asset_state_store"][order_summary]
    totals: dict[str, float] = store.get("totals", default={})
    run_totals: dict[str, float] = {}
    for event in triggering_asset_events[loaded_orders]:
        for order in event.payload["orders"]:
            run_totals[order["customer"]] = run_totals.get(order["customer"], 0) + order["amount"]
    for customer, amount in run_totals.items():
        totals[customer] = totals.get(customer, 0) + amount
    store.set("totals", totals)
    outlet_events[order_summary].extra = {"run_totals": run_totals}
