"""What the operator's page reads and does, through the HTTP API on a real server and store:
newest-first event pages, watcher controls on unknown names, and watcher event rates.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import (
    EventBatchCommit,
    TriggerStatus,
    encode_json,
)
from watchkeeper.triggerer import TriggerEvent, TriggerRunner
from watchkeeper.triggerer.api._rates import RunnerRates

from tests.support.api import ServedApi, serve_api
from tests.support.runtime import FAST, Scripted, spec


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
        """Without a runner (``watchkeeper api``) each watcher's events per minute are counted
        in the event log over the last 5 minutes, on the first read: 300 events in the window
        are 60/min; older ones do not count."""
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
        assert body["rate_window_seconds"] == 300 and body["rate_source"] == "event_log"
        rates = {
            w["watcher"]: (w["events_in_window"], w["events_per_minute"]) for w in body["watchers"]
        }
        assert rates == {"bills_poll": (0, 0.0), "orders_poll": (300, 60.0)}

    async def test_a_daemons_api_takes_the_rate_from_its_runner(self, tmp_path: Path) -> None:
        """Served with a runner, the rates are the runner's own counts, not the event log's:
        5 events its trigger committed count, 300 written to the log beside it do not, and a
        watcher the runner does not run has no figure (null)."""
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            await backend.events.aregister_assets([Asset("orders"), Asset("bills")])
            async with TriggerRunner(backend, FAST) as runner:
                trigger = Scripted([TriggerEvent({"i": i}) for i in range(5)])
                await runner.start_trigger(spec("orders_poll", trigger, Asset("orders")))
                with anyio.fail_after(10):
                    await trigger.drained.wait()
                now = datetime.now(UTC)
                statuses = [
                    TriggerStatus(
                        "t1", "m.C", ("orders",), ("orders_poll",), "running", updated_at=now
                    ),
                    TriggerStatus(
                        "t2", "m.C", ("bills",), ("bills_poll",), "running", updated_at=now
                    ),
                ]
                await backend.status.asave_trigger_status(statuses)
                for watcher, asset in (("orders_poll", "orders"), ("bills_poll", "bills")):
                    rows = tuple((encode_json({"n": n}), None) for n in range(300))
                    await backend.events.acommit_batch(EventBatchCommit(watcher, (asset,), rows))
                async with (
                    serve_api(backend, {"ops": ["operate"]}, runner=runner) as served,
                    served.client("ops") as ops,
                ):
                    body = (await ops.get("/api/v1/watchers")).json()
        assert body["rate_source"] == "daemon"
        rates = {
            w["watcher"]: (w["events_in_window"], w["events_per_minute"]) for w in body["watchers"]
        }
        assert rates == {"bills_poll": (None, None), "orders_poll": (5, 1.0)}


class TestRunnerRates:
    def test_the_window_keeps_the_last_five_minutes_of_counts(self) -> None:
        """A watcher's count is what it committed since the oldest sample inside the window
        (plus the events since the last sample); a sample that leaves the window takes its
        events with it, and a watcher that never ran here has no count."""
        now = [0.0]
        totals: dict[str, int] = {}
        rates = RunnerRates(lambda: dict(totals), lambda: ["a", *totals], clock=lambda: now[0])
        rates.sample()
        totals["b"] = 10
        now[0] = 15.0
        rates.sample()
        totals["b"] = 14  # committed after the last sample: counted at once
        now[0] = 100.0
        assert rates.counts() == {"a": 0, "b": 14}
        now[0] = 300.0
        rates.sample()  # the sample at 0 (nothing in it) leaves; the one at 15 stays
        assert rates.counts() == {"a": 0, "b": 14}
        now[0] = 315.0
        rates.sample()  # the sample at 15 (10 events) leaves the window
        assert rates.counts() == {"a": 0, "b": 4}
        now[0] = 700.0
        rates.sample()
        assert rates.counts() == {"a": 0, "b": 0}
        assert "c" not in rates.counts()
