"""watchkeeper.triggerer: watcher triggers, the runtime that runs them, the daemon and the CLI.

This package exports what watcher authors and embedders use: the authoring API
(:mod:`.trigger`), the runner, the daemon, the worker, their settings and the errors. The code
lives in wings by product, each with its own ``__init__``: :mod:`.runtime` (the embeddable
runner), :mod:`.daemon`, :mod:`.worker`, :mod:`.cli` (the command line), :mod:`.api` (the
HTTP API) and :mod:`.testing` (the test kit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._core import lazy_exports

if TYPE_CHECKING:
    from watchkeeper.store import Asset

    from ._core import configure_logging
    from .daemon import Daemon, ReloadReport, run_daemon
    from .errors import (
        AssetStoreUnavailableError,
        CapacityError,
        InvalidEventError,
        TriggererError,
        TriggerImportError,
        WatcherNameUnavailableError,
    )
    from .runtime import RunnerConfig, TriggerRunner, WatchSpec
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
    from .worker import (
        AnyOf,
        AssetTask,
        OutletEventAccessor,
        Worker,
        asset_task,
        configure_connections,
        run_worker,
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
    "._core": ("configure_logging",),
    ".daemon": ("Daemon", "ReloadReport", "run_daemon"),
    ".errors": (
        "AssetStoreUnavailableError",
        "CapacityError",
        "InvalidEventError",
        "TriggererError",
        "TriggerImportError",
        "WatcherNameUnavailableError",
    ),
    ".runtime": ("RunnerConfig", "TriggerRunner", "WatchSpec"),
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
    ".worker": (
        "AnyOf",
        "AssetTask",
        "OutletEventAccessor",
        "Worker",
        "asset_task",
        "configure_connections",
        "run_worker",
    ),
}
"""Which module each public name comes from; read on first use (see :mod:`._core._lazy`)."""

if not TYPE_CHECKING:  # type checkers read the imports above; unknown names stay errors
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
