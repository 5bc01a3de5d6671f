"""What a backend author implements and the runtime calls: the base classes, the capabilities,
the records and the value rules.

A backend subclasses :class:`BaseStateBackend` (key/value state, the sync/async bridge, input
checks) and implements the hooks it documents. The metastore comes in capabilities, each a
``runtime_checkable`` Protocol: :class:`AssetRegistry`, :class:`EventLog`,
:class:`GarbageCollector`, :class:`StatusTable`, :class:`DaemonTable`, :class:`LeaseTable`,
:class:`OperatorControls` (watcher controls and API tokens, for the HTTP API),
:class:`EventConsumers` and :class:`TaskQueue` (tasks on asset events). A backend has a
capability when it has the methods; the runtime checks once, with ``isinstance``, and does
without what is missing (no leases: a single unfenced daemon; no status table: no status rows).
:class:`MetastoreBackend` has them all, its rules written once over ``_a<name>`` hooks: the
built-in backends subclass it, and so can a new one; :class:`ControlsBackend` does the same
for :class:`OperatorControls`, and :class:`TaskStoreBackend` for :class:`EventConsumers` and
:class:`TaskQueue`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from weakref import WeakSet

from ._backend import BaseStateBackend
from ._controls import ApiToken, ControlsBackend, OperatorControls, WatcherControl
from ._gc import EventCutoffs, GcPlan
from ._lazy import lazy_exports
from ._lifecycle import SYNC_CALL_WITHOUT_PORTAL
from ._metastore import EncodedState, MetastoreBackend
from ._payloads import encode_payload, encode_payload_decoded
from ._redact import redact_data, redact_dsn, redact_secrets
from ._tasks import (
    MAX_LOST_TRIES,
    RUN_STATES,
    TRY_CAUSES,
    EventConsumers,
    OutletEvent,
    RunError,
    RunOutcome,
    RunStep,
    StateWrite,
    TaskInfo,
    TaskQueue,
    TaskRun,
    TaskSpec,
    require_event_consumers,
    require_task_queue,
)
from ._taskstore import TaskStoreBackend
from ._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    DaemonStatus,
    EventBatchCommit,
    EventCommit,
    Fence,
    GcReport,
    Lease,
    NodeHeartbeat,
    NodeLease,
    Put,
    RawEntry,
    RefusedDefinition,
    TriggerStatus,
    Writer,
)
from ._values import (
    check_key,
    check_name,
    decode_value,
    encode_json,
    encode_value,
)
from .errors import MissingCapabilityError

if TYPE_CHECKING:
    from ._log import get_logger
    from ._threads import LoopThreads

__all__ = [
    "CAPABILITIES",
    "MAX_LOST_TRIES",
    "RUN_STATES",
    "SYNC_CALL_WITHOUT_PORTAL",
    "TRY_CAUSES",
    "ApiToken",
    "AssetRegistry",
    "BaseStateBackend",
    "ControlsBackend",
    "DaemonStatus",
    "DaemonTable",
    "EncodedState",
    "EventBatchCommit",
    "EventCommit",
    "EventConsumers",
    "EventCutoffs",
    "EventLog",
    "Fence",
    "GarbageCollector",
    "GcPlan",
    "GcReport",
    "Lease",
    "LeaseTable",
    "LoopThreads",
    "MetastoreBackend",
    "NodeHeartbeat",
    "NodeKeepAlive",
    "NodeKeepAliveChannel",
    "NodeLease",
    "OperatorControls",
    "OutletEvent",
    "Put",
    "RawEntry",
    "RefusedDefinition",
    "RunError",
    "RunOutcome",
    "RunStep",
    "StateWrite",
    "StatusTable",
    "TaskInfo",
    "TaskQueue",
    "TaskRun",
    "TaskSpec",
    "TaskStoreBackend",
    "TriggerStatus",
    "WatcherControl",
    "Writer",
    "capability_methods",
    "check_key",
    "check_name",
    "decode_value",
    "encode_json",
    "encode_payload",
    "encode_payload_decoded",
    "encode_value",
    "get_logger",
    "redact_data",
    "redact_dsn",
    "redact_secrets",
    "require_asset_registry",
    "require_event_consumers",
    "require_event_log",
    "require_garbage_collector",
    "require_operator_controls",
    "require_status_table",
    "require_task_queue",
]

if not TYPE_CHECKING:  # structlog loads with the first logger, not with the records
    __getattr__, __dir__ = lazy_exports(
        __name__, {"._log": ("get_logger",), "._threads": ("LoopThreads",)}
    )


@runtime_checkable
class AssetRegistry(Protocol):
    """Registers assets, marks them inactive, lists them (the daemon registers its assets)."""

    async def aregister_assets(self, assets: Sequence[Asset]) -> None: ...

    async def adeactivate_asset(self, name: str) -> bool: ...

    async def alist_assets(self, *, active_only: bool = False) -> list[AssetInfo]: ...


@runtime_checkable
class EventLog(Protocol):
    """Commits a trigger's event with its state atomically, and lists committed events."""

    async def acommit_event(self, commit: EventCommit) -> list[AssetEvent]: ...

    async def acommit_events(self, batch: EventBatchCommit) -> list[AssetEvent]: ...

    async def alist_events(
        self,
        *,
        asset: str | None = None,
        since_id: int = 0,
        limit: int | None = None,
        before_id: int | None = None,
        newest_first: bool = False,
    ) -> list[AssetEvent]: ...


@runtime_checkable
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


@runtime_checkable
class StatusTable(Protocol):
    """Keeps one status row per trigger (the daemon saves them; ``watchkeeper status`` reads)."""

    async def asave_trigger_status(self, statuses: Sequence[TriggerStatus]) -> None: ...

    async def adelete_trigger_status(self, trigger_ids: Sequence[str]) -> None: ...

    async def alist_trigger_status(self) -> list[TriggerStatus]: ...


@runtime_checkable
class DaemonTable(Protocol):
    """Keeps one heartbeat row per daemon (``watchkeeper status`` tells live daemons from dead)."""

    async def asave_daemon_status(self, status: DaemonStatus) -> None: ...

    async def adelete_daemon_status(self, owners: Sequence[str]) -> None: ...

    async def alist_daemon_status(self) -> list[DaemonStatus]: ...


@runtime_checkable
class LeaseTable(Protocol):
    """Node leases and trigger leases with fencing tokens: which daemon runs which trigger.

    A daemon renews its one node lease every second or so (O(1) whatever it runs); its
    trigger leases live as long as it and carry the tokens its writes are fenced with. See
    :mod:`watchkeeper.store._leases` for the rules every built-in backend follows.
    """

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


@runtime_checkable
class NodeKeepAlive(Protocol):
    """Extends a node lease from a thread of the daemon's own, with a connection of its own,
    so that an event loop busy for seconds (starting or cancelling thousands of triggers)
    cannot make the renewal late. Only ever extends a live node lease: joining, reaping and
    claiming stay with :class:`LeaseTable`, on the loop. Optional: without it the daemon
    renews from its loop only."""

    def open_node_keepalive(self, owner: str, ttl: timedelta | float) -> NodeKeepAliveChannel:
        """A channel extending ``owner``'s node lease by ``ttl`` per renewal (connects on its
        first renewal, in the thread that uses it)."""
        ...


CAPABILITIES: tuple[type, ...] = (
    AssetRegistry,
    EventLog,
    GarbageCollector,
    StatusTable,
    LeaseTable,
    OperatorControls,
    EventConsumers,
    TaskQueue,
)
"""Every capability Protocol, for code that forwards or reports them all."""


def capability_methods(capability: type) -> tuple[str, ...]:
    """The names of the methods a capability Protocol asks for, in definition order."""
    return tuple(
        name for name, value in vars(capability).items() if name.startswith("a") and callable(value)
    )


def require_asset_registry(backend: object) -> AssetRegistry:
    """``backend`` as an :class:`AssetRegistry`, else :class:`MissingCapabilityError`."""
    if isinstance(backend, AssetRegistry):
        return backend
    raise MissingCapabilityError(backend, "AssetRegistry")


_EVENT_LOG_CLASSES: WeakSet[type] = WeakSet()
"""Classes whose instances are :class:`EventLog` s through their class alone (see below)."""


def require_event_log(backend: object) -> EventLog:
    """``backend`` as an :class:`EventLog`, else :class:`MissingCapabilityError`.

    The runtime asks once per run of every trigger, and a runtime ``Protocol``'s ``isinstance``
    costs tens of microseconds: a class whose own attributes make it an ``EventLog`` is
    remembered, and its instances pass at once unless one shadows a method in its ``__dict__``.
    """
    cls = type(backend)
    if cls in _EVENT_LOG_CLASSES and not _shadows(backend, _EVENT_LOG_METHODS):
        return backend  # type: ignore[return-value]
    if isinstance(backend, EventLog):
        if not _shadows(backend, _EVENT_LOG_METHODS) and all(
            getattr(cls, name, None) is not None for name in _EVENT_LOG_METHODS
        ):
            _EVENT_LOG_CLASSES.add(cls)
        return backend
    raise MissingCapabilityError(backend, "EventLog")


_EVENT_LOG_METHODS = ("acommit_event", "acommit_events", "alist_events")


def _shadows(backend: object, names: tuple[str, ...]) -> bool:
    """Whether ``backend``'s own ``__dict__`` holds one of ``names`` (over its class's)."""
    own: dict[str, object] | None = getattr(backend, "__dict__", None)
    return own is not None and any(name in own for name in names)


def require_garbage_collector(backend: object) -> GarbageCollector:
    """``backend`` as a :class:`GarbageCollector`, else :class:`MissingCapabilityError`."""
    if isinstance(backend, GarbageCollector):
        return backend
    raise MissingCapabilityError(backend, "GarbageCollector")


def require_status_table(backend: object) -> StatusTable:
    """``backend`` as a :class:`StatusTable`, else :class:`MissingCapabilityError`."""
    if isinstance(backend, StatusTable):
        return backend
    raise MissingCapabilityError(backend, "StatusTable")


def require_operator_controls(backend: object) -> OperatorControls:
    """``backend`` as an :class:`OperatorControls`, else :class:`MissingCapabilityError`."""
    if isinstance(backend, OperatorControls):
        return backend
    raise MissingCapabilityError(backend, "OperatorControls")
