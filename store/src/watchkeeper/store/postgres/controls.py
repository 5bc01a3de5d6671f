"""Watcher controls and API tokens of :class:`~watchkeeper.store.PostgresStateBackend`.

Each operation is one short transaction on a pooled connection (controls are rare, operator
actions; they do not go through the event writer). The tables are created by migration 7.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, TypeVar

import anyio

from .._controls import ApiToken, WatcherControl
from ..errors import AssetNotFoundError, TokenExistsError, VersionConflictError
from .connections import close_quietly, connect
from .consumers import events_channel
from .part import PostgresPart
from .schema import table_prefix

_LISTENER_CHECK = 30.0
"""Seconds without a notification after which the LISTEN connection is checked."""

T = TypeVar("T")

__all__ = ["PostgresControls"]

_CONTROL_COLS: Final = "watcher, paused, retry_seq, updated_at, updated_by"
_TOKEN_COLS: Final = "name, token_id, scopes, salt, digest, created_at, expires_at, revoked_at"


def _control(row: Any) -> WatcherControl:
    return WatcherControl(row[0], row[1], row[2], row[3], row[4])


def _token(row: Any) -> ApiToken:
    return ApiToken(row[0], row[1], tuple(row[2]), row[3], row[4], row[5], row[6], row[7])


class PostgresControls(PostgresPart):
    """The controls driver of the PostgreSQL backend and its event feed: a live tail's reads,
    and the wake-ups of the commits' NOTIFY (:class:`~watchkeeper.store.protocols.ControlsDriver`,
    :class:`~watchkeeper.store.protocols.EventFeedDriver`)."""

    def _p(self) -> str:
        return table_prefix(self.schema)

    async def _one(self, what: str, sql: str, *args: Any) -> Any:
        async def run(conn: Any) -> Any:
            return await conn.fetchrow(sql, *args)

        return await self._transact(what, run)

    async def _aset_watcher_paused(self, watcher: str, paused: bool, by: str) -> WatcherControl:
        p = self._p()
        sql = f"""
            INSERT INTO {p}watcher_controls ({_CONTROL_COLS}) VALUES ($1, $2, 0, $3, $4)
            ON CONFLICT (watcher) DO UPDATE SET paused = excluded.paused,
                updated_at = excluded.updated_at, updated_by = excluded.updated_by
            RETURNING {_CONTROL_COLS}
        """
        now = self.clock()
        return _control(await self._one("pausing a watcher", sql, watcher, paused, now, by))

    async def _arequest_watcher_retry(self, watcher: str, by: str) -> WatcherControl:
        p = self._p()
        sql = f"""
            INSERT INTO {p}watcher_controls ({_CONTROL_COLS}) VALUES ($1, false, 1, $2, $3)
            ON CONFLICT (watcher) DO UPDATE SET retry_seq = {p}watcher_controls.retry_seq + 1,
                updated_at = excluded.updated_at, updated_by = excluded.updated_by
            RETURNING {_CONTROL_COLS}
        """
        now = self.clock()
        return _control(await self._one("retrying a watcher", sql, watcher, now, by))

    async def _alist_watcher_controls(self) -> list[WatcherControl]:
        backend = self
        sql = f"SELECT {_CONTROL_COLS} FROM {self._p()}watcher_controls ORDER BY watcher"
        return [_control(r) for r in await backend._fetch("listing watcher controls", sql)]

    async def _alast_event_id(self, asset: str | None) -> int:
        backend = self
        sql = f"SELECT max(id) FROM {self._p()}asset_events"
        if asset is None:
            rows = await backend._fetch("reading the last event id", sql)
        else:
            sql += " WHERE asset_name = $1"
            rows = await backend._fetch("reading the last event id", sql, asset)
        return int(rows[0][0] or 0)

    async def _alist_event_json(
        self, asset: str | None, since_id: int, limit: int
    ) -> list[tuple[int, str]]:
        backend = self
        sql = (
            "SELECT id, json_build_object('id', id, 'asset', asset_name, 'watcher', watcher, "
            "'payload', payload::json, 'dedup_key', dedup_key, 'created_at', to_char("
            "created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"'))::text "
            f"FROM {self._p()}asset_events WHERE id > $1"
        )
        args: list[object] = [int(since_id)]
        if asset is not None:
            sql += " AND asset_name = $2"
            args.append(asset)
        sql += f" ORDER BY id LIMIT ${len(args) + 1}"
        args.append(int(limit))
        rows = await backend._fetch("reading events", sql, *args)
        return [(row[0], row[1]) for row in rows]

    async def _acount_events_since(self, since: datetime) -> dict[str, int]:
        sql = (
            f"SELECT watcher, count(*) FROM {self._p()}asset_events "
            "WHERE created_at >= $1 GROUP BY watcher"
        )
        rows = await self._fetch("counting recent events", sql, since)
        return {str(row[0]): int(row[1]) for row in rows}

    async def _adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:
        p = self._p()

        async def delete(conn: Any) -> None:
            asset_id = await conn.fetchval(
                f"SELECT id FROM {p}assets WHERE name = $1 AND active FOR SHARE", asset
            )
            if asset_id is None:
                raise AssetNotFoundError(asset)
            deleted = await conn.fetchval(
                f"DELETE FROM {p}asset_state WHERE asset_id = $1 AND key = $2 AND version = $3 "
                "RETURNING version",
                asset_id,
                key,
                expected_version,
            )
            if deleted is None:
                actual = await conn.fetchval(
                    f"SELECT version FROM {p}asset_state WHERE asset_id = $1 AND key = $2",
                    asset_id,
                    key,
                )
                raise VersionConflictError(key, expected_version, actual or 0)

        await self._transact("deleting a key", delete)

    async def _acreate_token(self, token: ApiToken) -> None:
        p = self._p()
        sql = f"""
            INSERT INTO {p}api_tokens ({_TOKEN_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)
            ON CONFLICT (name) DO UPDATE SET token_id = excluded.token_id,
                scopes = excluded.scopes, salt = excluded.salt, digest = excluded.digest,
                created_at = excluded.created_at, expires_at = excluded.expires_at,
                revoked_at = NULL
            WHERE {p}api_tokens.revoked_at IS NOT NULL
            RETURNING name
        """
        row = await self._one(
            "creating a token",
            sql,
            token.name,
            token.token_id,
            list(token.scopes),
            token.salt,
            token.digest,
            token.created_at,
            token.expires_at,
        )
        if row is None:
            raise TokenExistsError(token.name)

    async def _alist_tokens(self) -> list[ApiToken]:
        backend = self
        sql = f"SELECT {_TOKEN_COLS} FROM {self._p()}api_tokens ORDER BY name"
        return [_token(r) for r in await backend._fetch("listing tokens", sql)]

    async def _aget_token(self, token_id: str) -> ApiToken | None:
        backend = self
        sql = f"SELECT {_TOKEN_COLS} FROM {self._p()}api_tokens WHERE token_id = $1"
        rows = await backend._fetch("reading a token", sql, token_id)
        return _token(rows[0]) if rows else None

    async def _arevoke_token(self, name: str) -> bool:
        sql = (
            f"UPDATE {self._p()}api_tokens SET revoked_at = $2 "
            "WHERE name = $1 AND revoked_at IS NULL RETURNING name"
        )
        row = await self._one("revoking a token", sql, name, self.clock())
        return row is not None

    # -- wake-ups ----------------------------------------------------------------------------

    async def _last_event_id(self) -> int:
        rows = await self._fetch(
            "reading the last event id",
            f"SELECT coalesce(max(id), 0) FROM {self._prefix}asset_events",
        )
        return int(rows[0][0])

    async def _await_events(self, after_id: int, wait: float) -> int:
        """Woken by the commits' NOTIFY on a listening connection of its own (opened on first
        use, closed with the backend); without one (lost, or refused) it polls every 50 ms.

        The newest id is read only when there may be something new: on a notification, when
        the listener is new, or when polling. A notification that came while the caller was
        busy is still pending, so the caller's next wait returns at once."""
        listener = await self._listener()
        last = after_id
        if listener is None or listener[1] or self._take_signal(listener[0]):
            last = await self._last_event_id()
            if last > after_id:
                return last
        with anyio.move_on_after(wait):
            while True:
                if listener is None:
                    await anyio.sleep(0.05)
                else:
                    with anyio.move_on_after(1.0):  # a notification lost with its connection
                        await listener[0].wait()
                    self._take_signal(listener[0])
                last = await self._last_event_id()
                if last > after_id:
                    return last
                listener = await self._listener()
        return last

    def _take_signal(self, event: anyio.Event) -> bool:
        """Whether ``event`` was set; if so, the next notification sets a fresh one (before
        the caller reads, so nothing committed after the read goes unnoticed)."""
        state: dict[str, Any] = self.__dict__.get("_listen_state", {})
        if not event.is_set():
            return False
        if state.get("event") is event:
            state["event"] = anyio.Event()
        return True

    async def _listener(self) -> tuple[anyio.Event, bool] | None:
        """The event the listening connection sets on a notification, and whether the
        connection was opened just now (events committed before it were not notified)."""
        state: dict[str, Any] = self.__dict__.setdefault("_listen_state", {})
        conn = state.get("conn")
        if conn is not None and self._freshness.stale(conn):
            conn.terminate()  # made before a statement timed out: maybe as silent
        if conn is not None and not conn.is_closed():
            if anyio.current_time() - state["checked_at"] < _LISTENER_CHECK:
                return state["event"], False
            # Quiet for a while: make sure it still answers (a network that drops its bytes
            # would leave it silent for ever); if not, a new one listens.
            try:
                await conn.execute("SELECT 1")
            except BaseException as exc:
                conn.terminate()
                if not isinstance(exc, Exception):
                    raise
            else:
                state["checked_at"] = anyio.current_time()
                return state["event"], False
        if state.get("failed_at") is not None and anyio.current_time() - state["failed_at"] < 5:
            return None
        try:
            conn = await connect(self._dsn, **self._connect_args())
            now = anyio.current_time()
            state.update(conn=conn, event=anyio.Event(), failed_at=None, checked_at=now)

            def notified(*_: object) -> None:
                state["event"].set()

            await conn.add_listener(events_channel(self.schema), notified)
        except Exception:  # noqa: BLE001 - no listener: poll instead, and try again later
            state.update(conn=None, failed_at=anyio.current_time())
            return None
        return state["event"], True

    async def _close_listener(self) -> None:
        state: dict[str, Any] = self.__dict__.get("_listen_state", {})
        await close_quietly(state.pop("conn", None))
