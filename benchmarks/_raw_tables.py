"""The raw baselines' sink: tables shaped like the store's event log and asset state.

Every benchmark that compares a watcher with a raw loop writes the raw side into these tables,
so the baseline does the work the store does (an event row with its dedup index, the asset's
state row upserted with a version) and nothing more. Not part of any package.
"""

from __future__ import annotations

__all__ = ["SQLITE_PRAGMAS", "pg_tables", "sqlite_tables"]

SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL")


def sqlite_tables(*, created_index: bool = False) -> tuple[str, ...]:
    """The pragmas and tables; ``created_index`` adds the event log's ``created_at`` index (the
    store keeps one for retention)."""
    created = (
        ("CREATE INDEX asset_events_created ON asset_events (created_at)",) if created_index else ()
    )
    return (
        *SQLITE_PRAGMAS,
        """CREATE TABLE asset_events (
            id INTEGER PRIMARY KEY AUTOINCREMENT, asset_id INTEGER NOT NULL,
            asset_name TEXT NOT NULL, watcher TEXT NOT NULL, payload TEXT NOT NULL,
            dedup_key TEXT, created_at TEXT NOT NULL)""",
        (
            "CREATE UNIQUE INDEX asset_events_dedup ON asset_events (asset_id, dedup_key) "
            "WHERE dedup_key IS NOT NULL"
        ),
        "CREATE INDEX asset_events_asset ON asset_events (asset_name, id)",
        *created,
        """CREATE TABLE asset_state (
            asset_id INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
            version INTEGER NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (asset_id, key))""",
    )


def pg_tables(prefix: str = "", *, created_index: bool = False) -> tuple[str, ...]:
    """The tables under ``prefix`` (``'"schema".'`` or empty); ``created_index`` as for SQLite."""
    p = prefix
    created = (f"CREATE INDEX ON {p}asset_events (created_at)",) if created_index else ()
    return (
        f"""CREATE TABLE {p}asset_events (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, asset_id bigint NOT NULL,
            asset_name text COLLATE "C" NOT NULL, watcher text NOT NULL, payload text NOT NULL,
            dedup_key text, created_at timestamptz NOT NULL)""",
        f"CREATE UNIQUE INDEX ON {p}asset_events (asset_id, dedup_key) WHERE dedup_key IS NOT NULL",
        f"CREATE INDEX ON {p}asset_events (asset_name, id)",
        *created,
        f"""CREATE TABLE {p}asset_state (
            asset_id bigint NOT NULL, key text COLLATE "C" NOT NULL, value text NOT NULL,
            version bigint NOT NULL, updated_at timestamptz NOT NULL,
            PRIMARY KEY (asset_id, key))""",
    )
