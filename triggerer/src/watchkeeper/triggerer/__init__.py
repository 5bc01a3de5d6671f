"""watchkeeper.triggerer: watcher triggers, the runtime that runs them, the daemon and the CLI.

This package exports what watcher authors and embedders use: the authoring API
(:mod:`.trigger`), the runner, the daemon and its settings, and the errors. The command line
is :mod:`watchkeeper.triggerer.cli`, the test kit :mod:`watchkeeper.triggerer.testing`; how
watcher files are loaded is internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
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
    from .trigger import (
        AssetWatcher,
        BaseEventTrigger,
        BaseTrigger,
        TriggerEvent,
        TriggerEventBatch,
    )

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

_EXPORTS: dict[str, tuple[str, ...]] = {
    "watchkeeper.store": ("Asset",),
    "._asset_task": ("AnyOf", "AssetTask", "OutletEventAccessor", "asset_task"),
    "._logging": ("configure_logging",),
    "._process": ("run_daemon",),
    "._worker": ("Worker", "configure_connections", "run_worker"),
    ".daemon": ("Daemon", "ReloadReport"),
    ".errors": (
        "AssetStoreUnavailableError",
        "CapacityError",
        "InvalidEventError",
        "TriggererError",
        "TriggerImportError",
        "WatcherNameUnavailableError",
    ),
    ".runner": ("RunnerConfig", "TriggerRunner", "WatchSpec"),
    ".settings": (
        "LoggingSettings",
        "Settings",
        "TriggererSettings",
        "WorkerSettings",
        "load_settings",
    ),
    ".trigger": (
        "AssetWatcher",
        "BaseEventTrigger",
        "BaseTrigger",
        "TriggerEvent",
        "TriggerEventBatch",
    ),
}
"""Which module each public name comes from; read on first use (see :mod:`._lazy`)."""

if not TYPE_CHECKING:  # type checkers read the imports above; unknown names stay errors
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
