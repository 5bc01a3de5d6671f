"""kill -9 of a real ``watchkeeper triggerer``: nothing is lost or duplicated (DESIGN, Non-negotiables).

A daemon runs three watchers on streams of 10,000 sequence-numbered items fed from this process
through cross-process FakeEventSources, and is SIGKILLed at least 20 times at random points of
the stream, then restarted (see ``_chaos.py``). The watchers that keep their watermark with
``TriggerEvent(state=...)``, or take a redelivering queue with ``dedup_key``, must end with
exactly the stream; the one written the Airflow way (``aset`` then a plain ``yield``) is shown
to lose items. The runs for SQLite and PostgreSQL go on concurrently, once per module; each test
then checks one backend and one pattern and prints its ``chaos: ...`` summary line. The results
are counted with raw SQL (sqlite3, asyncpg) against the ids published into each source, not
through watchkeeper's API.
"""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend

from tests.chaos._chaos import ChaosPlan, ChaosRun, PatternResult, PostgresRaw, SqliteRaw
from tests.support.postgres import fresh_pg_database
from tests.support.requires import unavailable

# The module's fixture runs the whole chaos (both backends, concurrently) inside the first
# test's timeout: a couple of minutes on an idle two-core machine, more when it is loaded.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
PLAN = ChaosPlan(items=10_000, kills=20, pauses=4, seed=SEED)
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

Outcome = dict[str, PatternResult] | BaseException


async def _run_sqlite(work: Path) -> dict[str, PatternResult]:
    path = work / "state.db"

    def open_backend() -> BaseStateBackend:
        return SqliteStateBackend(path)

    raw = SqliteRaw(path)
    return await ChaosRun("sqlite", f"sqlite:///{path}", open_backend, raw, work, PLAN).run()


async def _run_postgres(work: Path, dsn: str) -> dict[str, PatternResult]:
    async with fresh_pg_database(dsn, prefix="wk_chaos") as (_, database):

        def open_backend() -> BaseStateBackend:
            return PostgresStateBackend(database)

        raw = PostgresRaw(database)
        return await ChaosRun("postgres", database, open_backend, raw, work, PLAN).run()


def _selected_backends(request: pytest.FixtureRequest) -> set[str]:
    """The backends whose tests in this module were selected (``-m``/``-k`` may drop some)."""
    selected: set[str] = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None:
            selected.add(str(callspec.params.get("backend")))
    return selected


@pytest.fixture(scope="module")
def chaos(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome]:
    """Each selected backend's chaos outcome: its per-pattern results, or what went wrong."""
    wanted = _selected_backends(request)
    outcomes: dict[str, Outcome] = {}
    dsn: str | None = None
    if "postgres" in wanted:
        try:
            dsn = request.getfixturevalue("pg_dsn")
        except (pytest.skip.Exception, pytest.fail.Exception) as exc:
            outcomes["postgres"] = exc  # skipped, or failed in CI: only the postgres tests

    async def attempt(
        name: str, run: Callable[..., Awaitable[dict[str, PatternResult]]], *args: Any
    ) -> None:
        try:
            outcomes[name] = await run(*args)
        except Exception as exc:  # noqa: BLE001 - reported by that backend's tests
            outcomes[name] = exc

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            if "sqlite" in wanted:
                work = tmp_path_factory.mktemp("chaos-sqlite")
                tg.start_soon(attempt, "sqlite", _run_sqlite, work)
            if dsn is not None:
                work = tmp_path_factory.mktemp("chaos-postgres")
                tg.start_soon(attempt, "postgres", _run_postgres, work, dsn)

    anyio.run(main, backend="asyncio")
    return outcomes


def _result(
    chaos: dict[str, Outcome], backend: str, pattern: str, capsys: pytest.CaptureFixture[str]
) -> PatternResult:
    outcome = chaos[backend]
    if isinstance(outcome, pytest.skip.Exception):
        unavailable(str(outcome))
    if isinstance(outcome, BaseException):
        raise outcome
    result = outcome[pattern]
    with capsys.disabled():
        print(f"\n{result.summary()} seed={SEED}")
    return result


@pytest.mark.parametrize("backend", BACKENDS)
class TestKillNine:
    @pytest.mark.parametrize("pattern", ["state", "dedup"])
    def test_events_are_exactly_the_stream(
        self,
        chaos: dict[str, Outcome],
        backend: str,
        pattern: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """After 20+ SIGKILLs the committed events are the published ids once each, in order."""
        result = _result(chaos, backend, pattern, capsys)
        assert result.kills >= 20
        assert result.items >= 10_000
        assert result.published == list(range(1, result.items + 1))
        assert (result.lost, result.duplicated) == (0, 0)
        assert result.seqs == result.published
        assert result.watermark == result.items

    def test_the_queue_redelivered_committed_items(
        self, chaos: dict[str, Outcome], backend: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The kills made the queue deliver items again, some whose event had committed, so
        dedup_key had real duplicates to suppress (and the events are still exact)."""
        result = _result(chaos, backend, "dedup", capsys)
        assert result.redelivered is not None and result.redelivered > 0
        assert result.redelivered_after_commit is not None
        assert result.redelivered_after_commit > 0
        assert result.redelivered_after_commit <= result.redelivered
        assert result.seqs == result.published

    def test_the_airflow_pattern_loses_items(
        self, chaos: dict[str, Outcome], backend: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """aset then a plain yield loses the item of every kill that lands between the two."""
        result = _result(chaos, backend, "airflow", capsys)
        assert result.published == list(range(1, result.items + 1))
        assert result.pause_kills >= 1
        assert result.lost + result.duplicated > 0
        assert result.lost >= result.pause_kills
        assert result.watermark == result.items  # the watermark says "all done" regardless
