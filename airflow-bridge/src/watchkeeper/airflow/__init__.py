"""watchkeeper beside Apache Airflow 3.3 (the ``watchkeeper-airflow`` distribution).

Airflow itself is an optional dependency (the ``airflow`` extra): nothing here imports it at
module import time, so the core packages never pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._triggers import HOLD_LINGER, AirflowTrigger

__all__ = ["HOLD_LINGER", "AirflowTrigger"]

_LAZY = {"HOLD_LINGER": "._triggers", "AirflowTrigger": "._triggers"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
