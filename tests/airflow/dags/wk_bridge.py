"""A DAG whose task meets a watchkeeper watcher through the asset state store.

Its one task reads the watermark the watcher committed, answers with a watermark of its own
for the watcher to read, keeps a note in its task state that only its retry reads, and records
how a value too large for the store reaches it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, task
from airflow.sdk.api.client import ServerResponseError

ORDERS = Asset(name="orders", uri="s3://data/orders/")
LEDGER = Asset(name="ledger")  # known to Airflow only, until the task writes to it

with DAG("wk_bridge", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task(outlets=[ORDERS, LEDGER], retries=1, retry_delay=timedelta(seconds=0))
    def meet_the_watcher(**context: Any) -> None:
        orders = context["asset_state_store"][ORDERS]
        ledger = context["asset_state_store"][LEDGER]
        notes = context["task_state_store"]
        if context["ti"].try_number == 1:
            watermark = orders.get("watermark")
            notes.set("seen", watermark)
            orders.set("airflow_watermark", {"after": watermark, "by": "airflow"})
            ledger.set("opened", True)
            try:
                orders.set("too_big", "x" * 70_000)
            except ServerResponseError as exc:  # how the store's refusal reaches a task
                orders.set("refusal", {"status": exc.response.status_code, "detail": exc.detail})
            raise RuntimeError("the first try fails on purpose")
        orders.set("retry_saw", notes.get("seen"))

    meet_the_watcher()
