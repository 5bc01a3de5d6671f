"""The primitives a driver implements for the built-in services (the services' own Protocols
are :mod:`._protocols`'); published by :mod:`watchkeeper.store.protocols`. Each is called with
checked arguments on an open store; "at least one" means the service skipped the call when
there was nothing to do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol

from ._controls import ApiToken, WatcherControl
from ._gc import GcPlan
from ._tasks import RunOutcome, RunStep, StateWrite, TaskInfo, TaskRun, TaskSpec
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
    "ControlsDriver",
    "EventFeedDriver",
    "EventsDriver",
    "GcDriver",
    "LeasesDriver",
    "RunsDriver",
    "StatusDriver",
    "TaskSpecsDriver",
    "WaitForRelease",
]


class EventsDriver(Protocol):
    """The primitives of :class:`~watchkeeper.store.protocols.EventsService`."""

    async def _aregister_assets(self, assets: list[Asset]) -> None:
        """Upsert these assets (distinct names, at least one) as active."""

    async def _adeactivate_asset(self, name: str) -> bool: ...
    async def _alist_assets(self, active_only: bool) -> list[AssetInfo]: ...
    async def _acommit_event(self, commit: EventCommit) -> list[AssetEvent]: ...
    async def _acommit_events(self, batch: EventBatchCommit) -> list[AssetEvent]: ...
    async def _alist_events(
        self,
        asset: str | None,
        since_id: int,
        limit: int | None,
        before_id: int | None,
        newest_first: bool,
    ) -> list[AssetEvent]:
        """The events, each built with :meth:`AssetEvent.from_json` from its stored text."""


class EventFeedDriver(Protocol):
    """The primitives of a live tail of the event log (the rest of
    :class:`~watchkeeper.store.protocols.EventsService`'s): reads a stream and the worker poll."""

    async def _alast_event_id(self, asset: str | None) -> int: ...
    async def _acount_events_since(self, since: datetime) -> dict[str, int]: ...
    async def _await_events(self, after_id: int, wait: float) -> int: ...


class TaskSpecsDriver(Protocol):
    """The primitives of :class:`~watchkeeper.store.protocols.TasksService` that keep
    consumers and tasks: their positions, specs and cursors, and what is pending."""

    async def _aconsumer_position(self, name: str) -> int: ...
    async def _aconsumer_fetch(
        self, name: str, assets: list[str] | None, limit: int
    ) -> list[AssetEvent]:
        """``assets``: ``None`` (every asset) or at least one name."""

    async def _aconsumer_ack(
        self,
        name: str,
        event_id: int,
        state: list[StateWrite],
        expected: int | None,
        writer: Writer | None,
    ) -> int: ...
    async def _async_tasks(self, specs: list[TaskSpec]) -> None:
        """Upsert these specs (at least one), each declared again (no longer removed)."""

    async def _aretire_tasks(self, keep: list[str]) -> list[str]:
        """Mark removed now every task not in ``keep`` and not removed already; their names."""

    async def _adelete_task(self, name: str) -> None:
        """Forget task ``name``: its spec and cursors (its runs stay). :class:`TaskNotFoundError`
        if unknown; :class:`RunStateError` while a run of it is running."""

    async def _alist_tasks(self) -> list[TaskInfo]: ...
    async def _aset_task_paused(self, name: str, paused: bool) -> None: ...
    async def _arewind_task(
        self, name: str, asset: str, to_event_id: int, writer: Writer | None
    ) -> None: ...
    async def _acount_runs(self) -> dict[tuple[str, str], int]: ...
    async def _aoldest_pending(self) -> dict[tuple[str, str], datetime]: ...


class RunsDriver(Protocol):
    """The primitives of :class:`~watchkeeper.store.protocols.TasksService` that make, claim,
    step and list runs (a worker's hot path)."""

    async def _acreate_runs(self, name: str, max_runs: int) -> list[TaskRun]: ...
    async def _astep_runs(
        self,
        owner: str,
        finish: RunOutcome | None,
        claim: int,
        ttl: timedelta,
        tasks: list[str] | None,
        create: int,
        peers: int,
    ) -> RunStep:
        """``finish`` and/or ``claim`` (>= 1); ``tasks``: ``None`` (every task) or at least
        one name. Raises what ``afinish_run`` raises (the whole step is then undone)."""

    async def _aheartbeat_runs(self, owner: str, runs: dict[int, int], ttl: timedelta) -> set[int]:
        """Renew these leases (at least one)."""

    async def _abreak_run_leases(self, owners: list[str]) -> int:
        """Expire the leases of these owners (distinct, sorted, at least one)."""

    async def _aget_run(self, run_id: int) -> TaskRun: ...
    async def _alist_runs(
        self, task: str | None, state: str | None, limit: int | None, before: int | None
    ) -> list[TaskRun]: ...
    async def _arun_event_ids(self, run_ids: list[int]) -> dict[int, list[int]]:
        """The event ids of these runs (at least one), each run's in order."""

    async def _aretry_run(self, run_id: int) -> TaskRun: ...
    async def _acount_tries(self) -> dict[tuple[str, str, bool], int]: ...
    async def _arun_durations(
        self, bounds: tuple[float, ...]
    ) -> dict[str, tuple[list[int], float]]: ...


class LeasesDriver(Protocol):
    """The primitives of :class:`~watchkeeper.store.protocols.LeasesService`."""

    async def _arenew_node(self, owner: str, ttl: timedelta) -> NodeHeartbeat: ...
    async def _aclaim_leases(
        self, owner: str, trigger_ids: list[str], ttl: timedelta, limit: int | None
    ) -> dict[str, int]:
        """Renew the node, then claim (distinct sorted ids, maybe none)."""

    async def _arelease_leases(self, owner: str, trigger_ids: list[str], leave: bool) -> None: ...
    async def _abreak_node(self, owner: str) -> bool: ...
    async def _alist_leases(self) -> list[Lease]: ...


WaitForRelease = Callable[[], Awaitable[None]]
"""A driver's own wait for a lease release (PostgreSQL: LISTEN/NOTIFY, across machines)."""


class ControlsDriver(Protocol):
    """The primitives of :class:`~watchkeeper.store.protocols.ControlsService`."""

    async def _aset_watcher_paused(self, watcher: str, paused: bool, by: str) -> WatcherControl: ...
    async def _arequest_watcher_retry(self, watcher: str, by: str) -> WatcherControl: ...
    async def _alist_watcher_controls(self) -> list[WatcherControl]: ...
    async def _adelete_if_version(self, asset: str, key: str, expected_version: int) -> None: ...
    async def _acreate_token(self, token: ApiToken) -> None: ...
    async def _alist_tokens(self) -> list[ApiToken]: ...
    async def _aget_token(self, token_id: str) -> ApiToken | None: ...
    async def _arevoke_token(self, name: str) -> bool: ...


class StatusDriver(Protocol):
    """The primitives of :class:`~watchkeeper.store.protocols.StatusService`."""

    async def _asave_trigger_status(self, statuses: list[TriggerStatus]) -> None:
        """Upsert these statuses (at least one)."""

    async def _adelete_trigger_status(self, trigger_ids: list[str]) -> None:
        """Delete these statuses (at least one id)."""

    async def _alist_trigger_status(self) -> list[TriggerStatus]: ...
    async def _asave_daemon_status(self, status: DaemonStatus) -> None: ...
    async def _adelete_daemon_status(self, owners: list[str]) -> None:
        """Delete these rows (distinct sorted owners, at least one)."""

    async def _alist_daemon_status(self) -> list[DaemonStatus]: ...


class GcDriver(Protocol):
    """The primitive of :class:`~watchkeeper.store.protocols.GcService`."""

    async def _acollect_garbage(self, plan: GcPlan) -> GcReport: ...
