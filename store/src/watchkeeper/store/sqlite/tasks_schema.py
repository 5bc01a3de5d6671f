"""The SQLite tables of tasks on asset events (migration 8): consumers, tasks, cursors, runs.

- ``event_consumers``: one durable cursor (the last acknowledged event id) per named consumer.
- ``tasks``: the declared tasks, their schedule and whether they are paused.
- ``task_cursors``: per task and scheduled asset, the last event id given to a run; the writer
  columns say who moved it last (``cli`` after a rewind).
- ``task_runs``: one row per run, its lease (owner, token, expiry) and its tries' errors.
- ``task_run_events``: which events belong to which run (what the exactly-once checks count).

Beside them, the statements that find runs by state, which rely on the ``(state, id)`` index
of migration 10 (``test_sqlite.py`` checks their query plans).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ANYTHING_TO_CLAIM",
    "EVENT_COLS",
    "LAPSED_RUNS",
    "READY_RUNS",
    "RUN_COLS",
    "TASK_LIFECYCLE",
    "TASK_TABLES",
    "TRY_COUNTS",
    "runs_query",
]

TASK_TABLES: Final[tuple[str, ...]] = (
    """
    CREATE TABLE event_consumers (
        name        TEXT PRIMARY KEY,
        cursor      INTEGER NOT NULL,
        updated_at  TEXT NOT NULL,
        writer_kind TEXT,
        writer_name TEXT
    )
    """,
    """
    CREATE TABLE tasks (
        name       TEXT PRIMARY KEY,
        assets     TEXT NOT NULL,
        mode       TEXT NOT NULL,
        max_events INTEGER NOT NULL,
        max_tries  INTEGER NOT NULL,
        paused     INTEGER NOT NULL DEFAULT 0,
        updated_at TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE task_cursors (
        task        TEXT NOT NULL,
        asset       TEXT NOT NULL,
        cursor      INTEGER NOT NULL,
        updated_at  TEXT NOT NULL,
        writer_kind TEXT,
        writer_name TEXT,
        PRIMARY KEY (task, asset)
    )
    """,
    """
    CREATE TABLE task_runs (
        id               INTEGER PRIMARY KEY AUTOINCREMENT,
        task             TEXT NOT NULL,
        state            TEXT NOT NULL,
        try_number       INTEGER NOT NULL,
        max_tries        INTEGER NOT NULL,
        event_count      INTEGER NOT NULL,
        lease_owner      TEXT,
        lease_token      INTEGER NOT NULL DEFAULT 0,
        lease_expires_at TEXT,
        not_before       TEXT,
        errors           TEXT NOT NULL DEFAULT '[]',
        outlet_event_ids TEXT NOT NULL DEFAULT '[]',
        created_at       TEXT NOT NULL,
        updated_at       TEXT NOT NULL,
        started_at       TEXT,
        finished_at      TEXT
    )
    """,
    "CREATE INDEX task_runs_open ON task_runs (state, id) WHERE state IN ('queued', 'running')",
    "CREATE INDEX task_runs_task ON task_runs (task, id)",
    """
    CREATE TABLE task_run_events (
        run_id   INTEGER NOT NULL REFERENCES task_runs (id),
        event_id INTEGER NOT NULL,
        task     TEXT NOT NULL,
        asset    TEXT NOT NULL,
        PRIMARY KEY (run_id, event_id)
    )
    """,
    "CREATE INDEX task_run_events_event ON task_run_events (task, event_id)",
)

EVENT_COLS: Final = "ev.id, ev.asset_name, ev.watcher, ev.payload, ev.dedup_key, ev.created_at"
"""An event's columns (``ev``: ``asset_events``), as :func:`.meta.events_result` reads them."""

RUN_COLS: Final = (
    "id, task, state, try_number, max_tries, event_count, created_at, updated_at, started_at, "
    "finished_at, not_before, lease_owner, lease_token, lease_expires_at, errors, "
    "outlet_event_ids, failures, lost_tries"
)

# Migration 11: each run counts the tries its task failed apart from those lost to the
# infrastructure (only the first count against retries), filled from the recorded errors.
TRY_COUNTS: Final[tuple[str, ...]] = (
    "ALTER TABLE task_runs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE task_runs ADD COLUMN lost_tries INTEGER NOT NULL DEFAULT 0",
    """
    UPDATE task_runs SET
        lost_tries = (SELECT count(*) FROM json_each(task_runs.errors)
                      WHERE json_extract(value, '$.error') LIKE 'the lease of worker %'),
        failures = (SELECT count(*) FROM json_each(task_runs.errors)
                    WHERE json_extract(value, '$.error') NOT LIKE 'the lease of worker %')
    WHERE errors != '[]'
    """,
)

# Migration 13: what a task's runs wait for (batch_window, seconds; max_active_runs, NULL: no
# limit), and when the definitions stopped declaring it (removed_at, NULL: declared).
TASK_LIFECYCLE: Final[tuple[str, ...]] = (
    "ALTER TABLE tasks ADD COLUMN batch_window REAL NOT NULL DEFAULT 0",
    "ALTER TABLE tasks ADD COLUMN max_active_runs INTEGER",
    "ALTER TABLE tasks ADD COLUMN removed_at TEXT",
)

# What a claim reads: tries whose lease lapsed, runs ready to start, and whether there may
# be either.
LAPSED_RUNS = (
    "SELECT r.id, r.try_number, r.lost_tries, r.lease_owner, r.errors FROM task_runs r "
    "JOIN tasks t ON t.name = r.task WHERE r.state = 'running' AND t.paused = 0 "
    "AND r.lease_expires_at <= ?"
)
READY_RUNS = (
    "SELECT r.id FROM task_runs r JOIN tasks t ON t.name = r.task WHERE t.paused = 0 "
    "AND r.state = 'queued' AND (r.not_before IS NULL OR r.not_before <= ?)"
)
ANYTHING_TO_CLAIM = (
    "SELECT EXISTS (SELECT 1 FROM task_runs WHERE state = 'queued' "
    "AND (not_before IS NULL OR not_before <= ?)) OR EXISTS (SELECT 1 FROM task_runs "
    "WHERE state = 'running' AND lease_expires_at <= ?) OR (? AND EXISTS (SELECT 1 "
    "FROM task_cursors c JOIN tasks t ON t.name = c.task WHERE t.paused = 0 AND EXISTS "
    "(SELECT 1 FROM asset_events e WHERE e.asset_name = c.asset AND e.id > c.cursor)))"
)


def runs_query(
    task: str | None, state: str | None, before: int | None = None
) -> tuple[str, tuple[object, ...]]:
    """The listing of runs (newest first, below the id ``before``, then ``LIMIT ?``) with
    only the filters given.

    The state is written into the SQL as a literal (it is one of ``RUN_STATES``, checked by
    the caller) so that the ``(state, id)`` index answers, where a ``(? IS NULL OR state = ?)``
    filter scanned every run ever made (the worker lists its running runs at every
    heartbeat)."""
    where = []
    params: tuple[object, ...] = ()
    if task is not None:
        where.append("task = ?")
        params += (task,)
    if state is not None:
        where.append(f"state = '{state}'")
    if before is not None:
        where.append("id < ?")
        params += (before,)
    sql = f"SELECT {RUN_COLS} FROM task_runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql + " ORDER BY id DESC LIMIT ?", params
