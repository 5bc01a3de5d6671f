"""Task cursors and runs for :class:`~watchkeeper.store.PostgresStateBackend` (the event
consumers and wake-ups are :mod:`.consumers`).

Each operation is one short transaction on a pooled connection (``_transact``), not a batch
of the group writer: claims hold run rows (``FOR UPDATE ... SKIP LOCKED``, so several workers
claim different runs without waiting on each other), and a finish holds its run row while it
checks the lease and commits the outlet events. The rules are :mod:`._tasks`'.

**Commit order.** An identity column hands out ids at insert, not at commit, so two writers'
events can commit out of id order, and a cursor read between the two commits would step over
the later-committed lower id for good. Every transaction that inserts events therefore holds
a shared transaction-scoped advisory lock (the group writer takes it per batch, see
:func:`events_hook`; a finish with outlets takes it too), and every reader that moves a cursor
takes it exclusively first: once it has it, every event with a lower id has committed or
rolled back. The exclusive holds are short (one batch of run creations). Lock order, always:
task rows, then the events lock (declaring tasks and creating runs both keep it).

**Wake-ups.** The same hook sends one ``NOTIFY`` per committed batch (never one per event);
:meth:`PostgresConsumers.await_events` listens on a connection of its own and falls back to
polling when that connection is lost.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .._tasks import (
    OutletEvent,
    RunError,
    TaskInfo,
    TaskRun,
    TaskSpec,
    after_failure,
    errors_from_json,
    errors_to_json,
    ids_from_json,
    ids_to_json,
    lapsed_error,
    lost_reason,
    plan_run,
)
from .._taskstore import TaskStoreBackend
from .._types import AssetEvent, Writer
from ..errors import (
    AssetNotFoundError,
    RunLeaseLostError,
    RunNotFoundError,
    RunStateError,
    TaskNotFoundError,
)
from .consumers import EVENT_COLS, event_row, events_hook
from .sql import rowcount, writer_fields

if TYPE_CHECKING:
    import asyncpg

    from .sql import Statements

__all__ = ["PostgresTasks"]

T = TypeVar("T")

_RUN_COLS = (
    "id, task, state, try_number, max_tries, event_count, created_at, updated_at, started_at, "
    "finished_at, not_before, lease_owner, lease_token, lease_expires_at, errors, "
    "outlet_event_ids"
)


def _run(row: Any, events: Sequence[AssetEvent] = ()) -> TaskRun:
    return TaskRun(
        id=row[0], task=row[1], state=row[2], try_number=row[3], max_tries=row[4],
        event_count=row[5], created_at=row[6], updated_at=row[7], started_at=row[8],
        finished_at=row[9], not_before=row[10], lease_owner=row[11], lease_token=row[12],
        lease_expires_at=row[13], errors=errors_from_json(row[14]),
        outlet_event_ids=ids_from_json(row[15]), events=tuple(events),
    )  # fmt: skip


class PostgresTasks(TaskStoreBackend):
    """The :class:`~._tasks.TaskQueue` and :class:`~._tasks.EventConsumers` of PostgreSQL."""

    schema: str | None
    clock: Any
    _dsn: str
    _sql: Statements

    if TYPE_CHECKING:

        async def _fetch(self, what: str, sql: str, *args: Any) -> list[asyncpg.Record]: ...
        async def _transact(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T: ...

    if TYPE_CHECKING:

        @property
        def _prefix(self) -> str: ...
        async def _lock_events(self, conn: Any) -> None: ...

    async def _runs_with_events(self, conn: Any, run_ids: Sequence[int]) -> list[TaskRun]:
        if not run_ids:
            return []
        p = self._prefix
        ids = list(run_ids)
        rows = await conn.fetch(
            f"SELECT {_RUN_COLS} FROM {p}task_runs WHERE id = ANY($1::int8[]) ORDER BY id", ids
        )
        events: dict[int, list[AssetEvent]] = {}
        for r in await conn.fetch(
            f"SELECT e.run_id, {EVENT_COLS} FROM {p}task_run_events e "
            f"JOIN {p}asset_events ev ON ev.id = e.event_id WHERE e.run_id = ANY($1::int8[]) "
            "ORDER BY e.event_id",
            ids,
        ):
            events.setdefault(r[0], []).append(event_row(tuple(r)[1:]))
        return [_run(row, events.get(row[0], ())) for row in rows]

    # -- tasks -------------------------------------------------------------------------------

    async def _async_tasks(self, specs: builtins.list[TaskSpec]) -> None:
        p, now = self._prefix, self.clock()
        batch = sorted(specs, key=lambda spec: spec.name)  # rows locked in one order by all

        async def sync(conn: Any) -> None:
            # Locks in acreate_run's order, task rows then the events lock (else a deadlock).
            for spec in batch:
                await conn.execute(
                    f"INSERT INTO {p}tasks (name, assets, mode, max_events, max_tries, "
                    "updated_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO UPDATE "
                    "SET assets = EXCLUDED.assets, mode = EXCLUDED.mode, "
                    "max_events = EXCLUDED.max_events, max_tries = EXCLUDED.max_tries, "
                    "updated_at = EXCLUDED.updated_at",
                    spec.name, list(spec.assets), spec.mode, spec.max_events, spec.max_tries, now,
                )  # fmt: skip
            await self._lock_events(conn)  # a new cursor's start must not pass an in-flight event
            for spec in batch:
                await conn.execute(
                    f"INSERT INTO {p}task_cursors (task, asset, cursor, updated_at) "
                    "SELECT $1, a.name, coalesce((SELECT max(id) FROM "
                    f"{p}asset_events WHERE asset_name = a.name), 0), $3 "
                    "FROM unnest($2::text[]) AS a(name) ON CONFLICT (task, asset) DO NOTHING",
                    spec.name,
                    list(spec.assets),
                    now,
                )

        await self._transact("declaring tasks", sync)

    async def _alist_tasks(self) -> builtins.list[TaskInfo]:
        p = self._prefix
        tasks = await self._fetch(
            "listing tasks",
            f"SELECT name, assets, mode, max_events, max_tries, paused FROM {p}tasks ORDER BY name",
        )
        cursors = await self._fetch(
            "listing tasks",
            "SELECT c.task, c.asset, c.cursor, c.writer_kind, c.writer_name, "
            f"(SELECT count(*) FROM {p}asset_events ev WHERE ev.asset_name = c.asset "
            f"AND ev.id > c.cursor) FROM {p}task_cursors c",
        )
        by_task: dict[str, list[Any]] = {}
        for row in cursors:
            by_task.setdefault(row[0], []).append(row)
        out = []
        for row in tasks:
            spec = TaskSpec(row[0], tuple(row[1]), row[2], row[3], row[4])
            mine = {r[1]: r for r in by_task.get(spec.name, []) if r[1] in spec.assets}
            writers = {a: None if r[3] is None else Writer(r[3], r[4]) for a, r in mine.items()}
            out.append(
                TaskInfo(
                    spec,
                    row[5],
                    {a: r[2] for a, r in mine.items()},
                    {a: r[5] for a, r in mine.items()},
                    writers,
                )
            )
        return out

    async def _spec(self, conn: Any, name: str, *, lock: bool = False) -> tuple[TaskSpec, bool]:
        row = await conn.fetchrow(
            f"SELECT name, assets, mode, max_events, max_tries, paused FROM {self._prefix}tasks "
            f"WHERE name = $1{' FOR UPDATE' if lock else ''}",
            name,
        )
        if row is None:
            raise TaskNotFoundError(f"task {name!r}")
        return TaskSpec(row[0], tuple(row[1]), row[2], row[3], row[4]), row[5]

    async def _aset_task_paused(self, name: str, paused: bool) -> None:

        async def pause(conn: Any) -> None:
            await self._spec(conn, name)
            await conn.execute(
                f"UPDATE {self._prefix}tasks SET paused = $2 WHERE name = $1", name, bool(paused)
            )

        await self._transact("pausing a task", pause)

    async def _arewind_task(
        self, name: str, asset: str, to_event_id: int, writer: Writer | None
    ) -> None:
        now = self.clock()
        kind, who, _ = writer_fields(writer)

        async def rewind(conn: Any) -> None:
            spec, _ = await self._spec(conn, name, lock=True)
            if asset not in spec.assets:
                raise TaskNotFoundError(f"asset {asset!r} of task {name!r}")
            await conn.execute(
                f"UPDATE {self._prefix}task_cursors SET cursor = $3, updated_at = $4, "
                "writer_kind = $5, writer_name = $6 WHERE task = $1 AND asset = $2",
                name, asset, to_event_id - 1, now, kind, who,
            )  # fmt: skip

        await self._transact("rewinding a task", rewind)

    async def _acreate_runs(self, name: str, max_runs: int) -> builtins.list[TaskRun]:

        async def create(conn: Any) -> list[TaskRun]:
            # The task row serialises the workers creating its runs; the events lock makes
            # every event below the ids read here committed (see the module docstring).
            spec, paused = await self._spec(conn, name, lock=True)
            if paused:
                return []
            await self._lock_events(conn)
            created: list[TaskRun] = []
            while len(created) < max_runs:
                run = await self._create_one(conn, spec)
                if run is None:
                    break
                created.append(run)
            return created

        return await self._transact("creating runs", create)

    async def _create_one(self, conn: Any, spec: TaskSpec) -> TaskRun | None:
        """One run from the pending events (the caller holds the task row and the lock)."""
        p, name = self._prefix, spec.name
        now = self.clock()
        cursors = dict(
            await conn.fetch(f"SELECT asset, cursor FROM {p}task_cursors WHERE task = $1", name)
        )
        pending: dict[str, list[tuple[int, str]]] = {}
        for asset in spec.assets:
            rows = await conn.fetch(
                f"SELECT id FROM {p}asset_events WHERE asset_name = $1 AND id > $2 "
                "ORDER BY id LIMIT $3",
                asset,
                cursors.get(asset, 0),
                spec.max_events,
            )
            pending[asset] = [(r[0], asset) for r in rows]
        plan = plan_run(spec, pending)
        if plan is None:
            return None
        taken, moved = plan
        run_id = await conn.fetchval(
            f"INSERT INTO {p}task_runs (task, state, try_number, max_tries, event_count, "
            "created_at, updated_at) VALUES ($1, 'queued', 0, $2, $3, $4, $4) RETURNING id",
            name, spec.max_tries, len(taken), now,
        )  # fmt: skip
        await conn.execute(
            f"INSERT INTO {p}task_run_events (run_id, event_id, task, asset) "
            "SELECT $1, i.event_id, $2, i.asset FROM unnest($3::int8[], $4::text[]) "
            "AS i(event_id, asset)",
            run_id, name, [e for e, _ in taken], [a for _, a in taken],
        )  # fmt: skip
        await conn.execute(
            f"UPDATE {p}task_cursors c SET cursor = i.cursor, updated_at = $2, "
            "writer_kind = NULL, writer_name = NULL FROM unnest($3::text[], $4::int8[]) "
            "AS i(asset, cursor) WHERE c.task = $1 AND c.asset = i.asset",
            name, now, list(moved), list(moved.values()),
        )  # fmt: skip
        return (await self._runs_with_events(conn, [run_id]))[0]

    # -- runs --------------------------------------------------------------------------------

    async def _aclaim_runs(
        self, owner: str, limit: int, span: timedelta, tasks: builtins.list[str] | None
    ) -> builtins.list[TaskRun]:
        only = tasks
        p = self._prefix
        ready = (
            f"FROM {p}task_runs r JOIN {p}tasks t ON t.name = r.task WHERE NOT t.paused "
            "AND ($2::text[] IS NULL OR r.task = ANY($2::text[]))"
        )

        async def claim(conn: Any) -> list[TaskRun]:
            now = self.clock()
            lapsed = await conn.fetch(
                f"SELECT r.id, r.try_number, r.max_tries, r.lease_owner, r.errors {ready} "
                "AND r.state = 'running' AND r.lease_expires_at <= $1 "
                "FOR UPDATE OF r SKIP LOCKED",
                now,
                only,
            )
            for run_id, try_number, max_tries, lease_owner, errors in lapsed:
                entries = (*errors_from_json(errors), lapsed_error(lease_owner, try_number, now))
                state = "queued" if try_number < max_tries else "failed"
                await conn.execute(
                    f"UPDATE {p}task_runs SET state = $2::text, errors = $3, updated_at = $4::timestamptz, "
                    "not_before = NULL, lease_owner = NULL, lease_expires_at = NULL, "
                    "finished_at = CASE WHEN $2::text = 'failed' THEN $4::timestamptz END WHERE id = $1",
                    run_id, state, errors_to_json(entries), now,
                )  # fmt: skip
            rows = await conn.fetch(
                f"WITH c AS (SELECT r.id {ready} AND r.state = 'queued' "
                "AND (r.not_before IS NULL OR r.not_before <= $1) ORDER BY r.id LIMIT $3 "
                f"FOR UPDATE OF r SKIP LOCKED) UPDATE {p}task_runs u SET state = 'running', "
                "try_number = u.try_number + 1, lease_owner = $4, "
                "lease_token = u.lease_token + 1, lease_expires_at = $5, started_at = $1, "
                "updated_at = $1, not_before = NULL FROM c WHERE u.id = c.id RETURNING u.id",
                now, only, limit, owner, now + span,
            )  # fmt: skip
            return await self._runs_with_events(conn, sorted(r[0] for r in rows))

        return await self._transact("claiming runs", claim)

    async def _aheartbeat_runs(self, owner: str, runs: dict[int, int], span: timedelta) -> set[int]:
        held, p = runs, self._prefix

        async def renew(conn: Any) -> set[int]:
            now = self.clock()
            rows = await conn.fetch(
                f"UPDATE {p}task_runs r SET lease_expires_at = $4 FROM unnest($2::int8[], "
                "$3::int8[]) AS i(id, token) WHERE r.id = i.id AND r.lease_token = i.token "
                "AND r.lease_owner = $1 AND r.state = 'running' AND r.lease_expires_at > $5 "
                "RETURNING r.id",
                owner, list(held), list(held.values()), now + span, now,
            )  # fmt: skip
            return {r[0] for r in rows}

        return await self._transact("renewing run leases", renew)

    async def _abreak_run_leases(self, owners: builtins.list[str]) -> int:
        names = owners

        async def brk(conn: Any) -> int:
            return rowcount(
                await conn.execute(
                    f"UPDATE {self._prefix}task_runs SET lease_expires_at = $2 "
                    "WHERE state = 'running' AND lease_owner = ANY($1::text[])",
                    names,
                    self.clock(),
                )
            )

        return await self._transact("breaking run leases", brk)

    async def _afinish_run(
        self,
        run_id: int,
        owner: str,
        token: int,
        success: bool,
        outlets: builtins.list[OutletEvent],
        error: str | None,
        traceback: str | None,
        retry_delay: timedelta,
    ) -> TaskRun:
        emitted, p = outlets, self._prefix
        hook = events_hook(self.schema)

        async def finish(conn: Any) -> TaskRun:
            row = await conn.fetchrow(
                "SELECT state, lease_owner, lease_token, lease_expires_at, try_number, "
                f"max_tries, errors, task FROM {p}task_runs WHERE id = $1 FOR UPDATE",
                run_id,
            )
            if row is None:
                raise RunNotFoundError(run_id)
            now = self.clock()
            state, lease_owner, lease_token, expires, try_number, max_tries, errors, task = row
            reason = lost_reason(state, lease_owner, lease_token, expires, owner, token, now)
            if reason is not None:
                raise RunLeaseLostError(run_id, owner, token, reason)
            if success:
                outlet_ids: list[int] = []
                if emitted:
                    await hook(conn)
                    found = dict(
                        await conn.fetch(
                            f"SELECT name, id FROM {p}assets WHERE active "
                            "AND name = ANY($1::text[])",
                            [o.asset for o in emitted],
                        )
                    )
                    for outlet in emitted:
                        if outlet.asset not in found:
                            raise AssetNotFoundError(outlet.asset)
                    rows = await conn.fetch(
                        f"INSERT INTO {p}asset_events (asset_id, asset_name, watcher, payload, "
                        "created_at) SELECT i.asset_id, i.asset_name, $1, i.payload, $2 "
                        "FROM unnest($3::int8[], $4::text[], $5::text[]) WITH ORDINALITY "
                        "AS i(asset_id, asset_name, payload, ord) ORDER BY i.ord RETURNING id",
                        f"task:{task}", now, [found[o.asset] for o in emitted],
                        [o.asset for o in emitted], [o.payload_json for o in emitted],
                    )  # fmt: skip
                    outlet_ids = sorted(r[0] for r in rows)
                await conn.execute(
                    f"UPDATE {p}task_runs SET state = 'success', finished_at = $2, "
                    "updated_at = $2, lease_owner = NULL, lease_expires_at = NULL, "
                    "outlet_event_ids = $3 WHERE id = $1",
                    run_id,
                    now,
                    ids_to_json(outlet_ids),
                )
            else:
                new_state, not_before = after_failure(try_number, max_tries, now, retry_delay)
                entry = RunError(try_number, error or "failed", traceback, now)
                await conn.execute(
                    f"UPDATE {p}task_runs SET state = $2, not_before = $3, updated_at = $4, "
                    "errors = $5, lease_owner = NULL, lease_expires_at = NULL, "
                    "finished_at = $6 WHERE id = $1",
                    run_id, new_state, not_before, now,
                    errors_to_json((*errors_from_json(errors), entry)),
                    now if new_state == "failed" else None,
                )  # fmt: skip
            return (await self._runs_with_events(conn, [run_id]))[0]

        return await self._transact("finishing a run", finish)

    async def _aget_run(self, run_id: int) -> TaskRun:

        async def get(conn: Any) -> list[TaskRun]:
            return await self._runs_with_events(conn, [run_id])

        found = await self._transact("reading a run", get)
        if not found:
            raise RunNotFoundError(run_id)
        return found[0]

    async def _alist_runs(
        self, task: str | None, state: str | None, limit: int | None
    ) -> builtins.list[TaskRun]:
        rows = await self._fetch(
            "listing runs",
            f"SELECT {_RUN_COLS} FROM {self._prefix}task_runs WHERE ($1::text IS NULL OR task = $1) "
            "AND ($2::text IS NULL OR state = $2) ORDER BY id DESC LIMIT $3",
            task,
            state,
            limit,
        )
        return [_run(row) for row in rows]

    async def _acount_runs(self) -> dict[tuple[str, str], int]:
        rows = await self._fetch(
            "counting runs",
            f"SELECT task, state, count(*) FROM {self._prefix}task_runs GROUP BY task, state",
        )
        return {(row[0], row[1]): row[2] for row in rows}

    async def _aretry_run(self, run_id: int) -> TaskRun:
        p = self._prefix

        async def retry(conn: Any) -> TaskRun:
            state = await conn.fetchval(
                f"SELECT state FROM {p}task_runs WHERE id = $1 FOR UPDATE", run_id
            )
            if state is None:
                raise RunNotFoundError(run_id)
            if state != "failed":
                raise RunStateError(run_id, state, "only a failed run can be retried")
            await conn.execute(
                f"UPDATE {p}task_runs SET state = 'queued', max_tries = try_number + 1, "
                "not_before = NULL, finished_at = NULL, updated_at = $2 WHERE id = $1",
                run_id,
                self.clock(),
            )
            return (await self._runs_with_events(conn, [run_id]))[0]

        return await self._transact("retrying a run", retry)
