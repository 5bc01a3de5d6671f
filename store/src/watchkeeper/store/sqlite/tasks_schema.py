"""The SQLite tables of tasks on asset events (migration 8): consumers, tasks, cursors, runs.

- ``event_consumers``: one durable cursor (the last acknowledged event id) per named consumer.
- ``tasks``: the declared tasks, their schedule and whether they are paused.
- ``task_cursors``: per task and scheduled asset, the last event id given to a run; the writer
  columns say who moved it last (``cli`` after a rewind).
- ``task_runs``: one row per run, its lease (owner, token, expiry) and its tries' errors.
- ``task_run_events``: which events belong to which run (what the exactly-once checks count).

The statements that find runs by state rely on the ``(state, id)`` index of migration 10
(:mod:`watchkeeper.store.sql.run_steps`; ``test_sqlite.py`` checks their query plans).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "TASK_LIFECYCLE",
    "TASK_TABLES",
    "TRY_COUNTS",
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
