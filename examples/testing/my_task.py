"""A user-written task: totals each run's orders and emits the total on an outlet asset."""

from __future__ import annotations

from typing import Any

from watchkeeper.triggerer import Asset, asset_task

orders = Asset("orders")
order_totals = Asset("order_totals")


@asset_task(schedule=[orders], outlets=[order_totals], retries=2)
def total_orders(*, triggering_asset_events: Any, outlet_events: Any, **context: Any) -> None:
    """Sums the amounts of the run's orders; a negative amount is a bad order and fails."""
    amounts = [event.payload["amount"] for event in triggering_asset_events[orders]]
    if any(amount < 0 for amount in amounts):
        raise ValueError(f"a negative amount in {amounts}")
    outlet_events[order_totals].extra = {"orders": len(amounts), "total": sum(amounts)}
    context["asset_state_store"][order_totals].set("last_total", sum(amounts))
