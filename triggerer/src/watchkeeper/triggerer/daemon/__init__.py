"""The daemon (``watchkeeper triggerer``): :class:`Daemon` composing its loops; the definitions
(finding the watcher files, evaluating them in a child process, trigger identity, loading);
placement (leases, the node lease's keep-alive, the pure reconcile step); its status row and
the report the CLI and the API read; watcher controls; the process wrapper (:func:`run_daemon`);
GC tuning.

It may import the store, the authoring API, :mod:`.._core` and the runtime's public names.
``Daemon``, ``ReloadReport`` and ``run_daemon`` are for users; the other names are what the
CLI, the API, the worker and the test kit may use of the daemon.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core import lazy_exports

if TYPE_CHECKING:
    from ._controls import ControlsTracker, WatcherRow, controls_of, unknown_watcher, watcher_rows
    from ._daemon import DEFAULT_RELOAD_INTERVAL, Daemon, ReloadReport
    from ._evaluate import evaluate_files
    from ._identity import canonical_trigger_json, rebuild_trigger, watcher_trigger_id
    from ._leases import daemon_identity, is_dead_local_owner
    from ._loader import LoadResult, WatcherGroup
    from ._process import run_daemon, start_api
    from ._report import daemon_report
    from ._watcher_files import (
        FileDefinitions,
        FileReads,
        WatcherError,
        import_definition_files,
        scan_watchers_path,
        unload_watchers,
    )

__all__ = [
    "DEFAULT_RELOAD_INTERVAL",
    "ControlsTracker",
    "Daemon",
    "FileDefinitions",
    "FileReads",
    "LoadResult",
    "ReloadReport",
    "WatcherError",
    "WatcherGroup",
    "WatcherRow",
    "canonical_trigger_json",
    "controls_of",
    "daemon_identity",
    "daemon_report",
    "evaluate_files",
    "import_definition_files",
    "is_dead_local_owner",
    "rebuild_trigger",
    "run_daemon",
    "scan_watchers_path",
    "start_api",
    "unknown_watcher",
    "unload_watchers",
    "watcher_rows",
    "watcher_trigger_id",
]

_EXPORTS: dict[str, tuple[str, ...]] = {
    "._controls": (
        "ControlsTracker",
        "WatcherRow",
        "controls_of",
        "unknown_watcher",
        "watcher_rows",
    ),
    "._daemon": ("DEFAULT_RELOAD_INTERVAL", "Daemon", "ReloadReport"),
    "._evaluate": ("evaluate_files",),
    "._identity": ("canonical_trigger_json", "rebuild_trigger", "watcher_trigger_id"),
    "._leases": ("daemon_identity", "is_dead_local_owner"),
    "._loader": ("LoadResult", "WatcherGroup"),
    "._process": ("run_daemon", "start_api"),
    "._report": ("daemon_report",),
    "._watcher_files": (
        "FileDefinitions",
        "FileReads",
        "WatcherError",
        "import_definition_files",
        "scan_watchers_path",
        "unload_watchers",
    ),
}

if not TYPE_CHECKING:  # type checkers read the imports above
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
