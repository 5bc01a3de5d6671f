"""Watcher controls and API tokens of :class:`~watchkeeper.store.MemoryStateBackend`."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime

import anyio

from ._controls import ApiToken, WatcherControl
from ._memory_part import MemoryCore, MemoryPart
from ._types import AssetScope
from .errors import TokenExistsError, VersionConflictError

__all__ = ["MemoryControls"]


class MemoryControls(MemoryPart):
    """The controls driver of the memory backend (the rows in two dicts) and its event feed
    (:class:`~.protocols.ControlsDriver`, :class:`~.protocols.EventFeedDriver`)."""

    def __init__(self, store: MemoryCore) -> None:
        super().__init__(store)
        self._controls_lock = threading.Lock()
        self._controls: dict[str, WatcherControl] = {}
        self._tokens: dict[str, ApiToken] = {}

    def _controls_now(self) -> datetime:
        return self.clock()

    def _control_row(self, watcher: str, now: datetime) -> WatcherControl:
        row = self._controls.get(watcher)
        return row if row is not None else WatcherControl(watcher, False, 0, now)

    async def _aset_watcher_paused(self, watcher: str, paused: bool, by: str) -> WatcherControl:
        with self._controls_lock:
            now = self._controls_now()
            row = replace(
                self._control_row(watcher, now), paused=paused, updated_at=now, updated_by=by
            )
            self._controls[watcher] = row
            return row

    async def _arequest_watcher_retry(self, watcher: str, by: str) -> WatcherControl:
        with self._controls_lock:
            now = self._controls_now()
            old = self._control_row(watcher, now)
            row = replace(old, retry_seq=old.retry_seq + 1, updated_at=now, updated_by=by)
            self._controls[watcher] = row
            return row

    async def _alist_watcher_controls(self) -> list[WatcherControl]:
        with self._controls_lock:
            return [self._controls[k] for k in sorted(self._controls)]

    async def _alast_event_id(self, asset: str | None) -> int:
        events = self._events
        for event in reversed(events):
            if asset is None or event.asset == asset:
                return event.id
        return 0

    async def _acount_events_since(self, since: datetime) -> dict[str, int]:
        events = self._events
        counts: dict[str, int] = {}
        for event in reversed(events):  # in commit order, so in time order
            if event.created_at < since:
                break
            counts[event.watcher] = counts.get(event.watcher, 0) + 1
        return counts

    async def _adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:
        backend = self
        with backend._lock:
            row = backend._resolve(AssetScope(name=asset))
            entry = backend._asset_state.get((row.asset_id, key))
            actual = 0 if entry is None else entry.version
            if actual != expected_version or entry is None:
                raise VersionConflictError(key, expected_version, actual)
            del backend._asset_state[(row.asset_id, key)]

    async def _acreate_token(self, token: ApiToken) -> None:
        with self._controls_lock:
            old = self._tokens.get(token.name)
            if old is not None and old.revoked_at is None:
                raise TokenExistsError(token.name)
            self._tokens[token.name] = token

    async def _alist_tokens(self) -> list[ApiToken]:
        with self._controls_lock:
            return [self._tokens[k] for k in sorted(self._tokens)]

    async def _aget_token(self, token_id: str) -> ApiToken | None:
        with self._controls_lock:
            for token in self._tokens.values():
                if token.token_id == token_id:
                    return token
            return None

    async def _arevoke_token(self, name: str) -> bool:
        with self._controls_lock:
            old = self._tokens.get(name)
            if old is None or old.revoked_at is not None:
                return False
            self._tokens[name] = replace(old, revoked_at=self._controls_now())
            return True

    async def _await_events(self, after_id: int, wait: float) -> int:
        with anyio.move_on_after(wait):
            while True:
                last = self._events[-1].id if self._events else 0
                if last > after_id:
                    return last
                await anyio.sleep(0.01)
        return self._events[-1].id if self._events else 0
