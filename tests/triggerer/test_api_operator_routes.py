"""What the operator's page reads and does, through the HTTP API on a real server and store:
newest-first event pages, watcher controls on unknown names, and watcher event rates.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import (
    EventBatchCommit,
    TriggerStatus,
    encode_json,
)

from tests.support.api import ServedApi, serve_api


def _at(moment: datetime) -> datetime:
    return moment


Api = ServedApi[SqliteStateBackend]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    """A served API on a fresh SQLite store with assets orders and bills."""
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets([Asset("orders"), Asset("bills")])
        async with serve_api(backend, {"reader": ["read"], "ops": ["operate"]}) as served:
            yield served


class TestNewestFirstEvents:
    async def test_order_desc_pages_back_from_the_newest(self, api: Api) -> None:
        """``order=desc`` starts at the newest event; ``next_before`` pages to older ones."""
        for n in range(1, 8):
            await api.commit("orders" if n % 2 else "bills", n)
        async with api.client("reader") as client:
            first = (
                await client.get(
                    "/api/v1/events", params={"order": "desc", "limit": 2, "asset": "orders"}
                )
            ).json()
            older = (
                await client.get(
                    "/api/v1/events",
                    params={"order": "desc", "asset": "orders", "before": first["next_before"]},
                )
            ).json()
            bounded = (await client.get("/api/v1/events", params={"before": 3})).json()
            bad_order = await client.get("/api/v1/events", params={"order": "newest"})
            bad_before = await client.get("/api/v1/events", params={"before": 0})
        assert [e["payload"]["n"] for e in first["events"]] == [7, 5] and first["more"]
        assert [e["payload"]["n"] for e in older["events"]] == [3, 1] and not older["more"]
        assert [e["payload"]["n"] for e in bounded["events"]] == [1, 2]
        assert bad_order.status_code == 400 and "order" in bad_order.json()["detail"]
        assert bad_before.status_code == 400 and "before" in bad_before.json()["detail"]


class TestUnknownWatcher:
    @pytest.mark.parametrize("action", ["pause", "resume", "retry"])
    async def test_a_typo_is_404_naming_the_closest(self, api: Api, action: str) -> None:
        """A control naming no known watcher is 404 with the closest name and writes nothing;
        the list shows no phantom watcher."""
        now = datetime.now(UTC)
        status = TriggerStatus(
            "t1", "m.C", ("orders",), ("orders_poll",), "running", updated_at=now, owner="d1"
        )
        await api.backend.status.asave_trigger_status([status])
        async with api.client("ops") as ops:
            typo = await ops.post(f"/api/v1/watchers/orders_pol/{action}")
            far = await ops.post(f"/api/v1/watchers/zzz/{action}")
            listed = (await ops.get("/api/v1/watchers")).json()["watchers"]
        assert typo.status_code == 404
        assert "did you mean 'orders_poll'" in typo.json()["detail"]
        assert far.status_code == 404 and "'zzz'" in far.json()["detail"]
        assert [w["watcher"] for w in listed] == ["orders_poll"]
        assert await api.backend.controls.alist_watcher_controls() == []


class TestWatcherRates:
    async def test_events_per_minute_over_the_stated_window(self, api: Api) -> None:
        """Each watcher's events per minute come from the event log over the last 5 minutes,
        on the first read: 300 events in the window are 60/min; older ones do not count."""
        now = datetime.now(UTC)
        statuses = [
            TriggerStatus("t1", "m.C", ("orders",), ("orders_poll",), "running", updated_at=now),
            TriggerStatus("t2", "m.C", ("bills",), ("bills_poll",), "running", updated_at=now),
        ]
        await api.backend.status.asave_trigger_status(statuses)
        for at, count in ((now - timedelta(minutes=10), 500), (now - timedelta(minutes=2), 300)):
            api.backend.clock = functools.partial(_at, at)
            rows = tuple((encode_json({"n": n}), None) for n in range(count))
            await api.backend.events.acommit_batch(
                EventBatchCommit("orders_poll", ("orders",), rows)
            )
        api.backend.clock = lambda: datetime.now(UTC)
        async with api.client("ops") as ops:
            body = (await ops.get("/api/v1/watchers")).json()
        assert body["rate_window_seconds"] == 300
        rates = {
            w["watcher"]: (w["events_in_window"], w["events_per_minute"]) for w in body["watchers"]
        }
        assert rates == {"bills_poll": (0, 0.0), "orders_poll": (300, 60.0)}
