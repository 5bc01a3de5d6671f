"""What the ready-made watchers share: the jittered poll timer, client imports, closing a
client, equality."""

from __future__ import annotations

import importlib
import json
import random
import sys
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
from watchkeeper.triggerer import BaseEventTrigger

__all__ = [
    "CLOSE_TIMEOUT",
    "JITTER",
    "SerializedEquality",
    "close_bounded",
    "import_off_loop",
    "sleep_jittered",
    "sleep_spread",
]

JITTER = 0.1
"""Each poll sleeps ``poll_interval`` times a random factor in ``[1 - JITTER, 1 + JITTER]``."""

CLOSE_TIMEOUT = 5.0
"""Seconds a watcher's client may take to close before it is abandoned."""


async def close_bounded(close: Callable[[], Awaitable[object]]) -> None:
    """Await ``close()`` shielded from cancellation and bounded by :data:`CLOSE_TIMEOUT`.

    A watcher closes its client in ``finally`` and in ``cleanup()``, both often reached by
    cancellation: shielded, the close still runs; bounded, a server that no longer answers
    cannot hold up the daemon's shutdown.
    """
    with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
        await close()


def _loaded(name: str) -> bool:
    """True when module ``name`` is imported completely (not still executing somewhere)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        importlib.import_module(name)


async def import_off_loop(*names: str) -> None:
    """Import the modules ``names`` in a worker thread, so the event loop never waits for them.

    A client library takes a good part of a second to import the first time; imported on the
    loop, that is a blocked loop for every other watcher of the process. Once imported, the
    ``import`` statements inside a watcher are dictionary look-ups. Returns at once when every
    module is loaded already; raises what the import raises (``ImportError`` for a missing
    extra).
    """
    if not all(_loaded(name) for name in names):
        await anyio.to_thread.run_sync(_import_all, names)


async def sleep_spread(interval: float) -> None:
    """Sleep a uniformly random part of one interval, so watchers started together drift apart.

    Thousands of watchers registered by one daemon start within milliseconds of each other;
    without this their polls would stay in lockstep and hit the disk or database at once.
    """
    await anyio.sleep(random.uniform(0.0, interval))


async def sleep_jittered(interval: float) -> None:
    """Sleep ``interval`` give or take :data:`JITTER`, so phases keep spreading over time."""
    await anyio.sleep(interval * random.uniform(1.0 - JITTER, 1.0 + JITTER))


class SerializedEquality(BaseEventTrigger):
    """Triggers that are equal when they serialize equally (the daemon runs such triggers once)."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BaseEventTrigger):
            return NotImplemented
        return self.serialize() == other.serialize()

    def __hash__(self) -> int:
        classpath, kwargs = self.serialize()
        return hash((classpath, json.dumps(kwargs, sort_keys=True)))
