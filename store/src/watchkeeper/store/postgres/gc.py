"""Garbage collection on PostgreSQL: one pass of a :class:`~watchkeeper.store._gc.GcPlan`.

A dry run only selects. Otherwise, with ``batch_size`` 0, every kind is deleted in one
operation of the writer; with a batch size, each batch is its own operation, so no write
transaction is held long. The rows deleted come back through ``RETURNING`` for the report.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._gc import GcPlan
from .._types import GcReport, TaskScope
from .connections import GC_TIMEOUT
from .ops import LATE, CallOp
from .sql import rowcount

if TYPE_CHECKING:
    import asyncpg

    from .sql import GcStatements

__all__ = ["collect_garbage"]


async def collect_garbage(
    plan: GcPlan,
    gc: GcStatements,
    fetch: Callable[..., Awaitable[list[asyncpg.Record]]],
    submit: Callable[[CallOp], Awaitable[Any]],
) -> GcReport:
    """Run ``plan`` with the statements ``gc``: reads through ``fetch``, deletes as writer
    operations through ``submit``, each delete bounded by :data:`GC_TIMEOUT`."""
    now, dry_run, batch_size, cutoff = (
        plan.now,
        plan.dry_run,
        plan.batch_size,
        plan.stale_before,
    )
    events_due = plan.events
    event_args = () if events_due is None else (events_due.events, events_due.dedup)
    events = 0
    bounds: dict[str, tuple[Any, ...]] = {"expired": (now,), "orphaned": ()}
    if cutoff is not None:
        bounds["retention"] = (cutoff,)
    found: dict[str, list[tuple[Any, ...]]] = {kind: [] for kind in bounds}
    if dry_run:
        for kind, args in bounds.items():
            found[kind] = [tuple(r) for r in await fetch("GC", gc.select[kind], *args)]
        if event_args:
            (row,) = await fetch("GC", gc.events_count, *event_args)
            events = row[0]
    elif batch_size == 0:

        async def collect(conn: asyncpg.Connection) -> int:
            for kind, args in bounds.items():
                rows = await conn.fetch(gc.delete[kind], *args, timeout=GC_TIMEOUT)
                found[kind] = [tuple(r) for r in rows]
            if not event_args:
                return 0
            status = await conn.execute(gc.events_delete, *event_args, timeout=GC_TIMEOUT)
            return rowcount(status)

        events = await submit(CallOp(collect, phase=LATE))
    else:
        for kind, args in bounds.items():
            while True:
                sql, params = gc.delete_batch[kind], (*args, batch_size)

                async def collect_batch(
                    conn: asyncpg.Connection, sql: str = sql, params: tuple[Any, ...] = params
                ) -> list[tuple[Any, ...]]:
                    return [tuple(r) for r in await conn.fetch(sql, *params, timeout=GC_TIMEOUT)]

                rows: list[tuple[Any, ...]] = await submit(CallOp(collect_batch, phase=LATE))
                found[kind].extend(rows)
                if len(rows) < batch_size:
                    break
        while event_args:

            async def delete_events(conn: asyncpg.Connection) -> int:
                args = (*event_args, batch_size)
                return rowcount(
                    await conn.execute(gc.events_delete_batch, *args, timeout=GC_TIMEOUT)
                )

            deleted: int = await submit(CallOp(delete_events, phase=LATE))
            events += deleted
            if deleted < batch_size:
                break
    report = GcReport(dry_run=dry_run, events=events)
    report.expired = [(TaskScope._from_row(*r[:4]), r[4]) for r in sorted(found["expired"])]
    report.retention = [
        (TaskScope._from_row(*r[:4]), r[4]) for r in sorted(found.get("retention", []))
    ]
    report.orphaned = [(r[0], r[1]) for r in sorted(found["orphaned"])]
    return report
