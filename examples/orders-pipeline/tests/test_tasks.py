"""The two tasks, each run on given events as a worker runs it (``run_asset_task``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline import load_orders, loaded_orders, order_files, order_summary, orders, summarize
from watchkeeper.store import BaseStateBackend
from watchkeeper.triggerer.testing import run_asset_task


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def nats_message(order: object) -> dict[str, object]:
    """An event payload as the NATS watcher writes it (only what the task reads)."""
    return {"stream": "ORDERS", "subject": "orders.new", "sequence": 1, "data": order}


def dropped_file(folder: Path, name: str, order: object) -> dict[str, object]:
    """An event payload as the folder watcher writes it, for a file written here."""
    path = folder / name
    path.write_text(json.dumps(order))
    return {"path": str(path), "name": name, "size": path.stat().st_size}


async def test_load_orders_keeps_the_valid_orders_of_both_sources(tmp_path: Path) -> None:
    result = await run_asset_task(
        load_orders,
        events={
            orders: [
                nats_message({"id": "n1", "customer": "ada", "amount": 30}),
                nats_message("not an order"),
            ],
            order_files: [
                dropped_file(tmp_path, "f1.json", {"id": "f1", "customer": "bob", "amount": 12}),
                dropped_file(tmp_path, "f2.json", {"id": "f2", "customer": "bob", "amount": -1}),
            ],
        },
    )
    assert {run.state for run in result.runs} == {"success"}
    loaded = [o["id"] for e in result.outlet(loaded_orders) for o in e.payload["orders"]]
    rejected = sum(e.payload["rejected"] for e in result.outlet(loaded_orders))
    assert (sorted(loaded), rejected) == (["f1", "n1"], 2)


@pytest.mark.parametrize("wk_backend", ["memory", "sqlite"], indirect=True)
async def test_summarize_keeps_running_totals_per_customer(wk_backend: BaseStateBackend) -> None:
    batch = {"orders": [{"id": "1", "customer": "ada", "amount": 30}], "rejected": 0}
    first = await run_asset_task(summarize, events=[batch], backend=wk_backend)
    second = await run_asset_task(summarize, events=[batch, batch], backend=wk_backend)
    assert first.run.state == second.run.state == "success"
    assert [e.payload["run_totals"] for e in second.outlet(order_summary)] == [{"ada": 60}]
    assert await wk_backend.aget(order_summary.scope, "totals") == {"ada": 90}
