"""Tuning the cyclic garbage collector for a daemon process that holds many long-lived triggers.

A daemon that starts 10,000 watchers creates ~800,000 objects the collector tracks (tasks,
coroutines, cancel scopes, the triggers themselves), and they live until the process exits.
With CPython's defaults the collector scans all of them again each time the heap grew by a
quarter: full collections took a large share of the start of 10,000 idle watchers, and gen-0
collections every few milliseconds a visible share of the idle CPU (figures in BENCHMARKS.md).

So the daemon (the owner of its process; the embeddable runner never touches global GC state)
does two things, and only when asked (``Daemon(tune_gc=True)``, which ``run_daemon`` passes):

- :func:`startup_gc`: the collector is paused while the first load starts the triggers, then
  :func:`gc.freeze` moves every object alive at that point to the permanent generation, which
  later collections skip. The triggers still free their objects by reference counting when
  they stop; only reference cycles among the frozen objects would stay (a one-off cost).
- :func:`raise_gen0_threshold`: collections of the young generation run after 10,000 net new
  container objects instead of 700, so short-lived objects (a poll's futures, timer handles)
  are mostly freed by reference counting before a collection ever sees them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["GEN0_THRESHOLD", "raise_gen0_threshold", "startup_gc"]

GEN0_THRESHOLD = 10_000
"""The daemon's young-generation threshold (CPython's default is 700)."""


def raise_gen0_threshold(threshold: int = GEN0_THRESHOLD) -> tuple[int, ...]:
    """Raise the gen-0 threshold to ``threshold`` (never lower it); returns the old thresholds."""
    old = gc.get_threshold()
    if old[0] and old[0] < threshold:
        gc.set_threshold(threshold, *old[1:])
    return old


@contextlib.contextmanager
def startup_gc() -> Iterator[None]:
    """Pause the collector for the block, then freeze what is alive and resume it.

    The collector's earlier state is restored (it stays off if it was off). The freeze also
    happens when the block raises: what survived so far is as long-lived as before.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
