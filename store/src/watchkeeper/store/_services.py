"""The built-in services: each owns its rules and argument checks once, over a driver.

Each public method checks the store is open, checks its arguments the same way for every
backend, skips the round trip when there is nothing to do, and calls one primitive of the
driver (the ``*Driver`` Protocols of :mod:`watchkeeper.store.protocols`) with arguments that
are already valid. :mod:`._task_service` does the same for tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, overload

import anyio

from ._checks import check_events_query, check_items, check_limit
from ._controls import ApiToken, WatcherControl
from ._daemons import check_daemon_status, check_owners
from ._drivers import (
    ControlsDriver,
    EventFeedDriver,
    EventsDriver,
    GcDriver,
    LeasesDriver,
    StatusDriver,
    WaitForRelease,
)
from ._gc import gc_plan
from ._leases import check_owner, check_trigger_ids, check_ttl
from ._protocols import (
    NodeKeepAlive,
)
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
from ._values import check_bigint, check_key, check_name, value_from_text
from .errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    from ._backend import BaseStateBackend

__all__ = [
    "ControlsService",
    "EncodedState",
    "EventsService",
    "GcService",
    "LeasesService",
    "Service",
    "StatusService",
]

D = TypeVar("D")


class EncodedState(dict[str, str]):
    """A commit's state whose values :func:`~._values.encode_value` produced under the backend's
    ``max_value_bytes`` (and whose keys passed :func:`~._values.check_key`): the store does not check
    them again. The triggerer builds every commit's state this way; a plain mapping is
    checked value by value before any I/O."""

    __slots__ = ()


class Service(Generic[D]):
    """A service of ``store`` over ``driver``'s primitives (often the same object)."""

    __slots__ = ("_driver", "_store")

    def __init__(self, store: BaseStateBackend, driver: D) -> None:
        self._store = store
        self._driver = driver

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._store!r}>"


def check_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(name, value, "a str")
    return value


class EventsService(Service[EventsDriver]):
    """The asset registry and the event log (:class:`~.protocols.EventLog`); ``feed`` has the
    primitives of a live tail (a stream's reads, the worker's wait for new events)."""

    __slots__ = ("_feed",)

    def __init__(
        self, store: BaseStateBackend, driver: EventsDriver, feed: EventFeedDriver
    ) -> None:
        super().__init__(store, driver)
        self._feed = feed

    # -- asset registry ----------------------------------------------------------------------

    async def aregister_assets(self, assets: Sequence[Asset]) -> None:
        """Register ``assets`` (insert or update their URI) and mark them active; a name given
        twice takes its last URI."""
        self._store._check_open()
        batch = check_items("assets", assets, Asset, "Asset objects")
        latest = {asset.name: asset for asset in batch if isinstance(asset, Asset)}
        if latest:
            await self._driver._aregister_assets(list(latest.values()))

    async def adeactivate_asset(self, name: str) -> bool:
        """Mark an asset inactive; its state is swept by the next GC. False when unknown."""
        self._store._check_open()
        return await self._driver._adeactivate_asset(check_name(name, what="asset name"))

    async def alist_assets(self, *, active_only: bool = False) -> list[AssetInfo]:
        """Every registered asset (only the active ones with ``active_only``), by name."""
        self._store._check_open()
        return await self._driver._alist_assets(bool(active_only))

    # -- commits -----------------------------------------------------------------------------

    async def acommit(self, commit: EventCommit) -> list[AssetEvent]:
        """Commit one trigger event and its state atomically; return the events written.

        An empty list means every asset had already recorded ``commit.dedup_key``. Concurrent
        calls share transactions (group commit); each call is still atomic on its own.
        """
        self._store._check_open()
        if not isinstance(commit, EventCommit):
            raise ArgumentTypeError("commit", commit, "an EventCommit")
        self._check_state_texts(commit.state)
        return await self._driver._acommit_event(commit)

    async def acommit_batch(self, batch: EventBatchCommit) -> list[AssetEvent]:
        """Commit a batch of trigger events and its state atomically; return the events written.

        All of the batch or nothing of it; dedup applies to each event, and the state is
        written to each asset where at least one event was (see :class:`EventBatchCommit`).
        Batches share transactions with concurrent commits like single events do.
        """
        self._store._check_open()
        if not isinstance(batch, EventBatchCommit):
            raise ArgumentTypeError("batch", batch, "an EventBatchCommit")
        self._check_state_texts(batch.state)
        return await self._driver._acommit_events(batch)

    def _check_state_texts(self, state: Mapping[str, str]) -> None:
        """A commit's state values (JSON text) by the rules of every state write (its keys
        were checked when it was built), unless they were encoded by those rules already."""
        if type(state) is EncodedState:
            return
        limit = self._store.max_value_bytes
        for key, text in state.items():
            value_from_text(key, text, max_value_bytes=limit)

    # -- reads -------------------------------------------------------------------------------

    @overload
    async def alist_events(
        self,
        *,
        asset: str | None = None,
        since_id: int = 0,
        limit: int | None = None,
        before_id: int | None = None,
        newest_first: bool = False,
        raw: Literal[False] = False,
    ) -> list[AssetEvent]: ...
    @overload
    async def alist_events(
        self,
        *,
        asset: str | None = None,
        since_id: int = 0,
        limit: int | None = None,
        before_id: int | None = None,
        newest_first: bool = False,
        raw: Literal[True],
    ) -> list[tuple[int, str]]: ...
    async def alist_events(
        self,
        *,
        asset: str | None = None,
        since_id: int = 0,
        limit: int | None = None,
        before_id: int | None = None,
        newest_first: bool = False,
        raw: bool = False,
    ) -> list[AssetEvent] | list[tuple[int, str]]:
        """Committed events with ``since_id < id < before_id`` in commit order.

        Args:
            asset: only this asset's events; None for every asset.
            since_id: the events after this id.
            limit: at most this many events (the oldest ones, or the newest with
                ``newest_first``); None for all.
            before_id: the events before this id; None for no upper bound.
            newest_first: the newest events first (a page from the end of the log).
            raw: each event as ``(id, JSON object text)`` (its record, :meth:`AssetEvent.to_json`:
                what a live stream sends) instead of an :class:`AssetEvent`; no payload is
                decoded.

        Raises:
            ArgumentTypeError: an argument of the wrong type.
            InvalidArgumentError: an id or limit out of range.
        """
        self._store._check_open()
        check_events_query(asset, since_id, limit)
        if before_id is not None:
            check_bigint(before_id, what="before_id")
        if not isinstance(newest_first, bool):
            raise ArgumentTypeError("newest_first", newest_first, "a bool")
        if not isinstance(raw, bool):
            raise ArgumentTypeError("raw", raw, "a bool")
        events = await self._driver._alist_events(asset, since_id, limit, before_id, newest_first)
        if raw:
            return [(event.id, event.to_json()) for event in events]
        return events

    async def alast_event_id(self, asset: str | None = None) -> int:
        """The id of the latest committed event (of ``asset``), 0 when there is none."""
        self._store._check_open()
        check_events_query(asset, 0, None)
        return await self._feed._alast_event_id(asset)

    async def acount_events_since(self, since: datetime) -> dict[str, int]:
        """The number of events each watcher committed at or after ``since``.

        Raises:
            ArgumentTypeError: ``since`` is not a timezone-aware datetime.
        """
        self._store._check_open()
        if not isinstance(since, datetime) or since.tzinfo is None:
            raise ArgumentTypeError("since", since, "a timezone-aware datetime")
        return await self._feed._acount_events_since(since)

    async def await_events(self, after_id: int, wait: float) -> int:
        """The newest event id once it is past ``after_id``, or after ``wait`` seconds."""
        self._store._check_open()
        check_limit(after_id, what="after_id", least=0)
        if isinstance(wait, bool) or not isinstance(wait, int | float):
            raise ArgumentTypeError("wait", wait, "a number of seconds")
        if not wait >= 0:
            raise InvalidArgumentError("wait", wait, "must be >= 0 seconds")
        return await self._feed._await_events(after_id, float(wait))


class LeasesService(Service[LeasesDriver]):
    """Node and trigger leases (:class:`~.protocols.LeaseTable`; the rules are in ``_leases``).

    ``wait_for_release`` is the driver's own wait for a release (PostgreSQL listens for a
    NOTIFY, so daemons on other machines are woken); without one the wait is in-process only
    (daemons sharing this store object). ``keepalive`` is the driver's
    :class:`~.protocols.NodeKeepAlive`, when it has one.
    """

    __slots__ = ("_keepalive", "_released", "_wait_for_release")

    def __init__(
        self,
        store: BaseStateBackend,
        driver: LeasesDriver,
        *,
        wait_for_release: WaitForRelease | None = None,
        keepalive: NodeKeepAlive | None = None,
    ) -> None:
        super().__init__(store, driver)
        self._wait_for_release = wait_for_release
        self._keepalive = keepalive
        self._released: anyio.Event | None = None

    @property
    def keepalive(self) -> NodeKeepAlive | None:
        """Renews a node lease from a thread of its own; ``None`` when the store cannot."""
        return self._keepalive

    def _signal(self) -> anyio.Event:
        if self._released is None:
            self._released = anyio.Event()
        return self._released

    async def arenew_node(self, owner: str, ttl: timedelta | float) -> NodeHeartbeat:
        """Renew ``owner``'s node lease until now + ``ttl`` (creating it when missing or reaped),
        reap the other node leases that expired, and list them all. O(1) in the number of
        trigger leases: a daemon calls this every second or so. A node lease created afresh
        wakes the daemons waiting in :meth:`await_lease_release`, so they make room for it."""
        self._store._check_open()
        beat = await self._driver._arenew_node(check_owner(owner), check_ttl(ttl))
        if not beat.renewed:  # a node joined: the others may rebalance now
            self._signal().set()
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
        self._store._check_open()
        owner, ids, span = check_owner(owner), check_trigger_ids(trigger_ids), check_ttl(ttl)
        most = None if limit is None else check_limit(limit, least=0)
        return await self._driver._aclaim_leases(owner, ids, span, most)

    async def arelease_leases(
        self, owner: str, trigger_ids: Sequence[str], *, leave: bool = False
    ) -> None:
        """Free the leases of ``trigger_ids`` that ``owner`` holds, so another can take them now;
        ``leave=True`` (a daemon shutting down) frees every lease it holds and ends its node
        lease. Daemons waiting in :meth:`await_lease_release` are woken."""
        self._store._check_open()
        owner, ids = check_owner(owner), check_trigger_ids(trigger_ids)
        if ids or leave:
            await self._driver._arelease_leases(owner, ids, bool(leave))
            self._signal().set()

    async def abreak_node(self, owner: str) -> bool:
        """Reap ``owner``'s node lease now, expired or not (its process is known to be gone);
        False when there was no live one."""
        self._store._check_open()
        return await self._driver._abreak_node(check_owner(owner))

    async def alist_leases(self) -> list[Lease]:
        """Every lease row (released ones with ``owner=None``), ordered by trigger_id."""
        self._store._check_open()
        return await self._driver._alist_leases()

    async def await_lease_release(self) -> None:
        """Return once a daemon released leases or joined (bound the wait with a cancel scope)."""
        self._store._check_open()
        if self._wait_for_release is not None:
            await self._wait_for_release()
            return
        await self._signal().wait()
        self._released = anyio.Event()


class ControlsService(Service[ControlsDriver]):
    """Watcher controls, API tokens and a compare-and-delete of asset state
    (:class:`~.protocols.OperatorControls`)."""

    __slots__ = ()

    async def aset_watcher_paused(self, watcher: str, paused: bool, *, by: str) -> WatcherControl:
        """Pause or resume ``watcher`` (creating its row); return the row."""
        self._store._check_open()
        name = check_name(watcher, what="watcher name")
        if not isinstance(paused, bool):
            raise ArgumentTypeError("paused", paused, "a bool")
        return await self._driver._aset_watcher_paused(name, paused, check_text("by", by))

    async def arequest_watcher_retry(self, watcher: str, *, by: str) -> WatcherControl:
        """Add one to ``watcher``'s ``retry_seq`` (creating its row); return the row."""
        self._store._check_open()
        name = check_name(watcher, what="watcher name")
        return await self._driver._arequest_watcher_retry(name, check_text("by", by))

    async def alist_watcher_controls(self) -> list[WatcherControl]:
        """Every control row, ordered by watcher name."""
        self._store._check_open()
        return await self._driver._alist_watcher_controls()

    async def adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:
        """Delete ``key`` of ``asset`` only if it is at ``expected_version``, atomically.

        Raises :class:`~watchkeeper.store.errors.VersionConflictError` (``actual`` 0: the key
        does not exist) and writes nothing otherwise; an unknown asset is
        :class:`~watchkeeper.store.errors.AssetNotFoundError`.
        """
        self._store._check_open()
        name = check_name(asset, what="asset name")
        version = check_bigint(expected_version, what="expected_version")
        await self._driver._adelete_if_version(name, check_key(key), version)

    async def acreate_token(self, token: ApiToken) -> None:
        """Store ``token``; a revoked token of the same name is replaced.

        Raises :class:`~watchkeeper.store.errors.TokenExistsError` when a live (not revoked)
        token has that name.
        """
        self._store._check_open()
        if not isinstance(token, ApiToken):
            raise ArgumentTypeError("token", token, "an ApiToken")
        await self._driver._acreate_token(token)

    async def alist_tokens(self) -> list[ApiToken]:
        """Every token row (revoked ones too), ordered by name."""
        self._store._check_open()
        return await self._driver._alist_tokens()

    async def aget_token(self, token_id: str) -> ApiToken | None:
        """The token row whose public id is ``token_id``, or None."""
        self._store._check_open()
        return await self._driver._aget_token(check_text("token_id", token_id))

    async def arevoke_token(self, name: str) -> bool:
        """Mark the token ``name`` revoked; False when there is no live token of that name."""
        self._store._check_open()
        return await self._driver._arevoke_token(check_text("name", name))


class StatusService(Service[StatusDriver]):
    """Trigger status rows and daemon heartbeat rows (:class:`~.protocols.StatusTable`)."""

    __slots__ = ()

    async def asave_trigger_status(self, statuses: Sequence[TriggerStatus]) -> None:
        """Upsert the status rows of these triggers (the daemon calls this periodically)."""
        self._store._check_open()
        batch = check_items("statuses", statuses, TriggerStatus, "TriggerStatus objects")
        if batch:
            kept = [s for s in batch if isinstance(s, TriggerStatus)]
            await self._driver._asave_trigger_status(kept)

    async def adelete_trigger_status(self, trigger_ids: Sequence[str]) -> None:
        """Delete the status rows of ``trigger_ids`` (unknown ids are ignored)."""
        self._store._check_open()
        ids = check_items("trigger_ids", trigger_ids, str, "str trigger ids")
        if ids:
            await self._driver._adelete_trigger_status([i for i in ids if isinstance(i, str)])

    async def alist_trigger_status(self) -> list[TriggerStatus]:
        """Every saved trigger status, ordered by trigger_id."""
        self._store._check_open()
        return await self._driver._alist_trigger_status()

    async def asave_daemon_status(self, status: DaemonStatus) -> None:
        """Upsert one daemon's heartbeat row (the daemon calls this every heartbeat)."""
        self._store._check_open()
        await self._driver._asave_daemon_status(check_daemon_status(status))

    async def adelete_daemon_status(self, owners: Sequence[str]) -> None:
        """Delete the heartbeat rows of ``owners`` (unknown ones are ignored)."""
        self._store._check_open()
        names = check_owners(owners)
        if names:
            await self._driver._adelete_daemon_status(names)

    async def alist_daemon_status(self) -> list[DaemonStatus]:
        """Every saved daemon status, ordered by owner."""
        self._store._check_open()
        return await self._driver._alist_daemon_status()


class GcService(Service[GcDriver]):
    """Garbage collection (:class:`~.protocols.GarbageCollector`; the rules are in ``_gc``)."""

    __slots__ = ()

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
        asset events past their retention."""
        self._store._check_open()
        plan = gc_plan(
            now or self._store.clock(),
            default_retention_days=default_retention_days,
            batch_size=batch_size,
            dry_run=dry_run,
            event_retention_days=event_retention_days,
            dedup_retention_days=dedup_retention_days,
        )
        return await self._driver._acollect_garbage(plan)
