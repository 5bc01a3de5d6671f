"""Watcher controls and API tokens of :class:`~watchkeeper.store.SqliteStateBackend`.

Writes go through the backend's group-commit writer, reads through its reader connection,
like every other operation of that backend; the tables are created by migration 7.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio

from .._controls import ApiToken, WatcherControl
from .._types import AssetScope
from ..errors import TokenExistsError, VersionConflictError
from .part import SqlitePart
from .schema import from_db, to_db

if TYPE_CHECKING:
    from .writer import Tx

T = TypeVar("T")

__all__ = ["SqliteControls"]

_CONTROL_COLS: Final = "watcher, paused, retry_seq, updated_at, updated_by"
_TOKEN_COLS: Final = "name, token_id, scopes, salt, digest, created_at, expires_at, revoked_at"


def _control(row: Any) -> WatcherControl:
    return WatcherControl(row[0], bool(row[1]), row[2], from_db(row[3]), row[4])


def _token(row: Any) -> ApiToken:
    return ApiToken(
        name=row[0],
        token_id=row[1],
        scopes=tuple(json.loads(row[2])),
        salt=row[3],
        digest=row[4],
        created_at=from_db(row[5]),
        expires_at=None if row[6] is None else from_db(row[6]),
        revoked_at=None if row[7] is None else from_db(row[7]),
    )


class SqliteControls(SqlitePart):
    """The controls driver of the SQLite backend and its event feed (a live tail's reads)
    (:class:`~watchkeeper.store.protocols.ControlsDriver`,
    :class:`~watchkeeper.store.protocols.EventFeedDriver`)."""

    async def _aset_watcher_paused(self, watcher: str, paused: bool, by: str) -> WatcherControl:
        flag = 1 if paused else 0

        def write(tx: Tx) -> WatcherControl:
            row = tx.conn.execute(
                f"""
                INSERT INTO watcher_controls ({_CONTROL_COLS}) VALUES (?, ?, 0, ?, ?)
                ON CONFLICT (watcher) DO UPDATE SET paused = excluded.paused,
                    updated_at = excluded.updated_at, updated_by = excluded.updated_by
                RETURNING {_CONTROL_COLS}
                """,
                (watcher, flag, tx.now()[1], by),
            ).fetchone()
            return _control(row)

        return await self._write(write, savepoint=False)

    async def _arequest_watcher_retry(self, watcher: str, by: str) -> WatcherControl:

        def write(tx: Tx) -> WatcherControl:
            row = tx.conn.execute(
                f"""
                INSERT INTO watcher_controls ({_CONTROL_COLS}) VALUES (?, 0, 1, ?, ?)
                ON CONFLICT (watcher) DO UPDATE SET retry_seq = watcher_controls.retry_seq + 1,
                    updated_at = excluded.updated_at, updated_by = excluded.updated_by
                RETURNING {_CONTROL_COLS}
                """,
                (watcher, tx.now()[1], by),
            ).fetchone()
            return _control(row)

        return await self._write(write, savepoint=False)

    async def _alist_watcher_controls(self) -> list[WatcherControl]:
        sql = f"SELECT {_CONTROL_COLS} FROM watcher_controls ORDER BY watcher"
        return [_control(row) for row in await self._read(sql)]

    async def _alast_event_id(self, asset: str | None) -> int:
        if asset is None:
            rows = await self._read("SELECT max(id) FROM asset_events")
        else:
            sql = "SELECT max(id) FROM asset_events WHERE asset_name = ?"
            rows = await self._read(sql, (asset,))
        return int(rows[0][0] or 0)

    async def _alist_event_json(
        self, asset: str | None, since_id: int, limit: int
    ) -> list[tuple[int, str]]:
        sql = (
            "SELECT id, json_object('id', id, 'asset', asset_name, 'watcher', watcher, "
            "'payload', json(payload), 'dedup_key', dedup_key, 'created_at', created_at) "
            "FROM asset_events WHERE id > ?"
        )
        params: list[object] = [int(since_id)]
        if asset is not None:
            sql += " AND asset_name = ?"
            params.append(asset)
        sql += " ORDER BY id LIMIT ?"
        params.append(int(limit))
        rows = await self._read(sql, params)
        return cast("list[tuple[int, str]]", rows)  # (id, json) tuples as they come

    async def _acount_events_since(self, since: datetime) -> dict[str, int]:
        sql = "SELECT watcher, count(*) FROM asset_events WHERE created_at >= ? GROUP BY watcher"
        rows = await self._read(sql, (to_db(since),))
        return {str(row[0]): int(row[1]) for row in rows}

    async def _adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:

        def write(tx: Tx) -> None:
            asset_id, _ = tx.resolve(AssetScope(name=asset))
            cursor = tx.conn.execute(
                "DELETE FROM asset_state WHERE asset_id = ? AND key = ? AND version = ?",
                (asset_id, key, expected_version),
            )
            if cursor.rowcount == 0:
                row = tx.conn.execute(
                    "SELECT version FROM asset_state WHERE asset_id = ? AND key = ?",
                    (asset_id, key),
                ).fetchone()
                raise VersionConflictError(key, expected_version, 0 if row is None else row[0])

        await self._write(write)

    async def _acreate_token(self, token: ApiToken) -> None:
        params = (
            token.name,
            token.token_id,
            json.dumps(list(token.scopes)),
            token.salt,
            token.digest,
            to_db(token.created_at),
            None if token.expires_at is None else to_db(token.expires_at),
        )

        def write(tx: Tx) -> bool:
            rows = tx.conn.execute(
                f"""
                INSERT INTO api_tokens ({_TOKEN_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)
                ON CONFLICT (name) DO UPDATE SET token_id = excluded.token_id,
                    scopes = excluded.scopes, salt = excluded.salt, digest = excluded.digest,
                    created_at = excluded.created_at, expires_at = excluded.expires_at,
                    revoked_at = NULL
                WHERE api_tokens.revoked_at IS NOT NULL
                RETURNING name
                """,
                params,
            ).fetchall()
            return bool(rows)

        if not await self._write(write, savepoint=False):
            raise TokenExistsError(token.name)

    async def _alist_tokens(self) -> list[ApiToken]:
        sql = f"SELECT {_TOKEN_COLS} FROM api_tokens ORDER BY name"
        return [_token(row) for row in await self._read(sql)]

    async def _aget_token(self, token_id: str) -> ApiToken | None:
        sql = f"SELECT {_TOKEN_COLS} FROM api_tokens WHERE token_id = ?"
        rows = await self._read(sql, (token_id,))
        return _token(rows[0]) if rows else None

    async def _arevoke_token(self, name: str) -> bool:
        def write(tx: Tx) -> bool:
            cursor = tx.conn.execute(
                "UPDATE api_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
                (tx.now()[1], name),
            )
            return cursor.rowcount > 0

        return await self._write(write, savepoint=False)

    async def _await_events(self, after_id: int, wait: float) -> int:
        """Poll the newest event id (a cheap read: the primary key's last row) until it is past
        ``after_id`` or ``wait`` seconds have passed: other processes commit into the file.

        The poll adapts: every 2 ms at first, doubling up to 20 ms while nothing comes, so a
        busy log is seen at once and an idle one costs a read per 20 ms."""
        last = 0
        pause = 0.002
        with anyio.move_on_after(wait):
            while True:
                rows = await self._read("SELECT coalesce(max(id), 0) FROM asset_events")
                last = int(rows[0][0])
                if last > after_id:
                    return last
                await anyio.sleep(min(pause, wait))
                pause = min(pause * 2, 0.02)
        return last
