"""The metastore SQL of :class:`~watchkeeper.store.SqliteStateBackend`: assets, events,
and maintenance (GC, status and leases are :mod:`watchkeeper.store.sql`'s).

Like :mod:`watchkeeper.store.sqlite.ops`: write operations run in the writer's thread inside a batch
transaction; ``*_query``/``*_result`` pairs are the reads. Reports keep ``rowid`` order, which
is the memory backend's insertion order (an upsert keeps its row's ``rowid``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    AssetScope,
    EventCommit,
)
from .ops import ASSET_UPSERT, Query, Row, check_fence_in, writer_cols
from .schema import apply_migrations, from_db
from .writer import Tx

_EVENT_INSERT: Final = """
    INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, created_at)
    VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (asset_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id
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
