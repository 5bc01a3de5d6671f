"""What every wing of the triggerer shares: naming an error, logging set-up, the settings'
constants, the event-loop choice, telling a service manager how the process is doing, the
JSON shape of events, tasks and runs, the async-service base and the lazy re-exports.

It may import the store's public modules and nothing else of the triggerer, so any wing (and
the top-level :mod:`watchkeeper.triggerer`) can import it. Its names are for the triggerer's
own use, not for users.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from ._defaults import DEFAULT_RELOAD_INTERVAL, EVENT_LOOPS, LOG_LEVELS
    from ._describe import describe_error, lease_lost
    from ._event_loop import EventLoopUnavailableError, anyio_backend_options, uses_uvloop
    from ._logging import configure_logging, kept_logging
    from ._notify import notify
    from ._records import event_record, iso, log_record, run_record, task_record
    from ._runs import retry_failed_runs
    from ._service import AsyncService

__all__ = [
    "DEFAULT_RELOAD_INTERVAL",
    "EVENT_LOOPS",
    "LOG_LEVELS",
    "AsyncService",
    "EventLoopUnavailableError",
    "anyio_backend_options",
    "configure_logging",
    "describe_error",
    "event_record",
    "iso",
    "kept_logging",
    "lazy_exports",
    "lease_lost",
    "log_record",
    "notify",
    "retry_failed_runs",
    "run_record",
    "task_record",
    "uses_uvloop",
]

_EXPORTS: dict[str, tuple[str, ...]] = {
    "._defaults": ("DEFAULT_RELOAD_INTERVAL", "EVENT_LOOPS", "LOG_LEVELS"),
    "._describe": ("describe_error", "lease_lost"),
    "._event_loop": ("EventLoopUnavailableError", "anyio_backend_options", "uses_uvloop"),
    "._logging": ("configure_logging", "kept_logging"),
    "._notify": ("notify",),
    "._service": ("AsyncService",),
    "._records": ("event_record", "iso", "log_record", "run_record", "task_record"),
    "._runs": ("retry_failed_runs",),
}

if not TYPE_CHECKING:  # type checkers read the imports above
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
