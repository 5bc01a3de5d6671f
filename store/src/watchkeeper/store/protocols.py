"""What a backend author implements and the runtime calls: the base class, the services and
their Protocols, the driver primitives, the records and the value rules.

A store (a :class:`BaseStateBackend`) keeps key/value state itself and offers the rest as
**services**, each typed by a small Protocol: ``store.events`` (:class:`EventLog`),
``store.tasks`` (:class:`TaskQueue`), ``store.leases`` (:class:`LeaseTable`),
``store.controls`` (:class:`OperatorControls`), ``store.status`` (:class:`StatusTable`),
``store.gc`` (:class:`GarbageCollector`) and ``store.logs`` (:class:`RunLogs`). A service the store lacks is ``None`` in
``store.services`` and a :class:`~watchkeeper.store.MissingCapabilityError` at its
attribute.

A backend subclasses :class:`BaseStateBackend`, implements the state hooks it documents, and
sets ``self.services`` in its ``__init__``: usually :func:`builtin_services` over the objects
that implement each service's primitives (the ``*Driver`` Protocols), so every rule and
argument check stays in the service, written once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._backend import BaseStateBackend
from ._builtin import builtin_services
from ._controls import ApiToken, WatcherControl
from ._drivers import (
    ControlsDriver,
    EventFeedDriver,
    EventsDriver,
    GcDriver,
    LeasesDriver,
    RunsDriver,
    StatusDriver,
    TaskSpecsDriver,
)
from ._gc import EventCutoffs, GcPlan
from ._lazy import lazy_exports
from ._lifecycle import SYNC_CALL_WITHOUT_PORTAL
from ._log_service import LogsService
from ._logs import DEFAULT_LOG_MAX_BYTES, LOG_STREAMS, LogChunk, LogsDriver
from ._payloads import encode_payload
from ._protocols import (
    SERVICE_NAMES,
    EventLog,
    GarbageCollector,
    LeaseTable,
    NodeKeepAlive,
    NodeKeepAliveChannel,
    OperatorControls,
    RunLogs,
    Services,
    StatusTable,
    TaskQueue,
)
from ._redact import redact_data, redact_dsn, redact_secrets
from ._services import (
    ControlsService,
    EncodedState,
    EventsService,
    GcService,
    LeasesService,
    StatusService,
)
from ._task_service import TasksService
from ._tasks import (
    MAX_LOST_TRIES,
    RUN_STATES,
    TRY_CAUSES,
    OutletEvent,
    RunError,
    RunOutcome,
    RunStep,
    StateWrite,
    TaskInfo,
    TaskRun,
    TaskSpec,
)
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

if TYPE_CHECKING:
    from ._log import get_logger
    from ._threads import LoopThreads

__all__ = [
    "DEFAULT_LOG_MAX_BYTES",
    "LOG_STREAMS",
    "MAX_LOST_TRIES",
    "RUN_STATES",
    "SERVICE_NAMES",
    "SYNC_CALL_WITHOUT_PORTAL",
    "TRY_CAUSES",
    "ApiToken",
    "Asset",
    "AssetEvent",
    "AssetInfo",
    "BaseStateBackend",
    "ControlsDriver",
    "ControlsService",
    "DaemonStatus",
    "EncodedState",
    "EventBatchCommit",
    "EventCommit",
    "EventCutoffs",
    "EventFeedDriver",
    "EventLog",
    "EventsDriver",
    "EventsService",
    "Fence",
    "GarbageCollector",
    "GcDriver",
    "GcPlan",
    "GcReport",
    "GcService",
    "Lease",
    "LeaseTable",
    "LeasesDriver",
    "LeasesService",
    "LogChunk",
    "LogsDriver",
    "LogsService",
    "LoopThreads",
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
    "RunLogs",
    "RunOutcome",
    "RunStep",
    "RunsDriver",
    "Services",
    "StateWrite",
    "StatusDriver",
    "StatusService",
    "StatusTable",
    "TaskInfo",
    "TaskQueue",
    "TaskRun",
    "TaskSpec",
    "TaskSpecsDriver",
    "TasksService",
    "TriggerStatus",
    "WatcherControl",
    "Writer",
    "builtin_services",
    "check_key",
    "check_name",
    "decode_value",
    "encode_json",
    "encode_payload",
    "encode_value",
    "get_logger",
    "redact_data",
    "redact_dsn",
    "redact_secrets",
]

if not TYPE_CHECKING:  # structlog loads with the first logger, not with the records
    __getattr__, __dir__ = lazy_exports(
        __name__, {"._log": ("get_logger",), "._threads": ("LoopThreads",)}
    )
