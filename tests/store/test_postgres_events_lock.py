"""PostgreSQL's events lock: every transaction that inserts events takes it (shared), so a
cursor reader holding it exclusively sees every event below the ids it reads committed."""

from __future__ import annotations

import anyio
import asyncpg
import pytest
from watchkeeper.store import Asset, PostgresStateBackend
from watchkeeper.store.backend import EventBatchCommit, EventCommit
from watchkeeper.store.postgres.consumers import LOCK_KEY

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
            await backend.aregister_assets([Asset("a")])
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
                        await backend.acommit_event(EventCommit("w", ("a",), "1"))
                    else:
                        events = (("1", None), ("2", None))
                        await backend.acommit_events(EventBatchCommit("w", ("a",), events))
                    done.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(commit)
                    with anyio.fail_after(10):
                        while not await reader.fetchval(_WAITING, pg_schema):  # noqa: ASYNC110
                            await anyio.sleep(0.01)
                    assert not done.is_set()
                    assert await backend.alist_events() == []
                    drawn = await reader.fetchval(
                        f"SELECT (last_value, is_called)::text FROM {ids}"
                    )
                    assert drawn == before
                    await held.commit()
                    with anyio.fail_after(10):
                        await done.wait()
                assert len(await backend.alist_events()) == (1 if kind == "single" else 2)
            finally:
                await reader.close()
