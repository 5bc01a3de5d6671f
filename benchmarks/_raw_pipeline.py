"""The ceiling ``triggerer_bench.py`` compares the runtime with: a raw group-commit pipeline.

The same work as a watcher's durable event (insert one event row and upsert the watermark row
in the same transaction, the producer waiting until its event has committed), written directly
on aiosqlite / asyncpg, with no validation, no supervision and no accessors. Producers put
``(asset, payload, watermark, future)`` on a bounded anyio memory stream; one writer task takes
everything queued (up to ``max_batch``) and commits it as one transaction.

Not a test and not part of any package: imported by ``benchmarks/triggerer_bench.py`` only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import aiosqlite
import anyio
import anyio.abc
import asyncpg
from _raw_tables import pg_tables, sqlite_tables
from _triggerer_fixtures import Database
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["RawPipeline", "open_raw_pipeline"]

_SQLITE_EVENT = (
    "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, created_at) "
    "VALUES (?, ?, ?, ?, NULL, ?)"
)
_SQLITE_STATE = (
    "INSERT INTO asset_state (asset_id, key, value, version, updated_at) "
    "VALUES (?, 'watermark', ?, 1, ?) ON CONFLICT (asset_id, key) DO UPDATE SET "
    "value = excluded.value, version = asset_state.version + 1, updated_at = excluded.updated_at"
)


Item = tuple[int, str, str, int, "asyncio.Future[None]"]


class RawPipeline:
    """Producers' side of a raw pipeline: ``submit`` queues an item and awaits its commit."""

    def __init__(self, send: MemoryObjectSendStream[Item], max_batch: int) -> None:
        self._send = send
        self.max_batch = max_batch
        self.batches = 0
        self.items = 0

    async def submit(self, asset_id: int, name: str, payload_json: str, watermark: int) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = (asset_id, name, payload_json, watermark, done)
        try:
            self._send.send_nowait(item)
        except anyio.WouldBlock:
            await self._send.send(item)
        await done


async def _drain(receive: MemoryObjectReceiveStream[Item], first: Item, limit: int) -> list[Item]:
    batch = [first]
    while len(batch) < limit:
        try:
            batch.append(receive.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            break
    return batch


def _finish(batch: list[Item], error: BaseException | None = None) -> None:
    for *_, done in batch:
        if not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)


async def _sqlite_writer(
    path: Path,
    pipe: RawPipeline,
    receive: MemoryObjectReceiveStream[Item],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    async with aiosqlite.connect(path, isolation_level=None) as conn:
        for statement in sqlite_tables():
            await conn.execute(statement)
        task_status.started()
        async for first in receive:
            batch = await _drain(receive, first, pipe.max_batch)
            stamp = datetime.now(UTC).isoformat()
            try:
                await conn.execute("BEGIN IMMEDIATE")
                await conn.executemany(
                    _SQLITE_EVENT, [(a, n, n, p, stamp) for a, n, p, _, _ in batch]
                )
                await conn.executemany(
                    _SQLITE_STATE, [(a, str(w), stamp) for a, _, _, w, _ in batch]
                )
                await conn.execute("COMMIT")
            except BaseException as exc:
                _finish(batch, exc if isinstance(exc, Exception) else RuntimeError("stopped"))
                raise
            pipe.batches += 1
            pipe.items += len(batch)
            _finish(batch)


async def _pg_writer(
    dsn: str,
    schema: str,
    pipe: RawPipeline,
    receive: MemoryObjectReceiveStream[Item],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    p = f'"{schema}".'
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        for statement in pg_tables(p):
            await conn.execute(statement)
        insert = (
            f"INSERT INTO {p}asset_events (asset_id, asset_name, watcher, payload, created_at) "
            "SELECT a, n, n, j, $4 FROM unnest($1::int8[], $2::text[], $3::text[]) AS i(a, n, j)"
        )
        upsert = (
            f"INSERT INTO {p}asset_state AS t (asset_id, key, value, version, updated_at) "
            "SELECT a, 'watermark', v, 1, $3 FROM unnest($1::int8[], $2::text[]) AS i(a, v) "
            "ON CONFLICT (asset_id, key) DO UPDATE SET value = EXCLUDED.value, "
            "version = t.version + 1, updated_at = EXCLUDED.updated_at"
        )
        task_status.started()
        async for first in receive:
            batch = await _drain(receive, first, pipe.max_batch)
            stamp = datetime.now(UTC)
            try:
                async with conn.transaction():
                    await conn.execute(
                        insert,
                        [b[0] for b in batch],
                        [b[1] for b in batch],
                        [b[2] for b in batch],
                        stamp,
                    )
                    await conn.execute(
                        upsert, [b[0] for b in batch], [str(b[3]) for b in batch], stamp
                    )
            except BaseException as exc:
                _finish(batch, exc if isinstance(exc, Exception) else RuntimeError("stopped"))
                raise
            pipe.batches += 1
            pipe.items += len(batch)
            _finish(batch)
    finally:
        with anyio.move_on_after(5, shield=True):
            await conn.close()


@asynccontextmanager
async def open_raw_pipeline(db: Database, max_batch: int) -> AsyncIterator[RawPipeline]:
    """Start the raw writer on ``db`` (creating its tables); stop it on exit."""
    send, receive = anyio.create_memory_object_stream[Item](max_buffer_size=max_batch)
    pipe = RawPipeline(send, max_batch)
    async with anyio.create_task_group() as tg:
        if db.kind == "sqlite":
            assert db.path is not None
            await tg.start(_sqlite_writer, db.path, pipe, receive)
        else:
            assert db.dsn is not None and db.schema is not None
            await tg.start(_pg_writer, db.dsn, db.schema, pipe, receive)
        try:
            yield pipe
        finally:
            send.close()
