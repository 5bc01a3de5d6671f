"""watchkeeper.triggerer: watcher triggers, the runtime that runs them, the daemon and the CLI."""

from __future__ import annotations

from watchkeeper.store import Asset

from .errors import (
    AssetStoreUnavailableError,
    InvalidEventError,
    TriggererError,
    TriggerImportError,
)
from .trigger import AssetWatcher, BaseEventTrigger, BaseTrigger, TriggerEvent

__all__ = [
    "Asset",
    "AssetStoreUnavailableError",
    "AssetWatcher",
    "BaseEventTrigger",
    "BaseTrigger",
    "InvalidEventError",
    "TriggerEvent",
    "TriggerImportError",
    "TriggererError",
]
