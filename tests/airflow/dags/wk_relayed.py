"""A DAG scheduled on the asset watchkeeper's relay posts events to."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Asset, task

with DAG(
    "wk_on_orders",
    schedule=[Asset(name="orders", uri="s3://data/orders/")],
    start_date=datetime(2026, 1, 1),
):

    @task
    def consume() -> None:
        pass

    consume()
