"""What a backend author implements and the runtime calls: the base class, the services, the
driver primitives, the records and the value rules.

A backend subclasses :class:`BaseStateBackend` (key/value state, the sync/async bridge, input
checks) and implements the state hooks it documents. The rest of a store is in services
(:mod:`watchkeeper.store.protocols`): a backend sets ``self.services`` in its ``__init__``,
usually ``builtin_services(self, driver)`` over a driver with the primitives, so every rule
and argument check stays in the service, once. A service a backend lacks is ``None`` there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._backend import BaseStateBackend
from ._builtin import builtin_services
from ._controls import ApiToken, WatcherControl
from ._gc import EventCutoffs, GcPlan
from ._lazy import lazy_exports
from ._lifecycle import SYNC_CALL_WITHOUT_PORTAL
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
    encode_payload,
    encode_payload_decoded,
    encode_value,
)
from .protocols import (
    SERVICE_NAMES,
    ControlsDriver,
    EventFeedDriver,
    EventLog,
    EventsDriver,
    GarbageCollector,
    GcDriver,
    LeasesDriver,
    LeaseTable,
    NodeKeepAlive,
    NodeKeepAliveChannel,
    OperatorControls,
    Services,
    StatusDriver,
    StatusTable,
    TaskQueue,
    TasksDriver,
)

if TYPE_CHECKING:
    from ._log import get_logger
    from ._threads import LoopThreads

__all__ = [
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
    "RunOutcome",
    "RunStep",
    "Services",
    "StateWrite",
    "StatusDriver",
    "StatusService",
    "StatusTable",
    "TaskInfo",
    "TaskQueue",
    "TaskRun",
    "TaskSpec",
    "TasksDriver",
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
    "encode_payload_decoded",
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
