"""The embeddable runner, where it has always been imported from.

The runtime lives in :mod:`watchkeeper.triggerer.runtime`; this package keeps
``from watchkeeper.triggerer.runner import TriggerRunner`` working. (A package rather than a
``runner.py`` so that version control follows the old module to ``runtime/_runner.py``.)
"""

from __future__ import annotations

from ..runtime import RunnerConfig, TriggerRunner, WatchSpec

__all__ = ["RunnerConfig", "TriggerRunner", "WatchSpec"]
