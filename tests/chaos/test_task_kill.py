"""kill -9 of real ``watchkeeper worker`` processes: every event in exactly one successful run.

10,000 events flow into ``chaos_src`` while workers run ``consume`` (on ``chaos_src``, with the
outlet ``chaos_mid``) and ``chained`` (on ``chaos_mid``), and a random worker is SIGKILLed at
least 20 times and restarted. On SQLite one worker runs; on a fresh PostgreSQL database two.
Counted with raw SQL: each event of each scheduled asset is in exactly one successful run of
the task, in no other run at all, no run failed, and ``chaos_mid`` holds one event per
successful ``consume`` run.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend

from tests.chaos._task_chaos import Raw, TaskChaos, Verdict
from tests.support.postgres import fresh_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
EVENTS = 10_000
KILLS = 20


def check(consume: Verdict, chained: Verdict, events: int = EVENTS) -> None:
    for verdict in (consume, chained):
        assert len(verdict.expected) > 0, verdict.task
        assert verdict.missing == set(), f"{verdict.task}: events in no successful run"
        assert verdict.twice == 0, f"{verdict.task}: events in two successful runs"
        assert len(verdict.in_any_run) == len(set(verdict.in_any_run)), "an event in two runs"
        assert verdict.failed_runs == 0, verdict.task
    assert len(consume.expected) == events
    assert consume.retried_runs + chained.retried_runs > 0, "no kill landed inside a run"
    # One outlet event per successful upstream run, and those are exactly chained's events.
    assert len(consume.outlets) == consume.success_runs
    assert set(consume.outlets) == chained.expected


class TestWorkersKilled:
    async def test_sqlite_one_worker(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """SQLite, one worker SIGKILLed 20 times: every event in exactly one successful run."""
        db = tmp_path / "chaos.db"
        chaos = TaskChaos(
            tmp_path, f"sqlite:///{db}", workers=1, events=EVENTS, kills=KILLS, seed=SEED
        )
        raw = Raw(path=db)
        async with SqliteStateBackend(db) as backend:
            await chaos.run(backend, raw)
        consume = await raw.verdict("consume", "chaos_src")
        chained = await raw.verdict("chained", "chaos_mid")
        with capsys.disabled():
            print(
                f"\nchaos tasks sqlite seed={SEED} kills={chaos.kills} "
                f"consume_runs={consume.success_runs} chained_runs={chained.success_runs} "
                f"retried={consume.retried_runs + chained.retried_runs}"
            )
        assert chaos.kills >= KILLS
        check(consume, chained)

    @pytest.mark.postgres
    async def test_postgres_two_workers(
        self, pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A fresh PostgreSQL database, two workers, 20 SIGKILLs: every event exactly once."""
        async with fresh_pg_database(pg_dsn, prefix="wk_chaos") as (_, dsn):
            chaos = TaskChaos(tmp_path, dsn, workers=2, events=EVENTS, kills=KILLS, seed=SEED)
            raw = Raw(dsn=dsn)
            async with PostgresStateBackend(dsn) as backend:
                await chaos.run(backend, raw)
            consume = await raw.verdict("consume", "chaos_src")
            chained = await raw.verdict("chained", "chaos_mid")
        with capsys.disabled():
            print(
                f"\nchaos tasks postgres seed={SEED} kills={chaos.kills} "
                f"consume_runs={consume.success_runs} chained_runs={chained.success_runs} "
                f"retried={consume.retried_runs + chained.retried_runs}"
            )
        assert chaos.kills >= KILLS
        check(consume, chained)

    async def test_sqlite_one_worker_tries_in_child_processes(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The same under ``isolation="process"``: a SIGKILL of the worker takes its children
        with it; every event is still in exactly one successful run."""
        db = tmp_path / "chaos.db"
        events, kills = 3_000, 10
        chaos = TaskChaos(
            tmp_path,
            f"sqlite:///{db}",
            workers=1,
            events=events,
            kills=kills,
            seed=SEED,
            isolation="process",
        )
        raw = Raw(path=db)
        async with SqliteStateBackend(db) as backend:
            await chaos.run(backend, raw)
        consume = await raw.verdict("consume", "chaos_src")
        chained = await raw.verdict("chained", "chaos_mid")
        with capsys.disabled():
            print(
                f"\nchaos tasks sqlite isolation=process seed={SEED} kills={chaos.kills} "
                f"consume_runs={consume.success_runs} chained_runs={chained.success_runs} "
                f"retried={consume.retried_runs + chained.retried_runs}"
            )
        assert chaos.kills >= kills
        check(consume, chained, events)
