"""kill -9 of a real ``watchkeeper triggerer`` reading PostgreSQL's changes: each row once.

A daemon runs ``PostgresChangesWatcher`` on a table of a throwaway ``wal_level=logical``
cluster while 4,000 rows with distinct numbers are inserted (in transactions of 1 to 20 rows),
and is SIGKILLed at least 8 times at random points (see ``_broker_chaos.py``): before a batch
commits, after it committed and before the slot advanced, while the slot is still held by the
dead daemon's server session. The events committed are then read with plain ``sqlite3`` and
compared with the rows in the table, read with plain SQL: none may be missing and none may be
there twice.
"""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.chaos._broker_chaos import BrokerChaos, BrokerPlan
from tests.support.pg_logical import LogicalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
PLAN = BrokerPlan(items=4_000, kills=8, seed=SEED, settle=30.0, round_timeout=90.0)


def row_number(payload: Any) -> int:
    return int(payload["new"]["n"])


class TestPostgresChangesKillNine:
    async def test_every_row_change_commits_once(
        self, pg_logical: LogicalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """After 8+ SIGKILLs, the watcher committed each of 4,000 inserted rows once."""
        table = f"chaos_{uuid.uuid4().hex[:10]}"
        slot = f"wk_{table}"
        writer = await asyncpg.connect(pg_logical.dsn)
        shuffle = random.Random(SEED)
        try:
            await writer.execute(f"CREATE TABLE {table} (n int PRIMARY KEY, body text)")
            # Made before the first row, so the slot keeps every change (a first start of the
            # watcher would make them too, but the rows written before it would not be seen).
            await writer.execute(f"CREATE PUBLICATION {slot} FOR TABLE {table}")
            await writer.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)

            async def insert(numbers: list[int]) -> None:
                while numbers:
                    size = shuffle.randint(1, 20)
                    chunk, numbers = numbers[:size], numbers[size:]
                    async with writer.transaction():
                        await writer.executemany(
                            f"INSERT INTO {table} (n, body) VALUES ($1, $2)",
                            [(n, f"row {n}") for n in chunk],
                        )

            watcher = (
                f"PostgresChangesWatcher({pg_logical.dsn!r}, {slot!r}, tables=[{table!r}], "
                "batch_size=100, poll_interval=0.1, timeout=10.0)"
            )
            name = f"chaos_{uuid.uuid4().hex[:10]}"
            chaos = BrokerChaos(
                "postgres-changes", watcher, insert, tmp_path, PLAN, name, number=row_number
            )
            result = await chaos.run()
            in_table = [r[0] for r in await writer.fetch(f"SELECT n FROM {table} ORDER BY n")]
        finally:
            await writer.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = $1 AND NOT active",
                slot,
            )
            await writer.close()
        with capsys.disabled():
            print(f"\n{result.summary()} seed={SEED}")
        assert result.kills >= 8
        assert in_table == list(range(1, PLAN.items + 1))
        assert (result.lost, result.duplicated) == (0, 0)
        assert sorted(result.numbers) == in_table
