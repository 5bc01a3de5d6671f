"""The metastore SQL of :class:`~watchkeeper.store.SqliteStateBackend`: assets, events,
garbage collection, trigger and daemon status, trigger leases and maintenance.

Like :mod:`watchkeeper.store.sqlite.ops`: write operations run in the writer's thread inside a batch
transaction; ``*_query``/``*_result`` pairs are the reads. Reports keep ``rowid`` order, which
is the memory backend's insertion order (an upsert keeps its row's ``rowid``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal

from .._daemons import decode_refused, decode_settings, encode_refused
from .._gc import EventCutoffs
from .._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    AssetScope,
    DaemonStatus,
    EventCommit,
    TaskScope,
    TriggerStatus,
)
from .ops import ASSET_UPSERT, Query, Row, check_fence_in, writer_cols
from .schema import apply_migrations, from_db, to_db
from .writer import Tx

GcKind = Literal["expired", "retention", "orphaned"]

GC_KINDS: Final[tuple[GcKind, ...]] = ("expired", "retention", "orphaned")

_EVENT_INSERT: Final = """
    INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, created_at)
    VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (asset_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id
"""

_GC_TASK_WHERE: Final = {
    "expired": "never_expire = 0 AND expires_at IS NOT NULL AND expires_at < ?",
    "retention": "never_expire = 0 AND expires_at IS NULL AND updated_at < ?",
}
_GC_TASK_COLS: Final = "rowid, dag_id, run_id, task_id, map_index, key"
_GC_ORPHAN_WHERE: Final = "asset_id IN (SELECT id FROM assets WHERE active = 0)"
# _gc.py's rule; a NULL dedup cutoff (keep events with a dedup key forever) is never true.
_GC_EVENTS_WHERE: Final = "created_at < ? AND (dedup_key IS NULL OR created_at < ?)"

STATUS_LIST_SQL: Final = """
    SELECT trigger_id, classpath, assets, watchers, state, failures, last_error, last_event_at,
           events, updated_at, owner
    FROM trigger_status ORDER BY trigger_id
"""
_STATUS_SAVE: Final = """
    INSERT OR REPLACE INTO trigger_status (trigger_id, classpath, assets, watchers, state,
        failures, last_error, last_event_at, events, updated_at, owner)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

_SYNCHRONOUS_NAMES: Final = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


# -- assets ------------------------------------------------------------------------------------


def register_assets(tx: Tx, assets: Sequence[Asset]) -> None:
    stamp = tx.now()[1]
    tx.forget_assets()
    tx.conn.executemany(
        """
        INSERT INTO assets (name, uri, active, created_at, updated_at) VALUES (?, ?, 1, ?, ?)
        ON CONFLICT (name) DO UPDATE SET
            uri = excluded.uri, active = 1, updated_at = excluded.updated_at
        """,
        [(asset.name, asset.uri, stamp, stamp) for asset in assets],
    )


def deactivate_asset(tx: Tx, name: str) -> bool:
    tx.forget_assets()
    cursor = tx.conn.execute(
        "UPDATE assets SET active = 0, updated_at = ? WHERE name = ? AND active = 1",
        (tx.now()[1], name),
    )
    return cursor.rowcount > 0


def assets_query(active_only: bool) -> Query:
    where = " WHERE active = 1" if active_only else ""
    return f"SELECT id, name, uri, active, updated_at FROM assets{where} ORDER BY name", ()


def assets_result(rows: list[Row]) -> list[AssetInfo]:
    return [AssetInfo(row[0], row[1], row[2], bool(row[3]), from_db(row[4])) for row in rows]


# -- events --------------------------------------------------------------------------------------


def commit_event(tx: Tx, commit: EventCommit) -> list[AssetEvent]:
    """Insert one event per asset unless its dedup_key is recorded there, with its state."""
    check_fence_in(tx, commit.fence)  # first: a refused commit writes nothing
    targets: dict[int, str] = {}
    for name in commit.assets:  # resolve all first: an unknown asset writes nothing
        asset_id, resolved = tx.resolve(AssetScope(name=name))
        targets.setdefault(asset_id, resolved)  # an asset named twice gets one event
    created, stamp = tx.now()
    who = writer_cols(commit.writer)
    conn = tx.conn
    written: list[AssetEvent] = []
    for asset_id, name in targets.items():
        params = (asset_id, name, commit.watcher, commit.payload_json, commit.dedup_key, stamp)
        rows = conn.execute(_EVENT_INSERT, params).fetchall()
        if not rows:
            continue  # a duplicate: neither the event nor its state
        written.append(
            AssetEvent.from_json(
                rows[0][0], name, commit.watcher, commit.payload_json, commit.dedup_key, created
            )
        )
        for key, value_json in commit.state.items():
            conn.execute(ASSET_UPSERT, (asset_id, key, value_json, stamp, *who)).fetchall()
    return written


def events_query(
    asset: str | None,
    since_id: int,
    limit: int | None,
    before_id: int | None = None,
    newest_first: bool = False,
) -> Query:
    sql = (
        "SELECT id, asset_name, watcher, payload, dedup_key, created_at "
        "FROM asset_events WHERE id > ?"
    )
    params: list[object] = [since_id]
    if before_id is not None:
        sql += " AND id < ?"
        params.append(before_id)
    if asset is not None:
        sql += " AND asset_name = ?"
        params.append(asset)
    sql += " ORDER BY id DESC" if newest_first else " ORDER BY id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return sql, params


def events_result(rows: list[Row]) -> list[AssetEvent]:
    event = AssetEvent.from_json  # each payload decoded when it is read
    return [event(row[0], row[1], row[2], row[3], row[4], from_db(row[5])) for row in rows]


# -- garbage collection --------------------------------------------------------------------------


def gc_select(kind: GcKind, bound: datetime) -> Query:
    """What :func:`gc_delete` would delete (the dry run)."""
    if kind == "orphaned":
        sql = (
            "SELECT s.rowid, a.name, s.key FROM asset_state s JOIN assets a ON a.id = s.asset_id "
            "WHERE a.active = 0 ORDER BY s.rowid"
        )
        return sql, ()
    where = _GC_TASK_WHERE[kind]
    return f"SELECT {_GC_TASK_COLS} FROM task_state WHERE {where} ORDER BY rowid", (to_db(bound),)


def gc_rows(kind: GcKind, rows: list[Row]) -> list[Any]:
    rows = sorted(rows, key=lambda row: row[0])
    if kind == "orphaned":
        return [(row[1], row[2]) for row in rows]
    return [(TaskScope._from_row(row[1], row[2], row[3], row[4]), row[5]) for row in rows]


def gc_delete(tx: Tx, kind: GcKind, bound: datetime, limit: int) -> list[Any]:
    """Delete the rows of one kind (at most ``limit``; 0: all, in one statement)."""
    conn = tx.conn
    if kind == "orphaned":
        names = dict(conn.execute("SELECT id, name FROM assets WHERE active = 0").fetchall())
        params: tuple[str, ...] = ()
        where, cols = _GC_ORPHAN_WHERE, "rowid, asset_id, key"
        table = "asset_state"
    else:
        where, params, cols = _GC_TASK_WHERE[kind], (to_db(bound),), _GC_TASK_COLS
        table = "task_state"
    if limit:
        sql = (
            f"DELETE FROM {table} WHERE rowid IN "
            f"(SELECT rowid FROM {table} WHERE {where} ORDER BY rowid LIMIT ?) RETURNING {cols}"
        )
        rows = conn.execute(sql, (*params, limit)).fetchall()
    else:
        rows = conn.execute(
            f"DELETE FROM {table} WHERE {where} RETURNING {cols}", params
        ).fetchall()
    if kind == "orphaned":
        rows = [(row[0], names[row[1]], row[2]) for row in rows]
    return gc_rows(kind, rows)


def _event_bounds(cutoffs: EventCutoffs) -> tuple[str, str | None]:
    dedup = cutoffs.dedup
    return to_db(cutoffs.events), None if dedup is None else to_db(dedup)


def gc_events_select(cutoffs: EventCutoffs) -> Query:
    """How many events :func:`gc_events_delete` would delete (the dry run)."""
    return f"SELECT count(*) FROM asset_events WHERE {_GC_EVENTS_WHERE}", _event_bounds(cutoffs)


def gc_events_delete(tx: Tx, cutoffs: EventCutoffs, limit: int) -> int:
    """Delete the events past retention (at most ``limit``; 0: all); return how many."""
    params = _event_bounds(cutoffs)
    if limit:
        sql = (
            "DELETE FROM asset_events WHERE id IN "
            f"(SELECT id FROM asset_events WHERE {_GC_EVENTS_WHERE} LIMIT ?)"
        )
        return tx.conn.execute(sql, (*params, limit)).rowcount
    return tx.conn.execute(f"DELETE FROM asset_events WHERE {_GC_EVENTS_WHERE}", params).rowcount


# -- trigger status ------------------------------------------------------------------------------


def _stamp(value: datetime | None) -> str | None:
    # Kept as given (not forced to UTC): the status rows round-trip exactly.
    return None if value is None else value.isoformat()


def _unstamp(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def save_statuses(tx: Tx, statuses: Sequence[TriggerStatus]) -> None:
    tx.conn.executemany(
        _STATUS_SAVE,
        [
            (
                s.trigger_id,
                s.classpath,
                json.dumps(list(s.assets)),
                json.dumps(list(s.watchers)),
                s.state,
                s.failures,
                s.last_error,
                _stamp(s.last_event_at),
                s.events,
                _stamp(s.updated_at),
                s.owner,
            )
            for s in statuses
        ],
    )


def delete_statuses(tx: Tx, trigger_ids: Sequence[str]) -> None:
    tx.conn.executemany(
        "DELETE FROM trigger_status WHERE trigger_id = ?", [(tid,) for tid in trigger_ids]
    )


def statuses_result(rows: list[Row]) -> list[TriggerStatus]:
    return [
        TriggerStatus(
            trigger_id=row[0],
            classpath=row[1],
            assets=tuple(json.loads(row[2])),
            watchers=tuple(json.loads(row[3])),
            state=row[4],
            failures=row[5],
            last_error=row[6],
            last_event_at=_unstamp(row[7]),
            events=row[8],
            updated_at=_unstamp(row[9]),
            owner=row[10],
        )
        for row in rows
    ]


# -- daemon status -------------------------------------------------------------------------------

DAEMON_LIST_SQL: Final = """
    SELECT owner, started_at, heartbeat_at, lease_ttl, watchers_path, refused
    FROM daemon_status ORDER BY owner
"""
_DAEMON_SAVE: Final = """
    INSERT OR REPLACE INTO daemon_status (owner, started_at, heartbeat_at, lease_ttl,
        watchers_path, refused)
    VALUES (?, ?, ?, ?, ?, ?)
"""


def save_daemon(tx: Tx, status: DaemonStatus) -> None:
    tx.conn.execute(
        _DAEMON_SAVE,
        (
            status.owner,
            to_db(status.started_at),
            to_db(status.heartbeat_at),
            float(status.lease_ttl),
            status.watchers_path,
            encode_refused(status.refused, status.settings),
        ),
    )


def delete_daemons(tx: Tx, owners: Sequence[str]) -> None:
    tx.conn.executemany("DELETE FROM daemon_status WHERE owner = ?", [(o,) for o in owners])


def daemons_result(rows: list[Row]) -> list[DaemonStatus]:
    return [
        DaemonStatus(
            owner=row[0],
            started_at=from_db(row[1]),
            heartbeat_at=from_db(row[2]),
            lease_ttl=row[3],
            watchers_path=row[4],
            refused=decode_refused(row[5]),
            settings=decode_settings(row[5]),
        )
        for row in rows
    ]


# -- maintenance ---------------------------------------------------------------------------------


def migrate_in(tx: Tx) -> list[int]:
    tx.forget_assets()
    return apply_migrations(tx.conn, tx.now()[0])


def pragmas(tx: Tx) -> dict[str, object]:
    conn = tx.conn
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return {
        "journal_mode": str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower(),
        "synchronous": _SYNCHRONOUS_NAMES.get(sync, str(sync)),
        "busy_timeout": conn.execute("PRAGMA busy_timeout").fetchone()[0] / 1000,
        "foreign_keys": bool(conn.execute("PRAGMA foreign_keys").fetchone()[0]),
    }
