"""``MetastoreBackend``: the metastore's rules written once, over the hooks a backend implements.

The built-in backends (memory, SQLite, PostgreSQL) subclass it. Each public method checks the
store is open, checks its arguments the same way for every backend, skips the round trip when
there is nothing to do, and calls one ``_a<name>`` hook with arguments that are already valid.
A backend with only part of the metastore subclasses :class:`BaseStateBackend` and implements
the capabilities it has (see :mod:`watchkeeper.store.backend`).
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import anyio

from ._backend import BaseStateBackend
from ._daemons import check_daemon_status, check_owners
from ._gc import GcPlan, gc_plan
from ._leases import check_limit, check_owner, check_trigger_ids, check_ttl
from ._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    DaemonStatus,
    EventBatchCommit,
    EventCommit,
    GcReport,
    Lease,
    NodeHeartbeat,
    TriggerStatus,
)
from ._values import check_bigint, check_events_query, check_name, value_from_text
from .errors import ArgumentTypeError

__all__ = ["EncodedState", "MetastoreBackend", "check_items"]


class EncodedState(dict[str, str]):
    """A commit's state whose values :func:`~._values.encode_value` produced under the
    backend's ``max_value_bytes`` (and whose keys passed :func:`~._values.check_key`): the
    backend does not check them again. The triggerer builds every commit's state this way;
    a plain mapping is checked value by value before any I/O."""

    __slots__ = ()


def check_items(name: str, items: object, kind: type, expected: str) -> list[object]:
    """``items`` as a list, each an instance of ``kind``; :class:`ArgumentTypeError` if not."""
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise ArgumentTypeError(name, items, f"a sequence of {expected}")
    batch = list(items)
    for item in batch:
        if not isinstance(item, kind):
            raise ArgumentTypeError(name, item, f"a sequence of {expected}")
    return batch


class MetastoreBackend(BaseStateBackend, ABC):
    """A backend with the whole metastore: asset registry, event log, garbage collection,
    trigger and daemon status, trigger leases (it satisfies every capability Protocol)."""

    # -- asset registry ----------------------------------------------------------------------

    async def aregister_assets(self, assets: Sequence[Asset]) -> None:
        """Register ``assets`` (insert or update their URI) and mark them active; a name given
        twice takes its last URI."""
        self._check_open()
        batch = check_items("assets", assets, Asset, "Asset objects")
        latest = {asset.name: asset for asset in batch if isinstance(asset, Asset)}
        if latest:
            await self._aregister_assets(list(latest.values()))

    async def adeactivate_asset(self, name: str) -> bool:
        """Mark an asset inactive; its state is swept by the next GC. False when unknown."""
        self._check_open()
        return await self._adeactivate_asset(check_name(name, what="asset name"))

    async def alist_assets(self, *, active_only: bool = False) -> builtins.list[AssetInfo]:
        """Every registered asset (only the active ones with ``active_only``), by name."""
        self._check_open()
        return await self._alist_assets(bool(active_only))

    # -- event log ---------------------------------------------------------------------------

    async def acommit_event(self, commit: EventCommit) -> builtins.list[AssetEvent]:
        """Commit one trigger event and its state atomically; return the events written.

        An empty list means every asset had already recorded ``commit.dedup_key``. Concurrent
        calls share transactions (group commit); each call is still atomic on its own.
        """
        self._check_open()
        if not isinstance(commit, EventCommit):
            raise ArgumentTypeError("commit", commit, "an EventCommit")
        self._check_state_texts(commit.state)
        return await self._acommit_event(commit)

    async def acommit_events(self, batch: EventBatchCommit) -> builtins.list[AssetEvent]:
        """Commit a batch of trigger events and its state atomically; return the events written.

        All of the batch or nothing of it; dedup applies to each event, and the state is
        written to each asset where at least one event was (see :class:`EventBatchCommit`).
        Batches share transactions with concurrent commits like single events do.
        """
        self._check_open()
        if not isinstance(batch, EventBatchCommit):
            raise ArgumentTypeError("batch", batch, "an EventBatchCommit")
        self._check_state_texts(batch.state)
        return await self._acommit_events(batch)

    def _check_state_texts(self, state: Mapping[str, str]) -> None:
        """A commit's state values (JSON text) by the rules of every state write (its keys
        were checked when it was built), unless they were encoded by those rules already."""
        if type(state) is EncodedState:
            return
        limit = self.max_value_bytes
        for key, text in state.items():
            value_from_text(key, text, max_value_bytes=limit)

    async def alist_events(
        self,
        *,
        asset: str | None = None,
        since_id: int = 0,
        limit: int | None = None,
        before_id: int | None = None,
        newest_first: bool = False,
    ) -> builtins.list[AssetEvent]:
        """Committed events with ``since_id < id < before_id`` in commit order.

        Args:
            asset: only this asset's events; None for every asset.
            since_id: the events after this id.
            limit: at most this many events (the oldest ones, or the newest with
                ``newest_first``); None for all.
            before_id: the events before this id; None for no upper bound.
            newest_first: the newest events first (a page from the end of the log).

        Raises:
            ArgumentTypeError: an argument of the wrong type.
            InvalidArgumentError: an id or limit out of range.
        """
        self._check_open()
        check_events_query(asset, since_id, limit)
        if before_id is not None:
            check_bigint(before_id, what="before_id")
        if not isinstance(newest_first, bool):
            raise ArgumentTypeError("newest_first", newest_first, "a bool")
        return await self._alist_events(asset, since_id, limit, before_id, newest_first)

    # -- garbage collection ------------------------------------------------------------------

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
        asset events past their retention (the rules are in :mod:`._gc`)."""
        self._check_open()
        plan = gc_plan(
            now or self.clock(),
            default_retention_days=default_retention_days,
            batch_size=batch_size,
            dry_run=dry_run,
            event_retention_days=event_retention_days,
            dedup_retention_days=dedup_retention_days,
        )
        return await self._acollect_garbage(plan)

    # -- trigger status ----------------------------------------------------------------------

    async def asave_trigger_status(self, statuses: Sequence[TriggerStatus]) -> None:
        """Upsert the status rows of these triggers (the daemon calls this periodically)."""
        self._check_open()
        batch = check_items("statuses", statuses, TriggerStatus, "TriggerStatus objects")
        if batch:
            await self._asave_trigger_status([s for s in batch if isinstance(s, TriggerStatus)])

    async def adelete_trigger_status(self, trigger_ids: Sequence[str]) -> None:
        """Delete the status rows of ``trigger_ids`` (unknown ids are ignored)."""
        self._check_open()
        ids = check_items("trigger_ids", trigger_ids, str, "str trigger ids")
        if ids:
            await self._adelete_trigger_status([i for i in ids if isinstance(i, str)])

    async def alist_trigger_status(self) -> builtins.list[TriggerStatus]:
        """Every saved trigger status, ordered by trigger_id."""
        self._check_open()
        return await self._alist_trigger_status()

    # -- daemon status -----------------------------------------------------------------------

    async def asave_daemon_status(self, status: DaemonStatus) -> None:
        """Upsert one daemon's heartbeat row (the daemon calls this every heartbeat)."""
        self._check_open()
        await self._asave_daemon_status(check_daemon_status(status))

    async def adelete_daemon_status(self, owners: Sequence[str]) -> None:
        """Delete the heartbeat rows of ``owners`` (unknown ones are ignored)."""
        self._check_open()
        names = check_owners(owners)
        if names:
            await self._adelete_daemon_status(names)

    async def alist_daemon_status(self) -> builtins.list[DaemonStatus]:
        """Every saved daemon status, ordered by owner."""
        self._check_open()
        return await self._alist_daemon_status()

    # -- node and trigger leases (the rules are in ._leases) ------------------------------------

    async def arenew_node(self, owner: str, ttl: timedelta | float) -> NodeHeartbeat:
        """Renew ``owner``'s node lease until now + ``ttl`` (creating it when missing or reaped),
        reap the other node leases that expired, and list them all. O(1) in the number of
        trigger leases: a daemon calls this every second or so. A node lease created afresh
        wakes the daemons waiting in :meth:`await_lease_release`, so they make room for it."""
        self._check_open()
        beat = await self._arenew_node(check_owner(owner), check_ttl(ttl))
        if not beat.renewed:  # a node joined: the others may rebalance now
            self._lease_signal().set()
        return beat

    async def aclaim_leases(
        self,
        owner: str,
        trigger_ids: Sequence[str],
        ttl: timedelta | float,
        *,
        limit: int | None = None,
    ) -> dict[str, int]:
        """Renew ``owner``'s node lease for ``ttl`` (as :meth:`arenew_node`), take up to
        ``limit`` free leases among ``trigger_ids``, and return ``{trigger_id: token}`` of
        those of ``trigger_ids`` that ``owner`` now holds.

        A free lease (never claimed, released, or held by a node lease that was reaped) is
        taken with the previous token + 1 (the first claim gets 1); a lease ``owner`` holds
        keeps its token. Leases held by another live node are left alone, and so are those a
        fenced write is committing under at this moment (the next claim takes them).
        Daemons claiming at once take free leases in different orders.
        """
        self._check_open()
        owner, ids, span = check_owner(owner), check_trigger_ids(trigger_ids), check_ttl(ttl)
        return await self._aclaim_leases(owner, ids, span, check_limit(limit))

    async def arelease_leases(
        self, owner: str, trigger_ids: Sequence[str], *, leave: bool = False
    ) -> None:
        """Free the leases of ``trigger_ids`` that ``owner`` holds, so another can take them now;
        ``leave=True`` (a daemon shutting down) frees every lease it holds and ends its node
        lease. Daemons waiting in :meth:`await_lease_release` are woken."""
        self._check_open()
        owner, ids = check_owner(owner), check_trigger_ids(trigger_ids)
        if ids or leave:
            await self._arelease_leases(owner, ids, bool(leave))
            self._lease_signal().set()

    async def abreak_node(self, owner: str) -> bool:
        """Reap ``owner``'s node lease now, expired or not (its process is known to be gone);
        False when there was no live one."""
        self._check_open()
        return await self._abreak_node(check_owner(owner))

    async def alist_leases(self) -> builtins.list[Lease]:
        """Every lease row (released ones with ``owner=None``), ordered by trigger_id."""
        self._check_open()
        return await self._alist_leases()

    async def await_lease_release(self) -> None:
        """Return once a daemon released leases or joined (bound the wait with a cancel scope).

        In-process only here (daemons sharing this backend object); PostgreSQL overrides it
        with LISTEN/NOTIFY so that daemons on other machines are woken too.
        """
        self._check_open()
        await self._lease_signal().wait()
        self.__dict__["_lease_event"] = anyio.Event()

    def _lease_signal(self) -> anyio.Event:
        event: anyio.Event | None = self.__dict__.get("_lease_event")
        if event is None:
            event = self.__dict__["_lease_event"] = anyio.Event()
        return event

    # -- hooks: called with checked arguments, on an open store --------------------------------

    @abstractmethod
    async def _aregister_assets(self, assets: builtins.list[Asset]) -> None:
        """Upsert these assets (distinct names, at least one) as active."""

    @abstractmethod
    async def _adeactivate_asset(self, name: str) -> bool: ...

    @abstractmethod
    async def _alist_assets(self, active_only: bool) -> builtins.list[AssetInfo]: ...

    @abstractmethod
    async def _acommit_event(self, commit: EventCommit) -> builtins.list[AssetEvent]: ...

    @abstractmethod
    async def _acommit_events(self, batch: EventBatchCommit) -> builtins.list[AssetEvent]: ...

    @abstractmethod
    async def _alist_events(
        self,
        asset: str | None,
        since_id: int,
        limit: int | None,
        before_id: int | None,
        newest_first: bool,
    ) -> builtins.list[AssetEvent]: ...

    @abstractmethod
    async def _acollect_garbage(self, plan: GcPlan) -> GcReport: ...

    @abstractmethod
    async def _asave_trigger_status(self, statuses: builtins.list[TriggerStatus]) -> None:
        """Upsert these statuses (at least one)."""

    @abstractmethod
    async def _adelete_trigger_status(self, trigger_ids: builtins.list[str]) -> None:
        """Delete these statuses (at least one id)."""

    @abstractmethod
    async def _alist_trigger_status(self) -> builtins.list[TriggerStatus]: ...

    @abstractmethod
    async def _asave_daemon_status(self, status: DaemonStatus) -> None: ...

    @abstractmethod
    async def _adelete_daemon_status(self, owners: builtins.list[str]) -> None:
        """Delete these rows (distinct sorted owners, at least one)."""

    @abstractmethod
    async def _alist_daemon_status(self) -> builtins.list[DaemonStatus]: ...

    @abstractmethod
    async def _arenew_node(self, owner: str, ttl: timedelta) -> NodeHeartbeat: ...

    @abstractmethod
    async def _aclaim_leases(
        self, owner: str, trigger_ids: builtins.list[str], ttl: timedelta, limit: int | None
    ) -> dict[str, int]:
        """Renew the node, then claim (distinct sorted ids, maybe none)."""

    @abstractmethod
    async def _arelease_leases(
        self, owner: str, trigger_ids: builtins.list[str], leave: bool
    ) -> None: ...

    @abstractmethod
    async def _abreak_node(self, owner: str) -> bool: ...

    @abstractmethod
    async def _alist_leases(self) -> builtins.list[Lease]: ...
