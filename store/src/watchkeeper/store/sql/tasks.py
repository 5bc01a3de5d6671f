"""Event consumers and task specs, written once for both SQL databases (the rules are
:mod:`watchkeeper.store._tasks`'; the tables are migration 8's and 13's).

- A **consumer's acknowledgement** reads its cursor (locked on PostgreSQL: two acks of one
  consumer serialise, and ``expected`` sees the other's move), moves it, and writes its state
  in the same transaction, by the rules of every state write (:func:`put_state`: a fenced
  writer's lease checked first, an unknown asset refused, a version per key).
- **Commit order** (PostgreSQL): an event id is handed out at insert, not at commit, so
  reading the log past a cursor, or starting a new task's cursor at the newest id, first
  takes the events lock (``events_lock``, exclusive, waiting for every transaction inserting
  events to end; see :mod:`watchkeeper.store.postgres.tasks`). SQLite has none to take: its
  writer holds the file's write lock, and a read sees only committed events.
- **Declaring tasks** upserts them in name order (PostgreSQL locks the rows in that order, as
  run creation does, then the events lock: no deadlock) and clears ``removed_at``; a new
  cursor starts at the end of the log. **Retiring** marks every task not named removed; a
  **delete** forgets the spec and cursors, refused while a run of the task is running.

:class:`SqlTaskSpecs` is the :class:`~watchkeeper.store.protocols.TaskSpecsDriver` over a
:class:`~.runner.Runner`. :data:`SPEC_COLS` and :func:`spec_from_row` read a task's spec
for whoever else needs one (run creation).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, Final

from .._events import Fence
from .._leases import check_fence
from .._tasks import StateWrite, TaskInfo, TaskSpec, check_rewind, deleting_running
from .._types import AssetEvent, AssetScope, TaskScope, Writer
from ..errors import AssetNotFoundError, ConsumerCursorError, TaskNotFoundError
from .engine import BEGIN, Dialect, Job, Stmt, count, many, rows, run
from .migrations import raw
from .runner import Runner

__all__ = ["SPEC_COLS", "SqlTaskSpecs", "TaskStatements", "put_state", "spec_from_row"]

SPEC_COLS: Final = "name, assets, mode, max_events, max_tries, batch_window, max_active_runs"
"""The columns of ``tasks`` :func:`spec_from_row` reads, in its order."""

_EVENT_COLS: Final = "ev.id, ev.asset_name, ev.watcher, ev.payload, ev.dedup_key, ev.created_at"
_WHO: Final = "writer_kind, writer_name, writer_try"


def spec_from_row(dialect: Dialect, row: Any) -> TaskSpec:
    """A task's spec from a row starting with :data:`SPEC_COLS`."""
    return TaskSpec(
        row[0], tuple(dialect.json_list(row[1])), row[2], row[3], row[4], row[5], row[6]
    )


class TaskStatements:
    """The statements of consumers and task specs in one dialect, for one table prefix;
    ``events_lock``: the database's statement that waits out every event insert in flight
    (``None``: none is needed)."""

    def __init__(self, dialect: Dialect, prefix: str, events_lock: str | None = None) -> None:
        self.dialect = dialect
        self.events_lock: Stmt | None = None if events_lock is None else raw(events_lock)
        sql = partial(dialect.compile, prefix=prefix)
        # -- consumers
        self.position = sql("SELECT cursor FROM {p}event_consumers WHERE name = :name")
        after = (
            f"SELECT {_EVENT_COLS} FROM {{p}}asset_events AS ev WHERE ev.id > coalesce("
            "(SELECT cursor FROM {p}event_consumers WHERE name = :name), 0)"
        )
        self.fetch = sql(f"{after} ORDER BY ev.id LIMIT :limit")
        self.fetch_of = sql(f"{after} AND ev.asset_name {{in:assets}} ORDER BY ev.id LIMIT :limit")
        self.lock_consumer = sql(
            "SELECT cursor FROM {p}event_consumers WHERE name = :name {for_update}"
        )
        self.add_consumer = sql(
            "INSERT INTO {p}event_consumers (name, cursor, updated_at) VALUES (:name, 0, {now}) "
            "ON CONFLICT (name) DO NOTHING"
        )
        self.move_consumer = sql(
            "UPDATE {p}event_consumers SET cursor = :cursor, updated_at = {now}, "
            "writer_kind = :kind, writer_name = :who WHERE name = :name"
        )
        # -- state written with an acknowledgement: the statements of every state write
        self.fence = sql(
            "SELECT l.owner, l.token, n.expires_at, {now} FROM {p}trigger_leases AS l "
            "LEFT JOIN {p}trigger_nodes AS n ON n.owner = l.owner AND n.alive "
            "WHERE l.trigger_id = :trigger_id {for_share_of:l}"
        )
        self.put_task = sql(f"""
            INSERT INTO {{p}}task_state AS t (dag_id, run_id, task_id, map_index, key, value,
                version, updated_at, {_WHO}, expires_at, never_expire)
            VALUES (:dag_id, :run_id, :task_id, :map_index, :key, :value, 1, {{now}},
                :kind, :who, :try, NULL, false)
            ON CONFLICT (dag_id, run_id, task_id, map_index, key) DO UPDATE SET
                value = excluded.value, version = t.version + 1,
                updated_at = excluded.updated_at, writer_kind = excluded.writer_kind,
                writer_name = excluded.writer_name, writer_try = excluded.writer_try,
                expires_at = NULL, never_expire = false
        """)
        # The active asset a scope names, as every backend picks it: the least id among the
        # one with that id, the one with that name, and (only without a name) those with
        # that URI; each term answered by its index.
        self.put_asset = sql(f"""
            INSERT INTO {{p}}asset_state AS t (asset_id, key, value, version, updated_at, {_WHO})
            SELECT r.id, :key, :value, 1, {{now}}, :kind, :who, CAST(:try AS INTEGER)
            FROM (SELECT min(x.id) AS id FROM (
                SELECT a.id FROM {{p}}assets AS a WHERE a.active AND a.id = :asset_id
                UNION ALL SELECT a.id FROM {{p}}assets AS a WHERE a.active AND a.name = :name
                UNION ALL SELECT a.id FROM {{p}}assets AS a
                    WHERE a.active AND :name IS NULL AND a.uri = :uri) AS x) AS r
            WHERE r.id IS NOT NULL
            ON CONFLICT (asset_id, key) DO UPDATE SET
                value = excluded.value, version = t.version + 1,
                updated_at = excluded.updated_at, writer_kind = excluded.writer_kind,
                writer_name = excluded.writer_name, writer_try = excluded.writer_try
            RETURNING asset_id
        """)
        # -- tasks
        self.declare = sql(f"""
            INSERT INTO {{p}}tasks ({SPEC_COLS}, updated_at)
            VALUES (:name, {{list:assets}}, :mode, :max_events, :max_tries, :batch_window,
                :max_active_runs, {{now}})
            ON CONFLICT (name) DO UPDATE SET assets = excluded.assets, mode = excluded.mode,
                max_events = excluded.max_events, max_tries = excluded.max_tries,
                batch_window = excluded.batch_window,
                max_active_runs = excluded.max_active_runs, removed_at = NULL,
                updated_at = excluded.updated_at
        """)
        # A new cursor starts at the end of the log: a task sees the events after it was
        # declared, as an asset-scheduled DAG does.
        self.start_cursor = sql(
            "INSERT INTO {p}task_cursors (task, asset, cursor, updated_at) "
            "SELECT :task, :asset, coalesce(max(id), 0), {now} FROM {p}asset_events "
            "WHERE asset_name = :asset ON CONFLICT (task, asset) DO NOTHING"
        )
        self.tasks = sql(f"SELECT {SPEC_COLS}, paused, removed_at FROM {{p}}tasks ORDER BY name")
        self.cursors = sql(
            "SELECT c.task, c.asset, c.cursor, c.writer_kind, c.writer_name, "
            "(SELECT count(*) FROM {p}asset_events AS ev WHERE ev.asset_name = c.asset "
            "AND ev.id > c.cursor) FROM {p}task_cursors AS c"
        )
        self.lock_task = sql(
            f"SELECT {SPEC_COLS} FROM {{p}}tasks WHERE name = :name {{for_update}}"
        )
        self.pause = sql("UPDATE {p}tasks SET paused = :paused WHERE name = :name")
        self.positions = sql(
            "SELECT (SELECT cursor FROM {p}task_cursors WHERE task = :name AND asset = :asset), "
            "(SELECT coalesce(max(id), 0) FROM {p}asset_events WHERE asset_name = :asset)"
        )
        self.rewind = sql(
            "UPDATE {p}task_cursors SET cursor = :cursor, updated_at = {now}, "
            "writer_kind = :kind, writer_name = :who WHERE task = :name AND asset = :asset"
        )
        self.retire = sql(
            "UPDATE {p}tasks SET removed_at = {now} "
            "WHERE removed_at IS NULL AND NOT (name {in:keep}) RETURNING name"
        )
        self.running = sql(
            "SELECT min(id) FROM {p}task_runs WHERE task = :name AND state = 'running'"
        )
        self.forget_cursors = sql("DELETE FROM {p}task_cursors WHERE task = :name")
        self.forget_task = sql("DELETE FROM {p}tasks WHERE name = :name")
        self.count_runs = sql("SELECT task, state, count(*) FROM {p}task_runs GROUP BY task, state")
        self.oldest_pending = sql(
            "SELECT c.task, c.asset, (SELECT e.created_at FROM {p}asset_events AS e "
            "WHERE e.asset_name = c.asset AND e.id > c.cursor ORDER BY e.id LIMIT 1) "
            "FROM {p}task_cursors AS c"
        )


# -- the jobs --------------------------------------------------------------------------------


def _who(writer: Writer | None) -> dict[str, Any]:
    if writer is None:
        return {"kind": None, "who": None, "try": None}
    return {"kind": writer.kind, "who": writer.name, "try": writer.try_number}


def _writer(kind: str | None, name: str | None) -> Writer | None:
    return None if kind is None or name is None else Writer(kind, name)  # type: ignore[arg-type]


def put_state(s: TaskStatements, write: StateWrite, writer: Writer | None) -> Job[None]:
    """Upsert one checked state write (no retention: as ``set`` without one) for ``writer``."""
    who = _who(writer)
    scope = write.scope
    if isinstance(scope, TaskScope):
        yield run(
            s.put_task, dag_id=scope.dag_id, run_id=scope.run_id, task_id=scope.task_id,
            map_index=scope.map_index, key=write.key, value=write.value_json, **who,
        )  # fmt: skip
        return
    assert isinstance(scope, AssetScope)
    found = yield rows(
        s.put_asset, asset_id=scope.asset_id, name=scope.name, uri=scope.uri, key=write.key,
        value=write.value_json, **who,
    )  # fmt: skip
    if not found:
        raise AssetNotFoundError(str(scope))


def check_fence_job(s: TaskStatements, fence: Fence) -> Job[None]:
    """Refuse the transaction's writes unless ``fence``'s lease is live (held ``FOR SHARE``
    to the commit on PostgreSQL, so a claim cannot take it meanwhile)."""
    found = yield rows(s.fence, trigger_id=fence.trigger_id)
    ts = s.dialect.timestamp
    if not found:
        check_fence(fence, None, datetime.min)  # raises: never claimed
        return
    owner, token, expires, now = found[0]
    check_fence(fence, (owner, token, None if expires is None else ts(expires)), ts(now))


def consumer_position(s: TaskStatements, name: str) -> Job[int]:
    found = yield rows(s.position, name=name)
    return int(found[0][0]) if found else 0


def consumer_fetch(
    s: TaskStatements, name: str, assets: list[str] | None, limit: int
) -> Job[list[AssetEvent]]:
    if s.events_lock is not None:  # every event below the ids read has committed
        yield BEGIN
        yield run(s.events_lock)
    if assets is None:
        found = yield rows(s.fetch, name=name, limit=limit)
    else:
        found = yield rows(s.fetch_of, name=name, assets=assets, limit=limit)
    ts, event = s.dialect.timestamp, AssetEvent.from_json
    return [event(r[0], r[1], r[2], r[3], r[4], ts(r[5])) for r in found]


def consumer_ack(
    s: TaskStatements,
    name: str,
    event_id: int,
    state: list[StateWrite],
    expected: int | None,
    writer: Writer | None,
) -> Job[int]:
    yield BEGIN
    found = yield rows(s.lock_consumer, name=name)
    if not found:  # the first: a row to lock (two first acks at once serialise on it)
        yield run(s.add_consumer, name=name)
        found = yield rows(s.lock_consumer, name=name)
    current = found[0][0]
    if expected is not None and expected != current:
        raise ConsumerCursorError(name, event_id, current, f"expected {expected}")
    if event_id < current:
        raise ConsumerCursorError(name, event_id, current, "a cursor only moves forward")
    if state and writer is not None and writer.fence is not None:
        yield from check_fence_job(s, writer.fence)
    who = _who(writer)
    yield run(s.move_consumer, name=name, cursor=event_id, kind=who["kind"], who=who["who"])
    for write in state:
        yield from put_state(s, write, writer)
    return event_id


def sync_tasks(s: TaskStatements, specs: list[TaskSpec]) -> Job[None]:
    yield BEGIN
    batch = sorted(specs, key=lambda spec: spec.name)  # rows locked in one order by all
    yield many(s.declare, [
        {"name": spec.name, "assets": spec.assets, "mode": spec.mode,
         "max_events": spec.max_events, "max_tries": spec.max_tries,
         "batch_window": spec.batch_window, "max_active_runs": spec.max_active_runs}
        for spec in batch
    ])  # fmt: skip
    if s.events_lock is not None:  # a new cursor's start must not pass an event in flight
        yield run(s.events_lock)
    yield many(s.start_cursor, [{"task": p.name, "asset": a} for p in batch for a in p.assets])


def list_tasks(s: TaskStatements) -> Job[list[TaskInfo]]:
    tasks = yield rows(s.tasks)
    cursors = yield rows(s.cursors)
    by_task: dict[str, list[Any]] = {}
    for row in cursors:
        by_task.setdefault(row[0], []).append(row)
    ts, out = s.dialect.timestamp, []
    for row in tasks:
        spec = spec_from_row(s.dialect, row)
        mine = {r[1]: r for r in by_task.get(spec.name, []) if r[1] in spec.assets}
        out.append(
            TaskInfo(
                spec, bool(row[7]),
                {a: r[2] for a, r in mine.items()},
                {a: r[5] for a, r in mine.items()},
                {a: _writer(r[3], r[4]) for a, r in mine.items()},
                None if row[8] is None else ts(row[8]),
            )
        )  # fmt: skip
    return out


def _task(s: TaskStatements, name: str) -> Job[TaskSpec]:
    """Task ``name``'s spec, its row locked on PostgreSQL (:class:`TaskNotFoundError`)."""
    found = yield rows(s.lock_task, name=name)
    if not found:
        raise TaskNotFoundError(f"task {name!r}")
    return spec_from_row(s.dialect, found[0])


def set_paused(s: TaskStatements, name: str, paused: bool) -> Job[None]:
    yield BEGIN
    if not (yield count(s.pause, name=name, paused=paused)):
        raise TaskNotFoundError(f"task {name!r}")


def rewind(
    s: TaskStatements, name: str, asset: str, to_event_id: int, writer: Writer | None
) -> Job[None]:
    yield BEGIN
    spec = yield from _task(s, name)  # locked: serialises with the creation of its runs
    cursor, last = (yield rows(s.positions, name=name, asset=asset))[0]
    moved = check_rewind(spec, asset, to_event_id, cursor or 0, last)
    who = _who(writer)
    yield run(s.rewind, name=name, asset=asset, cursor=moved, kind=who["kind"], who=who["who"])


def retire(s: TaskStatements, keep: list[str]) -> Job[list[str]]:
    yield BEGIN
    return sorted(r[0] for r in (yield rows(s.retire, keep=keep)))


def delete(s: TaskStatements, name: str) -> Job[None]:
    yield BEGIN
    yield from _task(s, name)  # locked: no run of it is created meanwhile
    running = (yield rows(s.running, name=name))[0][0]
    if running is not None:
        raise deleting_running(name, running)
    yield run(s.forget_cursors, name=name)
    yield run(s.forget_task, name=name)


def count_runs(s: TaskStatements) -> Job[dict[tuple[str, str], int]]:
    return {(r[0], r[1]): r[2] for r in (yield rows(s.count_runs))}


def oldest_pending(s: TaskStatements) -> Job[dict[tuple[str, str], datetime]]:
    ts = s.dialect.timestamp
    return {(r[0], r[1]): ts(r[2]) for r in (yield rows(s.oldest_pending)) if r[2] is not None}


# -- the driver ------------------------------------------------------------------------------


class SqlTaskSpecs:
    """The task specs driver (:class:`~watchkeeper.store.protocols.TaskSpecsDriver`) of a SQL
    store; ``events_lock()`` gives the statement :class:`TaskStatements` takes (called once
    the store is set up: it may name the store's schema)."""

    __slots__ = ("_events_lock", "_runner", "_statements")

    def __init__(self, runner: Runner, *, events_lock: Callable[[], str] | None = None) -> None:
        self._runner = runner
        self._events_lock = events_lock
        self._statements: TaskStatements | None = None

    def __repr__(self) -> str:
        return f"<SqlTaskSpecs over {self._runner!r}>"

    @property
    def statements(self) -> TaskStatements:
        """The statements (built on first use: a store knows its schema once it is set up)."""
        s = self._statements
        if s is None:
            r, lock = self._runner, self._events_lock
            s = TaskStatements(r.dialect, r.prefix, None if lock is None else lock())
            self._statements = s
        return s

    async def _aconsumer_position(self, name: str) -> int:
        return await self._runner.read(
            partial(consumer_position, self.statements, name), what="reading a consumer"
        )

    async def _aconsumer_fetch(
        self, name: str, assets: list[str] | None, limit: int
    ) -> list[AssetEvent]:
        job = partial(consumer_fetch, self.statements, name, assets, limit)
        what = "fetching consumer events"
        if self.statements.events_lock is None:
            return await self._runner.read(job, what=what)
        return await self._runner.write(job, what=what)

    async def _aconsumer_ack(
        self,
        name: str,
        event_id: int,
        state: list[StateWrite],
        expected: int | None,
        writer: Writer | None,
    ) -> int:
        return await self._runner.write(
            partial(consumer_ack, self.statements, name, event_id, state, expected, writer),
            what="acknowledging events",
        )

    async def _async_tasks(self, specs: list[TaskSpec]) -> None:
        await self._runner.write(
            partial(sync_tasks, self.statements, specs), what="declaring tasks"
        )

    async def _alist_tasks(self) -> list[TaskInfo]:
        return await self._runner.read(partial(list_tasks, self.statements), what="listing tasks")

    async def _aset_task_paused(self, name: str, paused: bool) -> None:
        await self._runner.write(
            partial(set_paused, self.statements, name, paused), what="pausing a task"
        )

    async def _arewind_task(
        self, name: str, asset: str, to_event_id: int, writer: Writer | None
    ) -> None:
        await self._runner.write(
            partial(rewind, self.statements, name, asset, to_event_id, writer),
            what="rewinding a task",
        )

    async def _aretire_tasks(self, keep: list[str]) -> list[str]:
        return await self._runner.write(
            partial(retire, self.statements, keep), what="retiring tasks"
        )

    async def _adelete_task(self, name: str) -> None:
        await self._runner.write(partial(delete, self.statements, name), what="deleting a task")

    async def _acount_runs(self) -> dict[tuple[str, str], int]:
        return await self._runner.read(partial(count_runs, self.statements), what="counting runs")

    async def _aoldest_pending(self) -> dict[tuple[str, str], datetime]:
        return await self._runner.read(
            partial(oldest_pending, self.statements), what="reading the oldest pending events"
        )
