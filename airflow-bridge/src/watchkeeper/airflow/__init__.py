"""watchkeeper beside Apache Airflow 3.3 (the ``watchkeeper-airflow`` distribution).

Airflow itself is an optional dependency (the ``airflow`` extra): nothing here imports it at
module import time, so the core packages never pay for it. Each name below loads its module
(and Airflow, where that module needs it) the first time it is read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._relay import AirflowRelay, RelayError, RelaySettings
    from ._store_backend import StateValueRejectedError, WatchkeeperStoreBackend
    from ._triggers import HOLD_LINGER, AirflowTrigger

_EXPORTS: dict[str, str] = {
    "HOLD_LINGER": "._triggers",
    "AirflowRelay": "._relay",
    "AirflowTrigger": "._triggers",
    "RelayError": "._relay",
    "RelaySettings": "._relay",
    "StateValueRejectedError": "._store_backend",
    "WatchkeeperStoreBackend": "._store_backend",
}

__all__ = [
    "HOLD_LINGER",
    "AirflowRelay",
    "AirflowTrigger",
    "RelayError",
    "RelaySettings",
    "StateValueRejectedError",
    "WatchkeeperStoreBackend",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
