"""The optional parts of a backend: the metastore features and the worker-side offload hooks.

:class:`~watchkeeper.store.BaseStateBackend` inherits these defaults. The built-in backends
(memory, SQLite, PostgreSQL) implement the metastore; a custom backend may leave any of it out,
and each method then raises ``NotImplementedError`` naming the backend and the feature.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime, timedelta

from ._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    AssetScope,
    DaemonStatus,
    EventCommit,
    GcReport,
    Lease,
    TaskScope,
    TriggerStatus,
)
from ._values import JSONValue

__all__ = ["MetastoreFeatures"]


class MetastoreFeatures:
    """Defaults for asset registration, events, GC, trigger status, leases and offloading."""

    # -- metastore features (async only; built-in backends implement them) ---------------------

    def _unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} does not support {what}")

    async def amigrate(self) -> builtins.list[int]:
        """Apply pending schema migrations; return the versions applied (opening does this too)."""
        return []

    async def aregister_assets(self, assets: Sequence[Asset]) -> None:
        """Register ``assets`` (insert or update their URI) and mark them active."""
        raise self._unsupported("asset registration")

    async def adeactivate_asset(self, name: str) -> bool:
        """Mark an asset inactive; its state is swept by the next GC. False when unknown."""
        raise self._unsupported("asset registration")

    async def alist_assets(self, *, active_only: bool = False) -> builtins.list[AssetInfo]:
        raise self._unsupported("asset registration")

    async def acommit_event(self, commit: EventCommit) -> builtins.list[AssetEvent]:
        """Commit one trigger event and its state atomically; return the events written.

        An empty list means every asset had already recorded ``commit.dedup_key``. Concurrent
        calls share transactions (group commit); each call is still atomic on its own.
        """
        raise self._unsupported("asset events")

    async def alist_events(
        self, *, asset: str | None = None, since_id: int = 0, limit: int | None = None
    ) -> builtins.list[AssetEvent]:
        """Committed events with ``id > since_id`` in commit order."""
        raise self._unsupported("asset events")

    async def acollect_garbage(
        self,
        *,
        default_retention_days: int = 30,
        batch_size: int = 0,
        dry_run: bool = False,
        now: datetime | None = None,
        event_retention_days: int = 30,
        dedup_retention_days: int = 7,
    ) -> GcReport:
        """Delete expired task state, stale task state, the state of inactive assets and the
        asset events past their retention (the rule is in :mod:`._gc`)."""
        raise self._unsupported("garbage collection")

    async def asave_trigger_status(self, statuses: Sequence[TriggerStatus]) -> None:
        """Upsert the status rows of these triggers (the daemon calls this periodically)."""
        raise self._unsupported("trigger status")

    async def adelete_trigger_status(self, trigger_ids: Sequence[str]) -> None:
        raise self._unsupported("trigger status")

    async def alist_trigger_status(self) -> builtins.list[TriggerStatus]:
        """Every saved trigger status, ordered by trigger_id."""
        raise self._unsupported("trigger status")

    async def asave_daemon_status(self, status: DaemonStatus) -> None:
        """Upsert one daemon's heartbeat row (the daemon calls this every heartbeat)."""
        raise self._unsupported("daemon status")

    async def adelete_daemon_status(self, owners: Sequence[str]) -> None:
        raise self._unsupported("daemon status")

    async def alist_daemon_status(self) -> builtins.list[DaemonStatus]:
        """Every saved daemon status, ordered by owner."""
        raise self._unsupported("daemon status")

    async def aclaim_leases(
        self, owner: str, trigger_ids: Sequence[str], ttl: timedelta | float
    ) -> dict[str, int]:
        """Claim the leases of ``trigger_ids`` for ``owner`` until now + ``ttl`` (seconds or a
        timedelta); return ``{trigger_id: token}`` of those ``owner`` now holds.

        Takes each lease that is free (never claimed, released or expired) and renews those
        ``owner`` already holds. A lease that changes hands gets the previous token + 1 (the
        first claim gets 1); a renewal keeps its token. Leases held by another owner and not
        expired are left alone. See :mod:`._leases` for fencing.
        """
        raise self._unsupported("trigger leases")

    async def arelease_leases(self, owner: str, trigger_ids: Sequence[str]) -> None:
        """Free the leases of ``trigger_ids`` that ``owner`` holds, so another can take them now."""
        raise self._unsupported("trigger leases")

    async def alist_leases(self) -> builtins.list[Lease]:
        """Every lease row (released ones with ``owner=None``), ordered by trigger_id."""
        raise self._unsupported("trigger leases")

    # -- worker-side offload hooks ([workers] state_backend) -------------------------------------
    #
    # A worker-side backend keeps large (or credentialed) values in worker infrastructure and
    # hands back a compact reference string; the state store then stores the reference. The
    # accessors call these hooks (sync ones run in a worker thread from async code), after the
    # key, the retention and the value have been validated and before anything is stored.

    def _no_offload(self, hook: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not implement {hook}(); a backend configured as "
            "[workers] state_backend must override the four *_to_ref/*_from_ref hooks"
        )

    def serialize_task_store_to_ref(self, scope: TaskScope, key: str, value: JSONValue) -> str:
        """Store a task-state ``value`` outside the state store; return its reference."""
        raise self._no_offload("serialize_task_store_to_ref")

    def deserialize_task_store_from_ref(self, scope: TaskScope, key: str, ref: str) -> JSONValue:
        """Return the task-state value that ``ref`` (from the hook above) points to."""
        raise self._no_offload("deserialize_task_store_from_ref")

    def serialize_asset_store_to_ref(self, scope: AssetScope, key: str, value: JSONValue) -> str:
        """Store an asset-state ``value`` outside the state store; return its reference."""
        raise self._no_offload("serialize_asset_store_to_ref")

    def deserialize_asset_store_from_ref(self, scope: AssetScope, key: str, ref: str) -> JSONValue:
        """Return the asset-state value that ``ref`` (from the hook above) points to."""
        raise self._no_offload("deserialize_asset_store_from_ref")
