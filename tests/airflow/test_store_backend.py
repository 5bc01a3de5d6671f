"""``WatchkeeperStoreBackend`` under a real Airflow 3.3: ``airflow db migrate``, then
``airflow dags test`` of a DAG whose task meets one of our watchers through the asset state,
on a SQLite store and on a PostgreSQL store (Airflow's own metastore is SQLite in both).

Airflow runs in child processes (see tests/support/airflow_env.py); the test process opens
watchkeeper's store only, before and after Airflow's commands.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from watchkeeper.store import (
    Asset,
    AssetScope,
    BaseStateBackend,
    StoreSettings,
    TaskScope,
    open_state_backend,
)
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
from watchkeeper.triggerer.testing import run_trigger

from tests.support.airflow_env import airflow_env, require_airflow, run_airflow, run_python
from tests.support.postgres import fresh_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
"""Airflow's commands start cold (``airflow dags test`` 7-8 s on an idle machine, several times
that on a loaded one): the suite's 120 s would fail a correct run on a busy machine."""

ORDERS = Asset("orders", "s3://data/orders/")
PROBE = Path(__file__).with_name("store_backend_probe.py")


class Handshake(BaseEventTrigger):
    """A watcher that commits its watermark with its event and reports what Airflow wrote."""

    def __init__(self, watermark: int) -> None:
        super().__init__()
        self.watermark = watermark

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.Handshake", {"watermark": self.watermark}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        seen = await self.asset_state_store.aget("airflow_watermark")
        yield TriggerEvent({"airflow_saw": seen}, state={"watermark": self.watermark})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    require_airflow()
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'watchkeeper.db'}"
        return
    pg_dsn: str = request.getfixturevalue("pg_dsn")
    async with fresh_pg_database(pg_dsn, prefix="wk_airflow") as database:
        yield database.dsn


def _open(url: str) -> BaseStateBackend:
    return open_state_backend(StoreSettings(database={"url": url}))


async def test_a_dag_and_a_watcher_share_the_asset_state(tmp_path: Path, store_url: str) -> None:
    async with _open(store_url) as store:
        [first] = await run_trigger(Handshake(41), assets=ORDERS, backend=store)
    assert first.payload == {"airflow_saw": None}

    env = airflow_env(
        tmp_path / "airflow", store_url=store_url, AIRFLOW__STATE_STORE__CLEAR_ON_SUCCESS="true"
    )
    await run_airflow("db", "migrate", env=env)
    await run_airflow("dags", "test", "wk_bridge", env=env)

    async with _open(store_url) as store:
        orders = {entry.key: entry for entry in await store.alist(AssetScope(name="orders"))}
        # The task read our watermark and wrote its own, recorded as the task's first try.
        written = orders["airflow_watermark"]
        assert written.value == {"after": 41, "by": "airflow"}
        assert written.writer is not None and written.writer.kind == "task"
        dag_id, run_id, task = written.writer.name.split("/")
        assert (dag_id, task, written.writer.try_number) == ("wk_bridge", "meet_the_watcher[-1]", 1)
        # Task state survived the failed first try, and clear_on_success emptied it after.
        assert orders["retry_saw"].value == 41
        assert orders["retry_saw"].writer is not None
        assert orders["retry_saw"].writer.try_number == 2
        assert await store.alist(TaskScope("wk_bridge", run_id, "meet_the_watcher")) == []
        # A value over max_value_bytes reached the task as a 413 naming size and limit.
        refusal = orders["refusal"].value
        assert isinstance(refusal, dict) and refusal["status"] == 413
        assert "70002" in refusal["detail"]["message"] and "65536" in refusal["detail"]["message"]
        assert "too_big" not in orders
        # An asset only Airflow knew is registered here by name on its first write.
        assert await store.aget(AssetScope(name="ledger"), "opened") is True
        names = {info.name for info in await store.events.alist_assets()}
        assert names == {"orders", "ledger"}

        [second] = await run_trigger(Handshake(42), assets=ORDERS, backend=store)
    assert second.payload == {"airflow_saw": {"after": 41, "by": "airflow"}}

    if not store_url.startswith("sqlite"):
        return  # the probe below is about the backend, not about the store behind it
    # The backend as Airflow's other callers use it: by asset id, async twins, refusals, fork.
    with sqlite3.connect(tmp_path / "airflow" / "airflow.db") as meta:
        [(asset_id,)] = meta.execute("SELECT id FROM asset WHERE name = 'orders'").fetchall()
    out = await run_python(str(PROBE), str(asset_id), env=env)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["parent_read"] == "42"
    assert report["twins"] == {
        "got": '{"a":[1,2]}',
        "deleted": None,
        "cleared": None,
        "by_id": "42",
    }
    refused = report["refused"]
    assert refused["too_large"]["status"] == 413
    assert "65536" in refused["too_large"]["message"]
    assert refused["null"]["status"] == 422 and "None" in refused["null"]["message"]
    assert refused["nan"]["status"] == 422
    assert refused["not_json"]["status"] == 422 and "not JSON" in refused["not_json"]["message"]
    assert report["refused_left_nothing"] is True
    assert report["child_exit"] == 0
    assert report["child_read"] == str(report["child_pid"])
    assert report["parent_after_fork"] == str(report["child_pid"])
