"""The watchers' last hour as the API server samples it (``api/_series.py``), on a real
SQLite store: rates from the event log, ages and state changes from the status rows, rows
aligned with the sample times, the window kept to its length."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import DaemonStatus, EventBatchCommit, TriggerStatus, encode_json
from watchkeeper.triggerer.api._rates import RunnerRates
from watchkeeper.triggerer.api._series import MAX_CHANGES, WatcherSeries


async def report(backend: SqliteStateBackend, name: str, state: str, **extra: Any) -> None:
    """A live daemon ``d`` reporting watcher ``name`` on asset ``orders`` in ``state``."""
    now = datetime.now(UTC)
    await backend.status.asave_daemon_status(
        DaemonStatus("d", started_at=now, heartbeat_at=now, lease_ttl=3600.0, watchers_path=".")
    )
    await backend.status.asave_trigger_status(
        [
            TriggerStatus(
                name, "x.Y", ("orders",), (name,), state, updated_at=now, owner="d", **extra
            )
        ]
    )


async def commit(backend: SqliteStateBackend, watcher: str, n: int) -> None:
    rows = tuple((encode_json({"n": i}), None) for i in range(n))
    await backend.events.acommit_batch(EventBatchCommit(watcher, ("orders",), rows))


class TestWatcherSeries:
    async def test_rates_ages_and_changes(self, tmp_path: Path) -> None:
        """Events committed between two samples make that sample's rate; the age comes from
        the last event; a failure and a pause are changes with their reason."""
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            await backend.events.aregister_assets([Asset("orders")])
            await report(backend, "feed", "running")
            series = WatcherSeries(backend, interval=60)
            await series.sample()
            await commit(backend, "feed", 30)
            await report(backend, "feed", "failed", last_error="KeyError: 'x'")
            await series.sample()
            await backend.controls.aset_watcher_paused("feed", True, by="api:ops")
            await series.sample()
            view = series.view("feed")
        rates = [p["events_per_minute"] for p in view["points"]]
        assert rates[0] == 0 and rates[1] > 0 and rates[2] == 0
        assert [(c["state"], c["detail"]) for c in view["changes"]] == [
            ("running", None),
            ("failed", "KeyError: 'x'"),
            ("paused", "paused by api:ops"),
        ]
        assert view["points"][0]["last_event_age_seconds"] is None  # no event yet

    async def test_a_late_watcher_is_aligned_and_an_unknown_one_is_empty(
        self, tmp_path: Path
    ) -> None:
        """A watcher first seen at the third sample has nulls for the first two; a writer of
        events with no status row has its rate; a name never seen has no points."""
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            await backend.events.aregister_assets([Asset("orders")])
            series = WatcherSeries(backend, interval=60)
            await series.sample()
            await series.sample()
            await report(backend, "late", "running")
            await commit(backend, "task:load", 5)
            await series.sample()
            late, task = series.view("late"), series.view("task:load")
            assert [p["events_per_minute"] for p in late["points"]] == [None, None, 0]
            assert task["points"][-1]["events_per_minute"] > 0
            assert series.view("nobody")["points"] == []
            assert not series.knows("nobody") and series.knows("late")

    async def test_the_window_and_the_changes_keep_their_length(self, tmp_path: Path) -> None:
        """Past the window's samples the oldest point goes, the rows stay aligned with the
        times; past MAX_CHANGES state changes the oldest change goes."""
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            await backend.events.aregister_assets([Asset("orders")])
            series = WatcherSeries(backend, interval=1800)  # two points an hour
            assert series.points == 2
            for n in range(MAX_CHANGES + 3):
                await report(backend, "feed", "running" if n % 2 else "backing_off")
                await series.sample()
            view = series.view("feed")
        assert len(view["points"]) == 2 == len(series.times)
        assert len(view["changes"]) == MAX_CHANGES
        assert view["changes"][-1]["state"] == "backing_off"

    async def test_with_a_runner_the_rate_comes_from_its_counters(self, tmp_path: Path) -> None:
        """A daemon's series reads the runner's counters: events written straight to the log
        do not count, the runner's do, and a watcher the runner does not run has no rate."""
        totals: dict[str, int] = {"feed": 0}
        rates = RunnerRates(lambda: dict(totals), lambda: list(totals))
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            await backend.events.aregister_assets([Asset("orders")])
            await report(backend, "feed", "running")
            await report(backend, "other", "running")
            series = WatcherSeries(backend, interval=60, rates=rates)
            await series.sample()
            await commit(backend, "feed", 300)  # in the log, not by this runner
            totals["feed"] = 12
            await series.sample()
            feed, other = series.view("feed"), series.view("other")
        feed_rates = [p["events_per_minute"] for p in feed["points"]]
        minutes = (series.times[1] - series.times[0]).total_seconds() / 60
        assert feed_rates[0] == 0
        assert abs(feed_rates[1] - 12 / minutes) <= 1e-3 * feed_rates[1]  # 12, not 300 or 312
        assert [p["events_per_minute"] for p in other["points"]] == [None, None]
