"""PostgreSQL's events lock: every transaction that inserts events takes it (shared), so a
cursor reader holding it exclusively sees every event below the ids it reads committed."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest
from watchkeeper.store import Asset, PostgresStateBackend
from watchkeeper.store.postgres.consumers import LOCK_KEY, events_prelude
from watchkeeper.store.protocols import EventBatchCommit, EventCommit, TaskSpec

# A waiting request for this schema's events lock (a 64-bit advisory key: classid holds its
# high half, objid its low half).
_WAITING = f"""
    SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
      AND ((classid::int8 << 32) | objid::int8) = {LOCK_KEY}
"""


class TestEventsLock:
    @pytest.mark.parametrize("kind", ["single", "batch"])
    async def test_event_commits_wait_for_a_cursor_reader(
        self, pg_dsn: str, pg_schema: str, kind: str
    ) -> None:
        """A single or batched event commit waits while a reader holds the events lock, without
        having drawn an event id yet (so no id below the reader's horizon can commit after it),
        and commits once it is released."""
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("a")])
            reader = await asyncpg.connect(pg_dsn)
            try:
                ids = await reader.fetchval(
                    "SELECT pg_get_serial_sequence($1, 'id')", f'"{pg_schema}".asset_events'
                )
                before = await reader.fetchval(f"SELECT (last_value, is_called)::text FROM {ids}")
                held = reader.transaction()
                await held.start()
                await reader.execute(f"SELECT pg_advisory_xact_lock({LOCK_KEY})", pg_schema)
                done = anyio.Event()

                async def commit() -> None:
                    if kind == "single":
                        await backend.events.acommit(EventCommit("w", ("a",), "1"))
                    else:
                        events = (("1", None), ("2", None))
                        await backend.events.acommit_batch(EventBatchCommit("w", ("a",), events))
                    done.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(commit)
                    with anyio.fail_after(10):
                        while not await reader.fetchval(_WAITING, pg_schema):  # noqa: ASYNC110
                            await anyio.sleep(0.01)
                    assert not done.is_set()
                    assert await backend.events.alist_events() == []
                    drawn = await reader.fetchval(
                        f"SELECT (last_value, is_called)::text FROM {ids}"
                    )
                    assert drawn == before
                    await held.commit()
                    with anyio.fail_after(10):
                        await done.wait()
                assert len(await backend.events.alist_events()) == (1 if kind == "single" else 2)
            finally:
                await reader.close()


class TestRunCreationHorizon:
    @pytest.mark.parametrize("named", [None, ["t"]])
    async def test_runs_never_pass_an_event_still_committing(
        self, pg_dsn: str, pg_schema: str, named: list[str] | None
    ) -> None:
        """test_run_creation_skipping_an_event_committed_late: a writer holds the shared
        events lock and has inserted event N, not committed; event N+1 commits. A worker's
        step that creates runs meanwhile takes no lock that would hold up event commits, and
        creates nothing past N until N's writer has ended; then N and N+1 both reach a run
        (with an exclusive lock no longer taken, the horizon must wait for the holders)."""
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as backend:
            await backend.events.aregister_assets([Asset("a")])
            await backend.tasks.async_tasks([TaskSpec("t", ("a",), max_events=10)])
            writer = await asyncpg.connect(pg_dsn)
            try:
                held = writer.transaction()
                await held.start()
                await writer.execute(events_prelude(pg_schema))
                asset_id = await writer.fetchval(
                    f'SELECT id FROM "{pg_schema}".assets WHERE name = $1', "a"
                )
                late = await writer.fetchval(
                    f'INSERT INTO "{pg_schema}".asset_events (asset_id, asset_name, watcher, '
                    "payload, created_at) VALUES ($1, 'a', 'w', '1', now()) RETURNING id",
                    asset_id,
                )
                await backend.events.acommit(EventCommit("w", ("a",), "2"))  # not held up
                claimed: list[Any] = []

                async def step() -> None:
                    got = await backend.tasks.astep_runs(
                        "w1", claim=5, ttl=30, tasks=named, create=5
                    )
                    claimed.extend(got.claimed)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(step)
                    with anyio.fail_after(10):  # the step found the writer of N in flight
                        while backend.horizon_waits == 0:  # noqa: ASYNC110 - a counter, no event
                            await anyio.sleep(0.001)
                    assert claimed == [] and await backend.tasks.alist_runs() == []
                    await held.commit()
                (run,) = claimed
                assert [e.id for e in run.events] == [late, late + 1]
            finally:
                await writer.close()
