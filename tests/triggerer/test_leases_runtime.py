"""Leases in the runtime: fenced triggers stop on a lost lease; daemons share the watchers.

The runner tests run on every built-in backend; the daemon tests run two in-process daemons
(different owners) on one SQLite file, with a long heartbeat so nothing happens unless the test
calls ``renew_leases()``. Time is the backend's settable clock.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from watchkeeper.store import (
    Asset,
    AssetScope,
    MemoryStateBackend,
    SqliteStateBackend,
)
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer import (
    BaseEventTrigger,
    Daemon,
    ReloadReport,
    Settings,
    TriggererSettings,
    TriggerEvent,
    TriggerRunner,
    WatchSpec,
)
from watchkeeper.triggerer.daemon._leases import LeaseKeeper, is_dead_local_owner
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers

from tests.support.clock import Clock
from tests.support.daemons import append_lines, asset_file, committed, lines_settings
from tests.support.runtime import fast, watch_logs

ALSO_ON_UVLOOP = True  # the runner on asyncio's loop and on uvloop (see tests/conftest.py)
ORDERS = Asset("orders")
TTL = 7200.0  # above the daemons' renewal interval of 3600 s, which never fires here
WAIT = 10.0


class Fed(BaseEventTrigger):
    """Yields one event per number the test feeds it, with the number as watermark ``wm``.

    ``airflow=True`` writes the watermark the Airflow way first (``aset``, then a plain
    ``yield``). ``committed`` lists the numbers whose event was durable when the generator
    resumed.
    """

    def __init__(self, *, airflow: bool = False) -> None:
        self.airflow = airflow
        self.feed, self._items = anyio.create_memory_object_stream[int](10)
        self.committed: list[int] = []
        self.runs = 0
        self.cleanups = 0
        self._waits: list[tuple[int, anyio.Event]] = []

    async def wait_committed(self, count: int) -> None:
        """Return once ``count`` events were committed (at most WAIT seconds)."""
        event = anyio.Event()
        if len(self.committed) >= count:
            return
        self._waits.append((count, event))
        with anyio.fail_after(WAIT):
            await event.wait()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"airflow": self.airflow}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.runs += 1
        async for n in self._items:
            if self.airflow:
                await self.asset_state_store.aset("wm", n)
                yield TriggerEvent({"n": n})
            else:
                yield TriggerEvent({"n": n}, state={"wm": n})
            self.committed.append(n)
            for count, event in self._waits:
                if len(self.committed) >= count:
                    event.set()

    async def cleanup(self) -> None:
        self.cleanups += 1

    def close(self) -> None:
        self.feed.close()
        self._items.close()


@pytest.fixture
async def store(backend: BaseStateBackend) -> BaseStateBackend:
    """The backend on a settable clock, with ``orders`` registered."""
    backend.clock = Clock()
    await backend.events.aregister_assets([ORDERS])
    return backend


async def payloads(backend: BaseStateBackend) -> list[Any]:
    return [e.payload["n"] for e in await backend.events.alist_events()]


class TestFencedRunner:
    async def test_a_fenced_trigger_commits_under_its_lease(self, store: BaseStateBackend) -> None:
        """A trigger started with the token of a lease its owner holds commits normally."""
        (token,) = (await store.leases.aclaim_leases("d1", ["w"], TTL)).values()
        trigger = Fed()
        try:
            async with TriggerRunner(store, fast(owner="d1")) as runner:
                await runner.start_trigger(WatchSpec("w", trigger, (ORDERS,), fence_token=token))
                await trigger.feed.send(1)
                await trigger.wait_committed(1)
        finally:
            trigger.close()
        assert await payloads(store) == [1]
        assert await store.aget(AssetScope(name="orders"), "wm") == 1

    @pytest.mark.parametrize("airflow", [False, True], ids=["state", "aset"])
    async def test_a_lost_lease_stops_the_trigger_without_a_failure(
        self, store: BaseStateBackend, airflow: bool
    ) -> None:
        """Once another owner took the lease, the next write is refused: the trigger stops
        (``stopped``, log ``lease_lost``, no failure, no restart) and nothing is written."""
        await store.leases.aclaim_leases("d1", ["w"], TTL)
        trigger = Fed(airflow=airflow)
        try:
            with watch_logs() as logs:
                async with TriggerRunner(store, fast(owner="d1")) as runner:
                    await runner.start_trigger(WatchSpec("w", trigger, (ORDERS,), fence_token=1))
                    await trigger.feed.send(1)
                    await trigger.wait_committed(1)
                    store.clock.advance(TTL + 1)  # type: ignore[attr-defined]
                    assert await store.leases.aclaim_leases("d2", ["w"], TTL) == {"w": 2}
                    await trigger.feed.send(2)
                    (entry,) = await logs.wait_for("lease_lost", trigger_id="w")
                    (status,) = runner.statuses()
                    assert (status.state, status.failures) == ("stopped", 0)
                    assert status.last_error is not None and "LeaseLostError" in status.last_error
                    assert runner.trigger_ids() == {"w"}  # left for its owner to stop
        finally:
            trigger.close()
        assert (entry["owner"], entry["token"]) == ("d1", 1)
        assert "'d2' holds it with token 2" in entry["reason"]
        assert (trigger.runs, trigger.cleanups, trigger.committed) == (1, 1, [1])
        assert await payloads(store) == [1]
        assert await store.aget(AssetScope(name="orders"), "wm") == 1
        assert logs.named("trigger_error") == []

    async def test_a_fence_token_needs_an_owner(self) -> None:
        """Starting a spec with a fence_token on a runner without owner is refused."""
        trigger = Fed()
        try:
            async with MemoryStateBackend() as backend, TriggerRunner(backend, fast()) as runner:
                with pytest.raises(ValueError, match=r"RunnerConfig\.owner"):
                    await runner.start_trigger(WatchSpec("w", trigger, (ORDERS,), fence_token=1))
                assert runner.trigger_ids() == frozenset()
        finally:
            trigger.close()

    @pytest.mark.parametrize("token", [0, -1, True, "1"])
    def test_a_bad_fence_token_is_refused(self, token: object) -> None:
        """A fence_token must be None or an int >= 1."""
        trigger = Fed()
        try:
            with pytest.raises(ValueError, match="fence_token"):
                WatchSpec("w", trigger, (ORDERS,), fence_token=token)  # type: ignore[arg-type]
        finally:
            trigger.close()


class TestSharedDaemons:
    """Two daemons, each with its own owner, on one SQLite file."""

    @pytest.fixture(autouse=True)
    def _unload(self) -> Iterator[None]:
        yield
        unload_watchers()

    @pytest.fixture
    def source(self, tmp_path: Path) -> Path:
        return tmp_path / "alpha.txt"

    @pytest.fixture
    def settings(self, tmp_path: Path, source: Path) -> Settings:
        return lines_settings(
            tmp_path,
            source,
            heartbeat_interval=3600,
            lease_renew_interval=3600,  # no renewal unless the test calls renew_leases()
            lease_ttl=TTL,
        )

    @pytest.fixture
    async def db(self, tmp_path: Path) -> AsyncIterator[SqliteStateBackend]:
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            backend.clock = Clock()
            yield backend

    async def wait_events(self, db: BaseStateBackend, count: int) -> list[Any]:
        with anyio.fail_after(WAIT):
            while True:
                events = await db.events.alist_events(asset="alpha")
                if len(events) >= count:
                    return [e.payload["n"] for e in events]
                await anyio.sleep(0.02)

    async def test_the_second_daemon_takes_over_a_released_lease(
        self, settings: Settings, db: SqliteStateBackend, source: Path
    ) -> None:
        """While d1 holds the lease d2 runs nothing; once d1 exits, d2 takes the lease (token
        2) and continues after the watermark: no gap, no duplicate."""
        append_lines(source, 1, 3)
        entered, leave, left = anyio.Event(), anyio.Event(), anyio.Event()
        first: list[Daemon] = []

        async def run_d1() -> None:  # its own task, so it can exit while d2 runs on
            async with Daemon(settings, backend=db, owner="d1") as d1:
                first.append(d1)
                entered.set()
                await leave.wait()
            left.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_d1)
            with anyio.fail_after(WAIT):
                await entered.wait()
            (trigger_id,) = first[0].groups
            async with Daemon(settings, backend=db, owner="d2") as d2:
                assert (d2.groups, d2.leases.held) == ({}, {})
                assert await self.wait_events(db, 3) == [1, 2, 3]
                report = await d2.renew_leases()
                assert (report.started, d2.groups) == ([], {})
                leave.set()  # d1 exits cleanly and releases its lease
                with anyio.fail_after(WAIT):
                    await left.wait()
                # d2 takes the released lease at once when the release wakes its lease loop,
                # or at the renewal below, whichever comes first.
                with anyio.fail_after(WAIT):
                    while d2.leases.held != {trigger_id: 2}:
                        await d2.renew_leases()
                        await anyio.sleep(0.05)
                leases = await db.leases.alist_leases()
                assert [(x.owner, x.token) for x in leases] == [("d2", 2)]
                assert trigger_id in d2.groups
                append_lines(source, 4, 5)
                assert await self.wait_events(db, 5) == [1, 2, 3, 4, 5]
        assert await db.aget(AssetScope(name="alpha"), "watermark") == 5

    async def test_an_expired_lease_moves_and_the_old_holder_stops(
        self, settings: Settings, db: SqliteStateBackend, source: Path
    ) -> None:
        """When d1's lease expires (d1 paused), d2 takes it with the next token; d1's stale
        trigger writes nothing and d1's next heartbeat stops it."""
        append_lines(source, 1, 2)
        async with (
            Daemon(settings, backend=db, owner="d1") as d1,
            Daemon(settings, backend=db, owner="d2") as d2,
        ):
            (trigger_id,) = d1.groups
            assert d2.groups == {}
            assert await self.wait_events(db, 2) == [1, 2]
            db.clock.advance(TTL + 1)  # type: ignore[attr-defined]
            with watch_logs() as logs:
                assert (await d2.renew_leases()).started == [trigger_id]
                assert d2.leases.held == {trigger_id: 2}
                append_lines(source, 3, 4)
                assert await self.wait_events(db, 4) == [1, 2, 3, 4]
                report = await d1.renew_leases()
                assert report.stopped == [trigger_id]
                assert (d1.groups, d1.leases.held) == ({}, {})
            assert logs.named("lease_moved", trigger_id=trigger_id)
            # d1 stopped it without saving a "stopped" row over the one d2 owns now.
            assert [r for r in await db.status.alist_trigger_status() if r.owner == "d1"] == []
        assert await db.aget(AssetScope(name="alpha"), "watermark") == 4
        assert await self.wait_events(db, 4) == [1, 2, 3, 4]

    async def test_a_trigger_stopped_by_a_refused_write_restarts_with_its_lease(
        self, settings: Settings, db: SqliteStateBackend, source: Path
    ) -> None:
        """A lease that lapsed without anyone taking it refuses the next write (the trigger
        stops); the holder's next heartbeat renews it and restarts the trigger, which then
        commits what was refused."""
        append_lines(source, 1, 1)
        async with Daemon(settings, backend=db, owner="d1") as d1:
            (trigger_id,) = d1.groups
            assert await self.wait_events(db, 1) == [1]
            with watch_logs() as logs:
                # The daemon's own join wakes its lease loop once; if that renewal lands just
                # after the clock moved, the lease is live again and the line commits: move the
                # clock again for the next line (the join wakes it only once).
                for last in (2, 3):
                    db.clock.advance(TTL + 1)  # type: ignore[attr-defined]
                    append_lines(source, last, last)
                    with anyio.move_on_after(4):  # inside wait_for's own 5 s
                        await logs.wait_for("lease_lost", trigger_id=trigger_id)
                    if logs.named("lease_lost", trigger_id=trigger_id):
                        break
                assert [s.state for s in d1.runner.statuses()] == ["stopped"]
                report = await d1.renew_leases()
            assert (report.stopped, report.started) == ([trigger_id], [trigger_id])
            assert d1.leases.held == {trigger_id: 1}
            expected = list(range(1, last + 1))
            assert await self.wait_events(db, last) == expected

    async def test_without_lease_support_every_trigger_runs_unfenced(
        self, settings: Settings
    ) -> None:
        """A custom backend without leases: the daemon runs every trigger, as a lone daemon."""

        class NoLeases(MemoryStateBackend):
            def __init__(self) -> None:
                super().__init__()
                self.services = replace(self.services, leases=None)

        with watch_logs() as logs:
            async with NoLeases() as backend, Daemon(settings, backend=backend) as daemon:
                assert len(daemon.groups) == 1
                assert (await daemon.renew_leases()).stopped == []
                assert not daemon.leases.supported
        assert len(logs.named("leases_unsupported")) == 1

    async def test_capacity_splits_the_watchers_between_daemons(
        self, settings: Settings, db: SqliteStateBackend, tmp_path: Path
    ) -> None:
        """Daemons with room for one trigger each claim one lease each: they share the work."""
        beta = tmp_path / "beta.txt"
        (settings.triggerer.watchers_path / "beta.py").write_text(asset_file("beta", beta))
        narrow = settings.model_copy(
            update={"triggerer": settings.triggerer.model_copy(update={"capacity": 1})}
        )
        async with (
            Daemon(narrow, backend=db, owner="d1") as d1,
            Daemon(narrow, backend=db, owner="d2") as d2,
        ):
            assert len(d1.groups) == len(d2.groups) == 1
            assert set(d1.groups).isdisjoint(d2.groups)
            assert await d1.renew_leases() == await d2.renew_leases() == ReloadReport()
            leases = await db.leases.alist_leases()
            assert sorted((x.owner, x.token) for x in leases) == [("d1", 1), ("d2", 1)]


class TestNodeLeaseDeadline:
    async def test_a_daemon_past_its_deadline_stops_its_watchers_and_resumes_them(
        self, tmp_path: Path
    ) -> None:
        """While the store cannot renew the node lease (another connection holds SQLite's
        write lock), the daemon stops its watchers once its monotonic deadline passed
        (``node_lease_lapsed``) but keeps their leases; once renewing works again and finds
        the lease still its own, it runs them again under the same token, without a gap."""
        source = tmp_path / "alpha.txt"
        append_lines(source, 1, 2)
        settings = lines_settings(
            tmp_path,
            source,
            heartbeat_interval=0.2,
            lease_renew_interval=0.2,
            lease_ttl=1.0,
            lease_margin=0.5,
        )
        db_path = tmp_path / "state.db"

        def lock() -> sqlite3.Connection:
            conn = sqlite3.connect(
                db_path, isolation_level=None, timeout=30, check_same_thread=False
            )
            conn.execute("BEGIN IMMEDIATE")
            return conn

        def unlock(conn: sqlite3.Connection) -> None:
            conn.execute("ROLLBACK")
            conn.close()

        async with SqliteStateBackend(db_path) as db, Daemon(settings, backend=db) as d:
            (trigger_id,) = d.groups
            await committed(db, 2)
            with watch_logs() as logs:
                held = await anyio.to_thread.run_sync(lock)
                try:
                    (lapsed,) = await logs.wait_for("node_lease_lapsed")
                    assert lapsed["stopped"] == 1
                    assert d.groups == {}
                    assert d.leases.held == {trigger_id: 1}  # kept: not known to be lost
                finally:
                    await anyio.to_thread.run_sync(unlock, held)
                append_lines(source, 3, 3)
                await committed(db, 3)
            assert list(d.groups) == [trigger_id]
            assert [(x.owner, x.token) for x in await db.leases.alist_leases()] == [(d.owner, 1)]
            assert [e.payload["n"] for e in await db.events.alist_events()] == [1, 2, 3]


class TestLeaseSettings:
    def test_the_ttl_defaults_to_three_renewals(self) -> None:
        """Without lease_ttl a node lease lasts three renewals; an explicit one wins."""
        assert TriggererSettings().lease_seconds == 3
        assert TriggererSettings(lease_renew_interval=2).lease_seconds == 6
        assert TriggererSettings(lease_renew_interval=2, lease_ttl=5).lease_seconds == 5

    @pytest.mark.parametrize("ttl", [1.0, 2.0])
    def test_a_ttl_within_one_renewal_is_refused(self, ttl: float) -> None:
        """A lease_ttl not above the renewal interval would lapse between renewals: refused."""
        with pytest.raises(ValueError, match=r"lease_ttl \(.*\) must exceed lease_renew_interval"):
            TriggererSettings(lease_renew_interval=2, lease_ttl=ttl)

    def test_a_margin_past_the_next_renewal_is_refused(self) -> None:
        """A lease_margin that would stop the watchers before the next renewal is due is
        refused; unset, it is half a renewal interval."""
        with pytest.raises(ValueError, match=r"lease_margin \(2.0\) must be below"):
            TriggererSettings(lease_margin=2)
        assert TriggererSettings().lease_margin_seconds == 0.5
        assert TriggererSettings(lease_margin=1.5).lease_margin_seconds == 1.5


class TestDeadLocalOwner:
    def test_a_gone_process_of_this_host_is_dead(self) -> None:
        """An owner naming this host and a pid that no longer exists is recognised as dead."""
        proc = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        gone = int(proc.stdout)
        host = socket.gethostname()
        assert is_dead_local_owner(f"{host}:{gone}:abc123")
        assert not is_dead_local_owner(f"{host}:{os.getpid()}:abc123")  # this very process
        assert not is_dead_local_owner(f"{host}:1:abc123")  # alive (init)
        assert not is_dead_local_owner(f"other-host:{gone}:abc123")  # not ours to judge
        assert not is_dead_local_owner("not-an-identity")

    async def test_leases_of_a_killed_local_daemon_are_taken_at_once(self, tmp_path: Path) -> None:
        """A node lease still live but held by a dead daemon of this host is reaped at the
        next renewal, and its leases taken over without waiting for its time to live."""
        proc = await anyio.run_process([sys.executable, "-c", "import os; print(os.getpid())"])
        dead_owner = f"{socket.gethostname()}:{int(proc.stdout)}:dead00"
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            assert await backend.leases.aclaim_leases(dead_owner, ["t1"], 3600) == {"t1": 1}
            keeper = LeaseKeeper(backend, "me:1:abc", ttl=30)
            await keeper.renew()
            assert keeper.free_hint(1, 0)
            assert await keeper.claim(["t1"]) == {"t1": 2}
