"""``/metrics``: the collector over a real runner, parsed by prometheus-client's own parser;
and the API served by a real ``watchkeeper triggerer`` process."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from watchkeeper.store import Asset, BaseStateBackend, MemoryStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, TaskSpec, TriggerStatus, encode_json
from watchkeeper.triggerer import TriggerEvent, TriggerRunner
from watchkeeper.triggerer.api import Metrics, make_token

from tests.support.api import daemon_api
from tests.support.daemons import (
    append_lines,
    asset_file,
    daemon,
    free_port,
    terminate,
    wait_for_api,
    wait_until,
)
from tests.support.runtime import FAST, Scripted, spec

ORDERS, BILLS = Asset("orders"), Asset("bills")


def samples(text: str) -> dict[str, list[Sample]]:
    """Every sample of the exposition, by sample name."""
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(found: dict[str, list[Sample]], name: str, **labels: str) -> float:
    (match,) = [s for s in found[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return match.value


def events(n: int) -> list[TriggerEvent]:
    return [TriggerEvent({"i": i}, state={"wm": i}) for i in range(1, n + 1)]


class Measuring(Scripted):
    """A scripted trigger that measures its source (and names one measure badly)."""

    def source_gauges(self) -> dict[str, float]:
        return {"slot_lag_bytes": 4096.0, "Not A Name": 1.0}


class TestCollector:
    async def test_runner_metrics_parse_and_count(self, tmp_path: Path) -> None:
        """Events per asset and watcher, up/state, commit latency and batch size histograms
        come out of a running runner in valid Prometheus text."""
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            await backend.events.aregister_assets([ORDERS, BILLS])
            async with TriggerRunner(backend, FAST) as runner:
                a, b = Scripted(events(3)), Scripted(events(2))
                await runner.start_trigger(spec("a", a, ORDERS))
                await runner.start_trigger(spec("b", b, ORDERS, BILLS))
                with anyio.fail_after(10):
                    await a.drained.wait()
                    await b.drained.wait()
                metrics = Metrics(backend, runner=runner)
                await metrics.prepare()
                found = samples(metrics.render().decode())
        assert value(found, "watchkeeper_events_total", asset="orders", watcher="a") == 3
        assert value(found, "watchkeeper_events_total", asset="bills", watcher="b") == 2
        assert value(found, "watchkeeper_events_total", asset="orders", watcher="b") == 2
        assert value(found, "watchkeeper_watcher_up", watcher="a") == 1
        assert value(found, "watchkeeper_watcher_state", watcher="a", state="running") == 1
        assert value(found, "watchkeeper_watcher_state", watcher="a", state="failed") == 0
        assert value(found, "watchkeeper_watchers", state="running") == 2
        assert value(found, "watchkeeper_commit_seconds_count", backend="sqlite") == 5
        inf = value(found, "watchkeeper_commit_seconds_bucket", backend="sqlite", le="+Inf")
        assert inf == 5
        assert value(found, "watchkeeper_commit_batch_size_count", backend="sqlite") >= 1
        assert value(found, "watchkeeper_fenced_writes_total") == 0
        stamp = value(found, "watchkeeper_watcher_last_event_timestamp_seconds", watcher="a")
        assert abs(stamp - datetime.now(UTC).timestamp()) < 3600

    async def test_what_a_watcher_measures_of_its_source_is_a_gauge(self, tmp_path: Path) -> None:
        """A trigger with source_gauges() gets a watchkeeper_source_<name> gauge per measure
        whose name is a metric name; the others have none."""
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            await backend.events.aregister_assets([ORDERS])
            async with TriggerRunner(backend, FAST) as runner:
                measuring, plain = Measuring(events(1)), Scripted(events(1))
                await runner.start_trigger(spec("cdc", measuring, ORDERS))
                await runner.start_trigger(spec("plain", plain, ORDERS))
                with anyio.fail_after(10):
                    await measuring.drained.wait()
                    await plain.drained.wait()
                metrics = Metrics(backend, runner=runner)
                text = metrics.render().decode()
        found = samples(text)
        assert value(found, "watchkeeper_source_slot_lag_bytes", watcher="cdc") == 4096
        assert len(found["watchkeeper_source_slot_lag_bytes"]) == 1
        assert "Not A Name" not in text
        assert "# TYPE watchkeeper_source_slot_lag_bytes gauge" in text

    async def test_failures_are_counted_in_total(self, tmp_path: Path) -> None:
        """A watcher that keeps failing shows its failed runs and the failed state."""
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            await backend.events.aregister_assets([ORDERS])
            async with TriggerRunner(backend, FAST) as runner:
                await runner.start_trigger(spec("bad", Scripted([], then="raise"), ORDERS))

                def failed() -> bool:
                    return [s.state for s in runner.statuses()] == ["failed"]

                await wait_until(failed, "the trigger to fail")
                metrics = Metrics(backend, runner=runner)
                found = samples(metrics.render().decode())
        assert value(found, "watchkeeper_watcher_failures_total", watcher="bad") == 3
        assert value(found, "watchkeeper_watcher_up", watcher="bad") == 0
        assert value(found, "watchkeeper_watcher_state", watcher="bad", state="failed") == 1

    async def test_per_watcher_series_are_capped(self, tmp_path: Path) -> None:
        """Past max_watcher_series, the busiest watchers keep their series, the totals still
        count everyone, and the number left out is reported."""
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            await backend.events.aregister_assets([ORDERS])
            async with TriggerRunner(backend, FAST) as runner:
                triggers = {name: Scripted(events(n)) for name, n in (("x", 1), ("y", 4), ("z", 2))}
                for name, trigger in triggers.items():
                    await runner.start_trigger(spec(name, trigger, ORDERS))
                with anyio.fail_after(10):
                    for trigger in triggers.values():
                        await trigger.drained.wait()
                found = samples(
                    Metrics(backend, runner=runner, max_watcher_series=2).render().decode()
                )
        assert {s.labels["watcher"] for s in found["watchkeeper_watcher_up"]} == {"y", "z"}
        assert value(found, "watchkeeper_watcher_series_dropped") == 1
        assert value(found, "watchkeeper_watchers", state="running") == 3

    async def test_label_values_are_escaped_and_collect_gives_families(
        self, tmp_path: Path
    ) -> None:
        """A watcher name with a quote, a backslash and a newline survives the text format, and
        ``collect()`` yields the same families for a prometheus-client registry."""
        name = 'we"ird\\na\nme'
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            status = TriggerStatus("t1", "m.C", ("orders",), (name,), "running", events=1)
            await backend.status.asave_trigger_status([status])
            metrics = Metrics(backend)
            await metrics.prepare()
            found = samples(metrics.render().decode())
            families = {f.name for f in metrics.collect()}
        assert value(found, "watchkeeper_watcher_up", watcher=name) == 1
        assert {"watchkeeper_events", "watchkeeper_watcher_state"} <= families

    async def test_without_a_runner_the_status_rows_are_used(self, tmp_path: Path) -> None:
        """``watchkeeper api`` (no runner) reports the watchers the daemons saved."""
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            status = TriggerStatus(
                "t1", "m.C", ("orders",), ("feed",), "backing_off", failures=2, events=9
            )
            await backend.status.asave_trigger_status([status])
            metrics = Metrics(backend)
            await metrics.prepare()
            found = samples(metrics.render().decode())
        assert value(found, "watchkeeper_events_total", asset="orders", watcher="feed") == 9
        assert value(found, "watchkeeper_watcher_state", watcher="feed", state="backing_off") == 1
        assert "watchkeeper_commit_seconds_count" not in found

    async def test_status_rows_are_capped_by_events(self, tmp_path: Path) -> None:
        """Without a runner the cap keeps the saved watchers with the most events; the
        per-state totals still count every saved watcher."""
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            await backend.status.asave_trigger_status(
                [
                    TriggerStatus(f"t{n}", "m.C", ("orders",), (f"w{n}",), state, events=n)
                    for n, state in ((5, "running"), (1, "failed"), (9, "running"))
                ]
            )
            metrics = Metrics(backend, max_watcher_series=2)
            await metrics.prepare()
            found = samples(metrics.render().decode())
        assert {s.labels["watcher"] for s in found["watchkeeper_watcher_up"]} == {"w5", "w9"}
        assert value(found, "watchkeeper_watcher_series_dropped") == 1
        assert value(found, "watchkeeper_watchers", state="running") == 2
        assert value(found, "watchkeeper_watchers", state="failed") == 1


class TestTaskMetrics:
    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    async def test_task_runs_and_pending_events(self, tmp_path: Path, kind: str) -> None:
        """With tasks in the store, /metrics counts runs per task and state and the events
        each task has not yet taken, per scheduled asset."""
        opened: BaseStateBackend = (
            MemoryStateBackend() if kind == "memory" else SqliteStateBackend(tmp_path / "s.db")
        )
        async with opened as backend:
            store: Any = backend
            await store.events.aregister_assets([ORDERS, BILLS])
            await store.tasks.async_tasks(
                [TaskSpec("load", ("orders", "bills"), mode="any", max_events=2)]
            )
            for i in range(3):
                commit = EventCommit("w", ("orders",), encode_json({"i": i}, what="payload"))
                await store.events.acommit(commit)
            await store.tasks.acreate_run("load")
            (run,) = await store.tasks.aclaim_runs("me", limit=1, ttl=30)
            await store.tasks.afinish_run(run.id, "me", run.lease_token, success=True)
            await store.tasks.acreate_run("load")
            metrics = Metrics(backend)
            await metrics.prepare()
            found = samples(metrics.render().decode())
        assert value(found, "watchkeeper_task_runs", task="load", state="success") == 1
        assert value(found, "watchkeeper_task_runs", task="load", state="queued") == 1
        assert value(found, "watchkeeper_task_runs", task="load", state="failed") == 0
        assert value(found, "watchkeeper_task_pending_events", task="load", asset="orders") == 0
        assert value(found, "watchkeeper_task_pending_events", task="load", asset="bills") == 0

    async def test_pending_events_before_any_run(self, tmp_path: Path) -> None:
        """Events committed after a task is registered show as pending until a run takes them."""
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            await backend.events.aregister_assets([ORDERS])
            await backend.tasks.async_tasks([TaskSpec("load", ("orders",))])
            for i in range(4):
                commit = EventCommit("w", ("orders",), encode_json({"i": i}, what="payload"))
                await backend.events.acommit(commit)
            metrics = Metrics(backend)
            await metrics.prepare()
            found = samples(metrics.render().decode())
        assert value(found, "watchkeeper_task_pending_events", task="load", asset="orders") == 4
        assert value(found, "watchkeeper_task_runs", task="load", state="queued") == 0


class TestInDaemon:
    async def test_ready_and_leases_held_inside_a_daemon(
        self, tmp_path: Path, watchers: Path
    ) -> None:
        """Served from a daemon, /readyz is 200 while it holds its leases and /metrics
        counts them."""
        from watchkeeper.triggerer import Settings, TriggererSettings

        source = tmp_path / "lines.txt"
        append_lines(source, 1, 1)
        (watchers / "orders.py").write_text(asset_file("orders", source))
        settings = Settings(triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0))
        async with daemon_api(settings) as client:
            ready = await client.get("/readyz")
            found = samples((await client.get("/metrics")).text)
        assert ready.status_code == 200, ready.text
        assert value(found, "watchkeeper_leases_held") == 1
        assert value(found, "watchkeeper_loop_lag_seconds") >= 0


@pytest.mark.slow
class TestDaemonServesTheApi:
    @pytest.fixture
    def port(self, env: dict[str, str]) -> Iterator[int]:
        port = free_port()
        env["WATCHKEEPER__API__PORT"] = str(port)
        yield port

    async def test_daemon_serves_metrics_and_pauses_through_the_api(
        self,
        tmp_path: Path,
        watchers: Path,
        env: dict[str, str],
        log_file: IO[bytes],
        db_path: Path,
        port: int,
    ) -> None:
        """``watchkeeper triggerer`` serves /healthz, /metrics and the API on its port, a
        pause through the API stops the watcher, and SIGTERM still stops it with status 0."""
        source = tmp_path / "lines.txt"
        append_lines(source, 1, 3)
        (watchers / "orders.py").write_text(asset_file("orders", source))
        async with SqliteStateBackend(db_path) as backend:
            text, row = make_token("ops", ["operate", "read"], now=datetime.now(UTC))
            await backend.controls.acreate_token(row)
        async with daemon(tmp_path, watchers, env, log_file, reload_interval=None) as process:
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=base, timeout=5) as client:
                await wait_for_api(client, process)

                async def counted() -> bool:
                    found = samples((await client.get("/metrics")).text)
                    got = found.get("watchkeeper_events_total", [])
                    return [s.value for s in got] == [3.0]

                await wait_until(counted, "three events in /metrics", process)
                assert (await client.get("/readyz")).status_code == 200
                auth = {"Authorization": f"Bearer {text}"}
                paused = await client.post("/api/v1/watchers/orders_feed/pause", headers=auth)
                assert paused.status_code == 202

                async def stopped() -> bool:
                    rows = (await client.get("/api/v1/watchers", headers=auth)).json()
                    return [w["state"] for w in rows["watchers"]] == ["paused"]

                await wait_until(stopped, "the watcher to be paused", process)
            assert await terminate(process) == 0
