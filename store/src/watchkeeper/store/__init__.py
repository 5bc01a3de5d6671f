"""watchkeeper.store: task and asset state, its backends and the accessors tasks and triggers use."""

from __future__ import annotations

from ._backend import BaseStateBackend
from ._open import open_state_backend
from ._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    AssetScope,
    DaemonStatus,
    EventCommit,
    Fence,
    GcReport,
    Lease,
    RawEntry,
    RefusedDefinition,
    StateEntry,
    StateScope,
    TaskScope,
    TriggerStatus,
    Writer,
)
from ._values import (
    DEFAULT_MAX_VALUE_BYTES,
    MAX_KEY_LENGTH,
    NEVER_EXPIRE,
    encode_json,
    encode_value,
)
from .accessors import AssetStateStoreAccessor, AssetStateStoreAccessors, TaskStateStoreAccessor
from .context import build_task_context, run_task
from .errors import (
    AssetNotFoundError,
    BackendUnavailableError,
    InvalidKeyError,
    InvalidNameError,
    InvalidValueError,
    KeyTypeError,
    LeaseLostError,
    RetentionTypeError,
    StateStoreError,
    StoreClosedError,
    SyncCallInLoopError,
    ValueTooLargeError,
    ValueTypeError,
    VersionConflictError,
)
from .memory import MemoryStateBackend
from .postgres import PostgresStateBackend
from .settings import (
    ConfigFileNotFoundError,
    DatabaseSettings,
    InvalidConfigFileError,
    StateStoreSettings,
    StoreSettings,
    WorkersSettings,
)
from .sqlite import SqliteStateBackend

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_KEY_LENGTH",
    "NEVER_EXPIRE",
    "Asset",
    "AssetEvent",
    "AssetInfo",
    "AssetNotFoundError",
    "AssetScope",
    "AssetStateStoreAccessor",
    "AssetStateStoreAccessors",
    "BackendUnavailableError",
    "BaseStateBackend",
    "ConfigFileNotFoundError",
    "DaemonStatus",
    "DatabaseSettings",
    "EventCommit",
    "Fence",
    "GcReport",
    "InvalidConfigFileError",
    "InvalidKeyError",
    "InvalidNameError",
    "InvalidValueError",
    "KeyTypeError",
    "Lease",
    "LeaseLostError",
    "MemoryStateBackend",
    "PostgresStateBackend",
    "RawEntry",
    "RefusedDefinition",
    "RetentionTypeError",
    "SqliteStateBackend",
    "StateEntry",
    "StateScope",
    "StateStoreError",
    "StateStoreSettings",
    "StoreClosedError",
    "StoreSettings",
    "SyncCallInLoopError",
    "TaskScope",
    "TaskStateStoreAccessor",
    "TriggerStatus",
    "ValueTooLargeError",
    "ValueTypeError",
    "VersionConflictError",
    "WorkersSettings",
    "Writer",
    "build_task_context",
    "encode_json",
    "encode_value",
    "open_state_backend",
    "run_task",
]
