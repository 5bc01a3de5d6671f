"""A live scrape of a daemon's ``/metrics`` passes Prometheus's own ``promtool check metrics``,
and no counter goes down between two scrapes with watcher failures and events between them; a
daemon running a ``PostgresChangesWatcher`` (on the ``pg_logical`` cluster) passes it with its
source gauge, the slot's lag, in the scrape.

promtool comes with Debian's ``prometheus`` package (``.ci/run`` installs it); without it the
test skips, and fails under ``CI=true``."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from watchkeeper.triggerer import Settings, TriggererSettings

from tests.support.api import daemon_api
from tests.support.daemons import FAILING_WATCHER, append_lines, asset_file, wait_until
from tests.support.pg_logical import LogicalCluster
from tests.support.requires import unavailable

Key = tuple[str, frozenset[tuple[str, str]]]
Scrape = Callable[[], Awaitable[str]]
LAG = "watchkeeper_source_slot_lag_bytes"


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool is missing (apt-get install prometheus)")
    return found


def check_metrics(promtool: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def cumulative(text: str) -> dict[Key, float]:
    """The samples that may never decrease: every sample of a counter family, and the
    buckets and counts of histograms."""
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if family.type == "counter" or (
                family.type == "histogram" and s.name.endswith(("_bucket", "_count"))
            ):
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return cumulative(text).get((name, frozenset(labels.items())))


def gauge(text: str, name: str, **labels: str) -> float | None:
    """The sample ``name`` with exactly ``labels`` of a gauge family, if the scrape has it."""
    for family in text_string_to_metric_families(text):
        if family.type == "gauge":
            for s in family.samples:
                if s.name == name and s.labels == labels:
                    return float(s.value)
    return None


@asynccontextmanager
async def scraped(settings: Settings) -> AsyncIterator[Scrape]:
    """A daemon with its API (see :func:`daemon_api`); yields a scrape of its ``/metrics``."""
    async with daemon_api(settings) as client:

        async def scrape() -> str:
            response = await client.get("/metrics")
            assert response.status_code == 200
            return response.text

        yield scrape


async def assert_promtool_passes(promtool: str, text: str) -> None:
    """``promtool check metrics`` accepts ``text`` without a single remark."""
    checked = await anyio.to_thread.run_sync(check_metrics, promtool, text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""


CDC_WATCHER = """
from watchkeeper.triggerer import Asset, AssetWatcher
from watchkeeper.watchers import PostgresChangesWatcher

changes = Asset(
    "changes",
    watchers=[
        AssetWatcher(
            "cdc",
            PostgresChangesWatcher({dsn!r}, {slot!r}, tables=[{table!r}], poll_interval=0.1),
        )
    ],
)
"""


@asynccontextmanager
async def watched_table(dsn: str) -> AsyncIterator[tuple[asyncpg.Connection, str]]:
    """A connection to the cluster and a new table on it; at exit, the slot and publication a
    watcher made for the table (named ``wk_<table>``) are dropped with it."""
    table = f"t_{uuid.uuid4().hex[:10]}"
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
        yield connection, table
    finally:
        with anyio.move_on_after(10, shield=True):
            await connection.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = $1 AND NOT active",
                f"wk_{table}",
            )
            await connection.execute(f"DROP PUBLICATION IF EXISTS wk_{table}")
            await connection.execute(f"DROP TABLE {table}")
            await connection.close()


class TestPromtool:
    async def test_live_scrapes_pass_promtool_and_counters_never_decrease(
        self, tmp_path: Path, watchers: Path, promtool: str
    ) -> None:
        """Two scrapes of a daemon, with a watcher failing again and again and events
        committed between them: both pass ``promtool check metrics`` without a remark, and
        each counter sample of the first is in the second, not lower."""
        source = tmp_path / "orders.txt"
        append_lines(source, 1, 2)
        (watchers / "orders.py").write_text(asset_file("orders", source))
        (watchers / "broken.py").write_text(FAILING_WATCHER)
        settings = Settings(
            triggerer=TriggererSettings(
                watchers_path=watchers,
                heartbeat_interval=0.2,
                lease_renew_interval=0.2,
                gc_interval=0,
                backoff_initial=0.05,
                backoff_max=0.1,
                max_failures=50,
            )
        )
        async with scraped(settings) as scrape:

            async def started() -> bool:
                text = await scrape()
                failures = value(text, "watchkeeper_watcher_failures_total", watcher="broken_feed")
                events = value(
                    text, "watchkeeper_events_total", asset="orders", watcher="orders_feed"
                )
                return (failures or 0) >= 1 and events == 2

            await wait_until(started, "a failure and two events")
            first = await scrape()
            failed = value(first, "watchkeeper_watcher_failures_total", watcher="broken_feed")
            append_lines(source, 3, 5)

            async def moved_on() -> bool:
                text = await scrape()
                failures = value(text, "watchkeeper_watcher_failures_total", watcher="broken_feed")
                events = value(
                    text, "watchkeeper_events_total", asset="orders", watcher="orders_feed"
                )
                return (failures or 0) >= (failed or 0) + 2 and events == 5

            await wait_until(moved_on, "two more failures and three more events")
            second = await scrape()
        for text in (first, second):
            await assert_promtool_passes(promtool, text)
        before, after = cumulative(first), cumulative(second)
        assert before, "no counter in the first scrape"
        lower = {k: (v, after.get(k)) for k, v in before.items() if after.get(k, -1.0) < v}
        assert lower == {}, "counter samples gone or lower in the second scrape"

    @pytest.mark.slow
    async def test_the_cdc_watchers_source_gauge_passes_promtool(
        self, watchers: Path, promtool: str, pg_logical: LogicalCluster
    ) -> None:
        """A daemon running a ``PostgresChangesWatcher``: once it read a change, its scrape
        holds the slot's lag (``watchkeeper_source_slot_lag_bytes``, from the watcher's
        ``source_gauges()``) and passes ``promtool check metrics`` without a remark."""
        async with watched_table(pg_logical.dsn) as (connection, table):
            slot = f"wk_{table}"
            cdc = CDC_WATCHER.format(dsn=pg_logical.dsn, slot=slot, table=table)
            (watchers / "cdc.py").write_text(textwrap.dedent(cdc))
            settings = Settings(triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0))
            async with scraped(settings) as scrape:

                async def slot_made() -> bool:
                    found = await connection.fetchval(
                        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot
                    )
                    return bool(found)

                # The watcher makes its slot on its first start; a change before that is not seen.
                await wait_until(slot_made, "the watcher's replication slot")
                await connection.execute(f"INSERT INTO {table} VALUES (1, 'one')")

                async def measured() -> bool:
                    text = await scrape()
                    events = value(text, "watchkeeper_events_total", asset="changes", watcher="cdc")
                    return events == 1 and gauge(text, LAG, watcher="cdc") is not None

                await wait_until(measured, "the change committed and the slot's lag measured")
                text = await scrape()
        await assert_promtool_passes(promtool, text)

    def test_the_checks_can_fail(self, promtool: str) -> None:
        """promtool remarks on a counter named without ``_total``, and a lower counter sample
        is found by the comparison above."""
        bad = "# HELP x_events Events.\n# TYPE x_events counter\nx_events 3\n"
        checked = check_metrics(promtool, bad)
        assert "_total" in checked.stdout + checked.stderr
        good = "# HELP x_total Events.\n# TYPE x_total counter\nx_total 3\n"
        lower = good.replace("x_total 3", "x_total 2")
        assert (
            cumulative(good)[("x_total", frozenset())] > cumulative(lower)[("x_total", frozenset())]
        )
