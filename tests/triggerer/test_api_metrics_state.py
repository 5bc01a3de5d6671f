"""``/metrics`` tells the truth when things stop: served from the process's own state while
the store is down (``watchkeeper_store_up`` 0), watcher series that persist with their state
(paused, stopped), and no lease counted once the node lease lapsed.

Daemons run in this process on a real store and serve the real app over HTTP; PostgreSQL
outages close the test's own database to connections and end its sessions."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from watchkeeper.store import BaseStateBackend, MemoryStateBackend, PostgresStateBackend
from watchkeeper.store.protocols import TriggerStatus
from watchkeeper.store.settings import DatabaseSettings
from watchkeeper.triggerer import Settings, TriggererSettings
from watchkeeper.triggerer.api import Metrics, api_context, serve_app
from watchkeeper.triggerer.daemon import Daemon
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers
from watchkeeper.triggerer.settings import ApiSettings

from tests.support.daemons import append_lines, asset_file, wait_until
from tests.support.postgres import PgDatabase
from tests.triggerer.test_store_outage import allow_connections, block_connections

Found = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Found:
    """Every sample of the exposition by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(found: Found, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def by_state(found: Found) -> dict[str, float]:
    return {
        dict(labels)["state"]: v
        for (name, labels), v in found.items()
        if name == "watchkeeper_watchers"
    }


@pytest.fixture(autouse=True)
def _unload() -> Iterator[None]:
    yield
    unload_watchers()


def fast_settings(watchers: Path, url: str | None = None) -> Settings:
    triggerer = TriggererSettings(
        watchers_path=watchers,
        heartbeat_interval=0.2,
        lease_renew_interval=0.2,  # leases last 0.6 s
        lease_margin=0.1,
        gc_interval=0,
        stop_grace=2,
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    if url is None:
        return Settings(triggerer=triggerer)
    return Settings(triggerer=triggerer, database=DatabaseSettings(url=SecretStr(url)))


@asynccontextmanager
async def served(
    settings: Settings, backend: BaseStateBackend | None = None
) -> AsyncIterator[tuple[Daemon, httpx.AsyncClient]]:
    """A daemon (on ``backend``, or the settings' database) serving the API on a free port."""
    async with Daemon(settings, backend=backend) as d, anyio.create_task_group() as tg:
        ctx = api_context(d.backend, ApiSettings(port=0), daemon=d)
        port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield d, client
        tg.cancel_scope.cancel()


async def scrape(client: httpx.AsyncClient) -> Found:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    return parse(response.text)


def two_feeds(tmp_path: Path, watchers: Path) -> None:
    for asset in ("orders", "bills"):
        source = tmp_path / f"{asset}.txt"
        append_lines(source, 1, 2)
        (watchers / f"{asset}.py").write_text(asset_file(asset, source))


class TestWatcherSeriesPersist:
    async def test_a_paused_watcher_keeps_its_series_with_state_paused(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """Pausing a watcher turns its series to state="paused" (its event count kept)
        instead of removing them; the per-state totals still add up to every watcher."""
        two_feeds(tmp_path, watchers)
        async with (
            MemoryStateBackend() as backend,
            served(fast_settings(watchers), backend) as (
                _,
                client,
            ),
        ):

            async def both_counted() -> bool:
                found = await scrape(client)
                return all(
                    get(found, "watchkeeper_events_total", asset=a, watcher=f"{a}_feed") == 2
                    for a in ("orders", "bills")
                )

            await wait_until(both_counted, "two events of each watcher")
            await backend.controls.aset_watcher_paused("orders_feed", True, by="test")

            async def paused() -> bool:
                found = await scrape(client)
                flag = get(
                    found, "watchkeeper_watcher_state", watcher="orders_feed", state="paused"
                )
                return flag == 1

            await wait_until(paused, 'orders_feed with state="paused" in /metrics')
            found = await scrape(client)
        assert get(found, "watchkeeper_events_total", asset="orders", watcher="orders_feed") == 2
        assert get(found, "watchkeeper_watcher_up", watcher="orders_feed") == 0
        assert get(found, "watchkeeper_watcher_up", watcher="bills_feed") == 1
        states = by_state(found)
        assert states["paused"] == 1
        assert states["running"] == 1
        assert sum(states.values()) == 2

    async def test_a_watcher_paused_before_the_start_is_reported_paused(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """A watcher paused before the daemon started never runs there, and still shows."""
        two_feeds(tmp_path, watchers)
        async with MemoryStateBackend() as backend:
            await backend.controls.aset_watcher_paused("bills_feed", True, by="test")
            async with served(fast_settings(watchers), backend) as (_, client):
                found = await scrape(client)
        assert get(found, "watchkeeper_watcher_state", watcher="bills_feed", state="paused") == 1
        assert get(found, "watchkeeper_watcher_state", watcher="orders_feed", state="running") == 1
        assert sum(by_state(found).values()) == 2


@pytest.mark.slow
@pytest.mark.postgres
class TestStoreDown:
    async def test_metrics_answer_from_the_process_while_postgres_is_down(
        self, tmp_path: Path, pg_dsn: str, pg_database: PgDatabase, watchers: Path
    ) -> None:
        """With its database refusing connections, the daemon's /metrics still answers 200
        with watchkeeper_store_up 0; once the node lease lapsed it counts no lease and the
        watcher it stopped keeps its series as "stopped"; after the outage all is back."""
        name, dsn = pg_database
        source = tmp_path / "orders.txt"
        append_lines(source, 1, 2)
        (watchers / "orders.py").write_text(asset_file("orders", source))
        settings = fast_settings(watchers, dsn)
        async with served(settings) as (_, client):

            async def live() -> bool:
                found = await scrape(client)
                return (
                    get(found, "watchkeeper_store_up") == 1
                    and get(found, "watchkeeper_leases_held") == 1
                    and get(
                        found, "watchkeeper_events_total", asset="orders", watcher="orders_feed"
                    )
                    == 2
                )

            await wait_until(live, "the watcher running with its lease")
            before = await scrape(client)
            await block_connections(pg_dsn, name)

            async def down() -> bool:
                found = await scrape(client)
                return (
                    get(found, "watchkeeper_store_up") == 0
                    and get(found, "watchkeeper_leases_held") == 0
                    and get(
                        found, "watchkeeper_watcher_state", watcher="orders_feed", state="stopped"
                    )
                    == 1
                )

            await wait_until(down, "store_up 0, no lease and the watcher stopped")
            during = await scrape(client)
            await allow_connections(pg_dsn, name)

            async def back() -> bool:
                found = await scrape(client)
                return (
                    get(found, "watchkeeper_store_up") == 1
                    and get(found, "watchkeeper_leases_held") == 1
                    and get(
                        found, "watchkeeper_watcher_state", watcher="orders_feed", state="running"
                    )
                    == 1
                )

            await wait_until(back, "the store, the lease and the watcher back")
        assert get(during, "watchkeeper_events_total", asset="orders", watcher="orders_feed") == 2
        assert sum(by_state(during).values()) == 1
        read_at = get(during, "watchkeeper_store_read_timestamp_seconds")
        assert read_at is not None
        assert read_at >= (get(before, "watchkeeper_store_read_timestamp_seconds") or 0)

    async def test_without_a_runner_the_last_read_is_served(
        self, pg_dsn: str, pg_database: PgDatabase
    ) -> None:
        """``watchkeeper api`` (no runner): while the database is down the watcher series
        are the last ones read, store_up is 0 and the read's time does not move."""
        name, dsn = pg_database
        async with PostgresStateBackend(dsn) as backend:
            status = TriggerStatus("t1", "m.C", ("orders",), ("feed",), "running", events=7)
            await backend.status.asave_trigger_status([status])
            metrics = Metrics(backend)
            await metrics.prepare()
            up = parse(metrics.render().decode())
            await block_connections(pg_dsn, name)
            try:
                await metrics.prepare()
                down = parse(metrics.render().decode())
            finally:
                await allow_connections(pg_dsn, name)
        assert get(up, "watchkeeper_store_up") == 1
        assert get(down, "watchkeeper_store_up") == 0
        assert get(down, "watchkeeper_events_total", asset="orders", watcher="feed") == 7
        assert get(down, "watchkeeper_store_read_timestamp_seconds") == get(
            up, "watchkeeper_store_read_timestamp_seconds"
        )
