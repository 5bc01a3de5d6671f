"""The built-in services of a store over one driver: what the built-in backends offer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._services import ControlsService, EventsService, GcService, LeasesService, StatusService
from ._task_service import TasksService
from .protocols import Services

if TYPE_CHECKING:
    from ._backend import BaseStateBackend
    from .protocols import Driver, NodeKeepAlive, WaitForRelease

__all__ = ["builtin_services"]


def builtin_services(
    store: BaseStateBackend,
    driver: Driver,
    *,
    wait_for_release: WaitForRelease | None = None,
    keepalive: NodeKeepAlive | None = None,
) -> Services:
    """Every built-in service of ``store`` over ``driver``'s primitives (see
    :class:`~.protocols.LeasesService` for ``wait_for_release`` and ``keepalive``)."""
    return Services(
        events=EventsService(store, driver),
        tasks=TasksService(store, driver),
        leases=LeasesService(store, driver, wait_for_release=wait_for_release, keepalive=keepalive),
        controls=ControlsService(store, driver),
        status=StatusService(store, driver),
        gc=GcService(store, driver),
    )
