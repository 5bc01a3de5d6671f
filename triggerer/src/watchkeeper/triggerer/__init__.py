"""watchkeeper.triggerer: watcher triggers, the runtime that runs them, the daemon and the CLI."""

from __future__ import annotations

from watchkeeper.store import Asset

from ._loader import LoadResult, WatcherError, WatcherGroup, load_watchers
from ._logging import configure_logging
from .daemon import Daemon, ReloadReport, run_daemon
from .errors import (
    AssetStoreUnavailableError,
    CapacityError,
    InvalidEventError,
    TriggererError,
    TriggerImportError,
    WatcherNameUnavailableError,
)
from .runner import RunnerConfig, TriggerRunner, WatchSpec
from .settings import LoggingSettings, Settings, TriggererSettings, load_settings
from .trigger import AssetWatcher, BaseEventTrigger, BaseTrigger, TriggerEvent, TriggerEventBatch

__all__ = [
    "Asset",
    "AssetStoreUnavailableError",
    "AssetWatcher",
    "BaseEventTrigger",
    "BaseTrigger",
    "CapacityError",
    "Daemon",
    "InvalidEventError",
    "LoadResult",
    "LoggingSettings",
    "ReloadReport",
    "RunnerConfig",
    "Settings",
    "TriggerEvent",
    "TriggerEventBatch",
    "TriggerImportError",
    "TriggerRunner",
    "TriggererError",
    "TriggererSettings",
    "WatchSpec",
    "WatcherError",
    "WatcherGroup",
    "WatcherNameUnavailableError",
    "configure_logging",
    "load_settings",
    "load_watchers",
    "run_daemon",
]
