"""watchkeeper.triggerer: watcher triggers, the runtime that runs them, the daemon and the CLI.

This package exports what watcher authors and embedders use: the authoring API
(:mod:`.trigger`), the runner, the daemon and its settings, and the errors. The command line
is :mod:`watchkeeper.triggerer.cli`, the test kit :mod:`watchkeeper.triggerer.testing`; how
watcher files are loaded is internal.
"""

from __future__ import annotations

from watchkeeper.store import Asset

from ._asset_task import AnyOf, AssetTask, OutletEventAccessor, asset_task
from ._logging import configure_logging
from ._process import run_daemon
from ._worker import Worker, configure_connections, run_worker
from .daemon import Daemon, ReloadReport
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
    "WatcherNameUnavailableError",
    "Worker",
    "WorkerSettings",
    "asset_task",
    "configure_connections",
    "configure_logging",
    "load_settings",
    "run_daemon",
    "run_worker",
]
