"""watchkeeper.triggerer: watcher triggers, the runtime that runs them, the daemon and the CLI."""

from __future__ import annotations

from watchkeeper.store import Asset

from ._asset_task import AnyOf, AssetTask, OutletEventAccessor, asset_task
from ._loader import LoadResult, WatcherError, WatcherGroup, load_watchers
from ._logging import configure_logging
from ._worker import Worker, run_worker
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
from .settings import (
    LoggingSettings,
    Settings,
    TriggererSettings,
    WorkerSettings,
    load_settings,
)
from .trigger import AssetWatcher, BaseEventTrigger, BaseTrigger, TriggerEvent, TriggerEventBatch

__all__ = [
    "AnyOf",
    "Asset",
    "AssetStoreUnavailableError",
    "AssetTask",
    "AssetWatcher",
    "BaseEventTrigger",
    "BaseTrigger",
    "CapacityError",
    "Daemon",
    "InvalidEventError",
    "LoadResult",
    "LoggingSettings",
    "OutletEventAccessor",
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
    "Worker",
    "WorkerSettings",
    "asset_task",
    "configure_logging",
    "load_settings",
    "load_watchers",
    "run_daemon",
    "run_worker",
]
