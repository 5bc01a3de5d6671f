"""The embeddable runtime: :class:`TriggerRunner` supervising triggers in the caller's event
loop, one supervisor per trigger (:func:`drive_trigger` runs one ``run()``), the encoder that
turns a yielded event into a commit, the store's health, the loop-lag monitor and the runner's
metrics.

It may import the store, the authoring API (:mod:`..trigger`, :mod:`..errors`) and
:mod:`.._core`; never the daemon, the worker, the CLI or the API, so an embedding loads only
this. The names below are the runtime's public ones (the other wings import nothing else).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core import lazy_exports

if TYPE_CHECKING:
    from ._config import RunnerConfig, SupervisionSettings, backoff_delay
    from ._health import StoreHealth, store_unavailable
    from ._metrics import RuntimeMetrics
    from ._runner import TriggerRunner, WatchSpec
    from ._slot import TriggerSlot
    from ._supervisor import drive_trigger, supervise

__all__ = [
    "RunnerConfig",
    "RuntimeMetrics",
    "StoreHealth",
    "SupervisionSettings",
    "TriggerRunner",
    "TriggerSlot",
    "WatchSpec",
    "backoff_delay",
    "drive_trigger",
    "store_unavailable",
    "supervise",
]

_EXPORTS: dict[str, tuple[str, ...]] = {
    "._config": ("RunnerConfig", "SupervisionSettings", "backoff_delay"),
    "._health": ("StoreHealth", "store_unavailable"),
    "._metrics": ("RuntimeMetrics",),
    "._runner": ("TriggerRunner", "WatchSpec"),
    "._slot": ("TriggerSlot",),
    "._supervisor": ("drive_trigger", "supervise"),
}

if not TYPE_CHECKING:  # type checkers read the imports above
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
