"""The event feed of :class:`~watchkeeper.store.PostgresStateBackend`: a live tail's reads
(event JSON) and the wake-ups of the commits' NOTIFY. Watcher controls and API tokens are
:mod:`watchkeeper.store.sql.controls`', run on the pool by :class:`.executor.PostgresRunner`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

import anyio

from .connections import close_quietly, connect
from .consumers import events_channel
from .part import PostgresPart
from .schema import table_prefix

_LISTENER_CHECK = 30.0
"""Seconds without a notification after which the LISTEN connection is checked."""

T = TypeVar("T")

__all__ = ["PostgresControls"]


class PostgresControls(PostgresPart):
    """The event feed of the PostgreSQL backend: a live tail's reads, and the wake-ups of the
    commits' NOTIFY (:class:`~watchkeeper.store.protocols.EventFeedDriver`)."""

    def _p(self) -> str:
        return table_prefix(self.schema)

    async def _alast_event_id(self, asset: str | None) -> int:
        backend = self
        sql = f"SELECT max(id) FROM {self._p()}asset_events"
        if asset is None:
            rows = await backend._fetch("reading the last event id", sql)
        else:
            sql += " WHERE asset_name = $1"
            rows = await backend._fetch("reading the last event id", sql, asset)
        return int(rows[0][0] or 0)

    async def _acount_events_since(self, since: datetime) -> dict[str, int]:
        sql = (
            f"SELECT watcher, count(*) FROM {self._p()}asset_events "
            "WHERE created_at >= $1 GROUP BY watcher"
        )
        rows = await self._fetch("counting recent events", sql, since)
        return {str(row[0]): int(row[1]) for row in rows}

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
