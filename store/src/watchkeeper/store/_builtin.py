"""The built-in services of a store over its drivers: what the built-in backends offer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._log_service import LogsService
from ._protocols import (
    Services,
)
from ._services import ControlsService, EventsService, GcService, LeasesService, StatusService
from ._task_service import TasksService

if TYPE_CHECKING:
    from ._backend import BaseStateBackend
    from ._drivers import (
        ControlsDriver,
        EventFeedDriver,
        EventsDriver,
        GcDriver,
        LeasesDriver,
        RunsDriver,
        StatusDriver,
        TaskSpecsDriver,
        WaitForRelease,
    )
    from ._logs import LogsDriver
    from ._protocols import (
        NodeKeepAlive,
    )

__all__ = ["builtin_services"]


def builtin_services(
    store: BaseStateBackend,
    *,
    events: EventsDriver,
    feed: EventFeedDriver,
    tasks: TaskSpecsDriver,
    runs: RunsDriver,
    leases: LeasesDriver,
    controls: ControlsDriver,
    status: StatusDriver,
    gc: GcDriver,
    logs: LogsDriver,
    wait_for_release: WaitForRelease | None = None,
    keepalive: NodeKeepAlive | None = None,
) -> Services:
    """Every built-in service of ``store``, each over the driver of its primitives (one
    object may be the driver of several; see :class:`~._services.LeasesService` for
    ``wait_for_release`` and ``keepalive``)."""
    return Services(
        events=EventsService(store, events, feed),
        tasks=TasksService(store, tasks, runs),
        leases=LeasesService(store, leases, wait_for_release=wait_for_release, keepalive=keepalive),
        controls=ControlsService(store, controls),
        status=StatusService(store, status),
        gc=GcService(store, gc),
        logs=LogsService(store, logs),
    )
