"""The embeddable runner, where it has always been imported from.

The runtime lives in :mod:`watchkeeper.triggerer.runtime`; this module keeps
``from watchkeeper.triggerer.runner import TriggerRunner`` working.
"""

from __future__ import annotations

from .runtime import RunnerConfig, TriggerRunner, WatchSpec

__all__ = ["RunnerConfig", "TriggerRunner", "WatchSpec"]
