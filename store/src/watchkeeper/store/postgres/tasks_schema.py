"""The PostgreSQL tables of tasks on asset events (migration 8); see :mod:`..sqlite.tasks_schema`.

``{p}`` is the quoted schema prefix, as in :mod:`.schema`.
"""

from __future__ import annotations

from typing import Final

__all__ = ["TASK_LIFECYCLE", "TASK_TABLES", "TRY_COUNTS"]

TASK_TABLES: Final[tuple[str, ...]] = (
    """
    CREATE TABLE {p}event_consumers (
        name        text COLLATE "C" PRIMARY KEY,
        cursor      bigint NOT NULL,
        updated_at  timestamptz NOT NULL,
        writer_kind text,
        writer_name text
    )
    """,
    """
    CREATE TABLE {p}tasks (
        name       text COLLATE "C" PRIMARY KEY,
        assets     text[] NOT NULL,
        mode       text NOT NULL,
        max_events integer NOT NULL,
        max_tries  integer NOT NULL,
        paused     boolean NOT NULL DEFAULT false,
        updated_at timestamptz NOT NULL
    )
    """,
    """
    CREATE TABLE {p}task_cursors (
        task        text COLLATE "C" NOT NULL,
        asset       text COLLATE "C" NOT NULL,
        cursor      bigint NOT NULL,
        updated_at  timestamptz NOT NULL,
        writer_kind text,
        writer_name text,
        PRIMARY KEY (task, asset)
    )
    """,
    """
    CREATE TABLE {p}task_runs (
        id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        task             text COLLATE "C" NOT NULL,
        state            text NOT NULL,
        try_number       integer NOT NULL,
        max_tries        integer NOT NULL,
        event_count      integer NOT NULL,
        lease_owner      text,
        lease_token      bigint NOT NULL DEFAULT 0,
        lease_expires_at timestamptz,
        not_before       timestamptz,
        errors           text NOT NULL DEFAULT '[]',
        outlet_event_ids text NOT NULL DEFAULT '[]',
        created_at       timestamptz NOT NULL,
        updated_at       timestamptz NOT NULL,
        started_at       timestamptz,
        finished_at      timestamptz
    )
    """,
    """
    CREATE INDEX task_runs_open ON {p}task_runs (id)
    WHERE state IN ('queued', 'running')
    """,
    "CREATE INDEX task_runs_task ON {p}task_runs (task, id)",
    """
    CREATE TABLE {p}task_run_events (
        run_id   bigint NOT NULL REFERENCES {p}task_runs (id),
        event_id bigint NOT NULL,
        task     text COLLATE "C" NOT NULL,
        asset    text COLLATE "C" NOT NULL,
        PRIMARY KEY (run_id, event_id)
    )
    """,
    "CREATE INDEX task_run_events_event ON {p}task_run_events (task, event_id)",
)

# Migration 10: each run counts the tries its task failed apart from those lost to the
# infrastructure (only the first count against retries), filled from the recorded errors.
TRY_COUNTS: Final[tuple[str, ...]] = (
    """
    ALTER TABLE {p}task_runs ADD COLUMN failures integer NOT NULL DEFAULT 0,
    ADD COLUMN lost_tries integer NOT NULL DEFAULT 0
    """,
    """
    UPDATE {p}task_runs r SET
        lost_tries = (SELECT count(*) FROM jsonb_array_elements(r.errors::jsonb) e
                      WHERE e ->> 'error' LIKE 'the lease of worker %'),
        failures = (SELECT count(*) FROM jsonb_array_elements(r.errors::jsonb) e
                    WHERE e ->> 'error' NOT LIKE 'the lease of worker %')
    WHERE r.errors <> '[]'
    """,
)

# Migration 13: what a task's runs wait for (batch_window, seconds; max_active_runs, NULL: no
# limit), and when the definitions stopped declaring it (removed_at, NULL: declared).
TASK_LIFECYCLE: Final[tuple[str, ...]] = (
    """
    ALTER TABLE {p}tasks ADD COLUMN batch_window double precision NOT NULL DEFAULT 0,
    ADD COLUMN max_active_runs integer, ADD COLUMN removed_at timestamptz
    """,
)
