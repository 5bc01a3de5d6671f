"""watchkeeper.triggerer.testing: the test kit for trigger authors.

- :func:`run_trigger` runs one trigger instance through the real runtime and returns the asset
  events it committed;
- :class:`WatcherHarness` runs, restarts (from ``serialize()``) and crashes a watcher at named
  points on one backend;
- :func:`run_asset_task` runs one ``asset_task`` on given events as a worker does and returns
  its runs and the events it emitted on its outlets (a :class:`TaskResult`);
- :class:`FakeEventSource` is a scripted source to poll or listen to, in memory or in a SQLite
  file shared with another process;
- the pytest plugin (:mod:`.plugin`, loaded through the ``pytest11`` entry point) provides the
  ``wk_backend``, ``wk_source`` and ``wk_harness`` fixtures.

It may import the store, the authoring API and the public names (``__all__``) of
:mod:`.._core`, the runtime, the daemon and the worker.
"""

from __future__ import annotations

from ._observed import CrashPoint, SimulatedCrash
from ._run import run_trigger
from ._tasks import TaskResult, run_asset_task
from .harness import CrashNotReachedError, HarnessRun, WatcherHarness
from .sources import (
    FakeEventSource,
    SourceClosedError,
    SourceDisconnectedError,
    SourceError,
    SourceItem,
    SourceUnavailableError,
    Subscription,
)

__all__ = [
    "CrashNotReachedError",
    "CrashPoint",
    "FakeEventSource",
    "HarnessRun",
    "SimulatedCrash",
    "SourceClosedError",
    "SourceDisconnectedError",
    "SourceError",
    "SourceItem",
    "SourceUnavailableError",
    "Subscription",
    "TaskResult",
    "WatcherHarness",
    "run_asset_task",
    "run_trigger",
]
