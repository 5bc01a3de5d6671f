"""The Protocols of a store's services and ``Services``: defined here, published by
:mod:`watchkeeper.store.protocols` (which also holds the base class and the built-in services:
this module imports neither, so ``_backend`` can use it). The drivers' primitives are
:mod:`._drivers`'."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Protocol, overload

from ._controls import ApiToken, WatcherControl
from ._logs import DEFAULT_LOG_MAX_BYTES, LogChunk
from ._tasks import (
    OutletEvent,
    RunOutcome,
    RunStep,
    StateWrite,
    TaskInfo,
    TaskRun,
    TaskSpec,
    TryCause,
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
    Writer,
)

__all__ = [
    "SERVICE_NAMES",
    "EventLog",
    "GarbageCollector",
    "LeaseTable",
    "NodeKeepAlive",
    "NodeKeepAliveChannel",
    "OperatorControls",
    "RunLogs",
    "Services",
    "StatusTable",
    "TaskQueue",
]


# -- the services, as their callers see them ----------------------------------------------------


class EventLog(Protocol):
    """The asset registry and the event log: commits (with their state, atomically, deduplicated
    per asset) and the log's reads."""

    async def aregister_assets(self, assets: Sequence[Asset]) -> None: ...
    async def adeactivate_asset(self, name: str) -> bool: ...
    async def alist_assets(self, *, active_only: bool = False) -> list[AssetInfo]: ...
    async def acommit(self, commit: EventCommit) -> list[AssetEvent]:
        """Commit one trigger event and its state atomically; the events written (none when
        every asset had recorded ``commit.dedup_key``)."""
        ...

    async def acommit_batch(self, batch: EventBatchCommit) -> list[AssetEvent]:
        """Commit a batch of trigger events and its state atomically (all or nothing)."""
        ...

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
        """Committed events with ``since_id < id < before_id`` in commit order (newest first
        with ``newest_first``), as :class:`AssetEvent` objects, or with ``raw`` as
        ``(id, JSON object text)`` (``id``, ``asset``, ``watcher``, ``payload``,
        ``dedup_key``, ``created_at``: what a live stream sends, no payload decoded)."""
        ...

    async def alast_event_id(self, asset: str | None = None) -> int:
        """The id of the latest committed event (of ``asset``), 0 when there is none."""
        ...

    async def acount_events_since(self, since: datetime) -> dict[str, int]:
        """How many events each watcher committed at or after ``since`` (one per asset)."""
        ...

    async def await_events(self, after_id: int, wait: float) -> int:
        """The newest event id once it is past ``after_id``, or after ``wait`` seconds."""
        ...


class TaskQueue(Protocol):
    """Event consumers with durable cursors, task cursors, runs and run leases: what
    ``watchkeeper worker`` and a consumer in a user's own process need of a store."""

    async def aconsumer_position(self, name: str) -> int: ...
    async def aconsumer_fetch(
        self, name: str, *, assets: Sequence[str] | None = None, limit: int = 100
    ) -> list[AssetEvent]: ...
    async def aconsumer_ack(
        self,
        name: str,
        event_id: int,
        *,
        state: Sequence[StateWrite] = (),
        expected: int | None = None,
        writer: Writer | None = None,
    ) -> int: ...
    async def async_tasks(self, specs: Sequence[TaskSpec]) -> None: ...
    async def aretire_tasks(self, keep: Sequence[str]) -> list[str]: ...
    async def adelete_task(self, name: str) -> None: ...
    async def alist_tasks(self) -> list[TaskInfo]: ...
    async def aset_task_paused(self, name: str, paused: bool) -> None: ...
    async def arewind_task(
        self, name: str, asset: str, to_event_id: int, *, writer: Writer | None = None
    ) -> None: ...
    async def acreate_run(self, name: str) -> TaskRun | None: ...
    async def acreate_runs(self, name: str, max_runs: int) -> list[TaskRun]: ...
    async def aclaim_runs(
        self, owner: str, *, limit: int, ttl: timedelta | float, tasks: Sequence[str] | None = None
    ) -> list[TaskRun]: ...
    async def astep_runs(
        self,
        owner: str,
        *,
        finish: RunOutcome | None = None,
        claim: int = 0,
        ttl: timedelta | float,
        tasks: Sequence[str] | None = None,
        create: int = 0,
        peers: int = 0,
    ) -> RunStep: ...
    async def aheartbeat_runs(
        self, owner: str, runs: Mapping[int, int], ttl: timedelta | float
    ) -> set[int]: ...
    async def abreak_run_leases(self, owners: Sequence[str]) -> int: ...
    async def afinish_run(
        self,
        run_id: int,
        owner: str,
        token: int,
        *,
        success: bool,
        outlets: Sequence[OutletEvent] = (),
        error: str | None = None,
        traceback: str | None = None,
        retry_delay: timedelta = timedelta(0),
        cause: TryCause = "task_error",
    ) -> TaskRun: ...
    async def aget_run(self, run_id: int) -> TaskRun: ...
    async def alist_runs(
        self,
        *,
        task: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        before: int | None = None,
        event_ids: bool = False,
    ) -> list[TaskRun]: ...
    async def aretry_run(self, run_id: int) -> TaskRun: ...
    async def acount_runs(self) -> dict[tuple[str, str], int]: ...
    async def acount_tries(self) -> dict[tuple[str, str, bool], int]: ...
    async def aoldest_pending(self) -> dict[tuple[str, str], datetime]: ...
    async def arun_durations(
        self, bounds: Sequence[float]
    ) -> dict[str, tuple[list[int], float]]: ...


class NodeKeepAliveChannel(Protocol):
    """A connection of its own that extends one daemon's node lease; blocking, and used by
    one thread only (never an event loop's): see :class:`NodeKeepAlive`."""

    def renew(self, timeout: float) -> bool:
        """Extend the node lease to now + ttl if it is still alive; False when it is not
        (reaped, left, or never joined: only :meth:`LeaseTable.arenew_node` joins). Raises a
        :class:`~watchkeeper.store.errors.StateStoreError` when the store did not answer
        within ``timeout`` seconds or failed."""
        ...

    def close(self) -> None:
        """Close the connection (from the thread that used it); never raises."""
        ...


class NodeKeepAlive(Protocol):
    """Extends a node lease from a thread of the daemon's own, with a connection of its own,
    so that an event loop busy for seconds cannot make the renewal late. Only ever extends a
    live node lease: joining, reaping and claiming stay with :class:`LeaseTable`."""

    def open_node_keepalive(self, owner: str, ttl: timedelta | float) -> NodeKeepAliveChannel:
        """A channel extending ``owner``'s node lease by ``ttl`` per renewal (connects on its
        first renewal, in the thread that uses it)."""
        ...


class LeaseTable(Protocol):
    """Node leases and trigger leases with fencing tokens: which daemon runs which trigger
    (the rules are in :mod:`watchkeeper.store._leases`). ``keepalive`` renews a node lease
    from a thread of its own, when the store can (``None`` otherwise)."""

    @property
    def keepalive(self) -> NodeKeepAlive | None: ...
    async def arenew_node(self, owner: str, ttl: timedelta | float) -> NodeHeartbeat: ...
    async def aclaim_leases(
        self,
        owner: str,
        trigger_ids: Sequence[str],
        ttl: timedelta | float,
        *,
        limit: int | None = None,
    ) -> dict[str, int]: ...
    async def arelease_leases(
        self, owner: str, trigger_ids: Sequence[str], *, leave: bool = False
    ) -> None: ...
    async def abreak_node(self, owner: str) -> bool: ...
    async def alist_leases(self) -> list[Lease]: ...
    async def await_lease_release(self) -> None: ...


class OperatorControls(Protocol):
    """Watcher controls (pause, resume, retry), API tokens, and an atomic compare-and-delete of
    asset state: what the operator API needs of a store."""

    async def aset_watcher_paused(
        self, watcher: str, paused: bool, *, by: str
    ) -> WatcherControl: ...
    async def arequest_watcher_retry(self, watcher: str, *, by: str) -> WatcherControl: ...
    async def alist_watcher_controls(self) -> list[WatcherControl]: ...
    async def adelete_if_version(self, asset: str, key: str, expected_version: int) -> None: ...
    async def acreate_token(self, token: ApiToken) -> None: ...
    async def alist_tokens(self) -> list[ApiToken]: ...
    async def aget_token(self, token_id: str) -> ApiToken | None: ...
    async def arevoke_token(self, name: str) -> bool: ...


class StatusTable(Protocol):
    """One status row per trigger and one heartbeat row per daemon (``watchkeeper status``)."""

    async def asave_trigger_status(self, statuses: Sequence[TriggerStatus]) -> None: ...
    async def adelete_trigger_status(self, trigger_ids: Sequence[str]) -> None: ...
    async def alist_trigger_status(self) -> list[TriggerStatus]: ...
    async def asave_daemon_status(self, status: DaemonStatus) -> None: ...
    async def adelete_daemon_status(self, owners: Sequence[str]) -> None: ...
    async def alist_daemon_status(self) -> list[DaemonStatus]: ...


class GarbageCollector(Protocol):
    """Deletes expired and stale state and the events past their retention."""

    async def acollect_garbage(
        self,
        *,
        default_retention_days: int = 30,
        batch_size: int = 0,
        dry_run: bool = False,
        now: datetime | None = None,
        event_retention_days: int = 30,
        dedup_retention_days: int = 7,
    ) -> GcReport: ...


class RunLogs(Protocol):
    """Each try's stdout, stderr and log records, kept with its run (rules: ``_logs``)."""

    async def aappend(
        self,
        run_id: int,
        try_number: int,
        chunks: Sequence[tuple[str, str]],
        *,
        max_bytes: int = DEFAULT_LOG_MAX_BYTES,
    ) -> None: ...
    async def alist(
        self,
        run_id: int,
        *,
        try_number: int | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[LogChunk]: ...


SERVICE_NAMES = ("events", "tasks", "leases", "controls", "status", "gc", "logs")
"""The services a store may offer, by attribute name."""


@dataclass(frozen=True, slots=True)
class Services:
    """The services a store offers; ``None`` for one it lacks. A backend sets it in its
    ``__init__`` (``dataclasses.replace`` drops or swaps one)."""

    events: EventLog | None = None
    tasks: TaskQueue | None = None
    leases: LeaseTable | None = None
    controls: OperatorControls | None = None
    status: StatusTable | None = None
    gc: GarbageCollector | None = None
    logs: RunLogs | None = None
