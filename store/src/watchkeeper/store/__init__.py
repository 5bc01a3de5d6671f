"""watchkeeper.store: task and asset state, its backends and the accessors tasks and triggers use."""

from __future__ import annotations

from ._backend import BaseStateBackend
from ._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    AssetScope,
    EventCommit,
    GcReport,
    RawEntry,
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
from .errors import (
    AssetNotFoundError,
    BackendUnavailableError,
    InvalidKeyError,
    InvalidValueError,
    KeyTypeError,
    RetentionTypeError,
    StateStoreError,
    StoreClosedError,
    SyncCallInLoopError,
    ValueTooLargeError,
    ValueTypeError,
    VersionConflictError,
)
from .memory import MemoryStateBackend

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
    "EventCommit",
    "GcReport",
    "InvalidKeyError",
    "InvalidValueError",
    "KeyTypeError",
    "MemoryStateBackend",
    "RawEntry",
    "RetentionTypeError",
    "StateEntry",
    "StateScope",
    "StateStoreError",
    "StoreClosedError",
    "SyncCallInLoopError",
    "TaskScope",
    "TaskStateStoreAccessor",
    "TriggerStatus",
    "ValueTooLargeError",
    "ValueTypeError",
    "VersionConflictError",
    "Writer",
    "encode_json",
    "encode_value",
]
