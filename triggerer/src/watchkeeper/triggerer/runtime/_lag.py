"""The loop-lag monitor: notices a blocked event loop and names the trigger that blocked it.

A heartbeat task on the loop stamps ``time.monotonic()`` every ``interval``. A watchdog thread
(it keeps running while the loop thread is stuck, because a blocked loop is exactly when nobody
on the loop can look) compares the stamp with the clock. When the heartbeat is late by more than
``threshold`` it looks at what the loop thread is doing *right now*:

1. the task currently stepping on that loop (``asyncio.current_task(loop)``, a dict read that is
   safe from another thread), mapped to the trigger whose supervisor owns it;
2. failing that (a task the trigger spawned itself), the loop thread's stack
   (``sys._current_frames()``), walked for a frame whose ``self`` is a trigger;

and logs ``loop_blocked`` with ``trigger_id``, ``classpath`` and the source line executing, while
the loop is still blocked. When the heartbeat moves again it logs ``loop_unblocked`` with how long
the loop was stuck in total. Airflow's triggerer can only say *that* the loop was blocked.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import anyio
import anyio.abc
from watchkeeper.store.protocols import get_logger

from ..trigger import BaseTrigger

__all__ = ["Culprit", "LoopLagMonitor"]

log = get_logger(__name__)

Culprit = tuple[str | None, str]
"""``(trigger_id, classpath)`` of the trigger found on the blocked loop."""

_MAX_FRAMES = 256


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("trigger_id") == b.get("trigger_id") and a.get("task") == b.get("task")


class LoopLagMonitor:
    """Watches one event loop from a thread; ``run()`` is the heartbeat task that owns it.

    ``resolve_task`` maps an asyncio task to the trigger it runs; ``resolve_trigger`` maps a
    trigger instance found on the stack. Both return ``None`` for things they do not know.
    """

    def __init__(
        self,
        threshold: float,
        *,
        resolve_task: Callable[[object], Culprit | None],
        resolve_trigger: Callable[[BaseTrigger], Culprit | None],
        interval: float | None = None,
    ) -> None:
        if threshold <= 0:
            raise ValueError(f"threshold must be positive, got {threshold}")
        self.threshold = threshold
        self.interval = interval if interval is not None else min(0.05, threshold / 2)
        self.blocks = 0
        self._resolve_task = resolve_task
        self._resolve_trigger = resolve_trigger
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        alive = self._thread is not None and self._thread.is_alive()
        return f"<LoopLagMonitor threshold={self.threshold} blocks={self.blocks} running={alive}>"

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Beat until cancelled; the watchdog thread lives exactly as long as this task."""
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self._beat = time.monotonic()
        thread = threading.Thread(
            target=self._watch,
            args=(loop, threading.get_ident()),
            name="watchkeeper-loop-lag",
            daemon=True,
        )
        thread.start()
        self._thread = thread
        try:
            task_status.started()
            interval = self.interval
            while True:
                await anyio.sleep(interval)
                self._beat = time.monotonic()
        finally:
            self._stop.set()
            # Joining blocks, so it happens in a worker thread; shielded so that a cancelled
            # runner still waits for its thread, and bounded so that it cannot hang exit.
            with anyio.move_on_after(5, shield=True):
                await anyio.to_thread.run_sync(thread.join)

    # -- the watchdog thread -------------------------------------------------------------------

    def _watch(self, loop: asyncio.AbstractEventLoop, loop_thread: int) -> None:
        poll = self.interval / 2
        blocked_since: float | None = None  # the heartbeat stamp of the block being reported
        culprit: dict[str, Any] = {}
        while not self._stop.wait(poll):
            beat = self._beat
            if blocked_since is not None and beat != blocked_since:
                log.warning(
                    "loop_unblocked",
                    blocked_for=round(max(beat - blocked_since - self.interval, 0.0), 3),
                    **culprit,
                )
                blocked_since = None
            late = time.monotonic() - beat - self.interval
            if late <= self.threshold:
                continue
            # Sample on every poll of a block: one stall can chain several culprits (a loop
            # starved by the machine, then a trigger that sleeps), and each gets named.
            sample = self._culprit(loop, loop_thread)
            if blocked_since is not None and _same(sample, culprit):
                continue
            blocked_since = beat
            culprit = sample
            self.blocks += 1
            log.warning(
                "loop_blocked",
                blocked_for=round(late, 3),
                threshold=self.threshold,
                **culprit,
            )

    def _culprit(self, loop: asyncio.AbstractEventLoop, loop_thread: int) -> dict[str, Any]:
        found: Culprit | None = None
        task = asyncio.current_task(loop)
        if task is not None:
            found = self._resolve_task(task)
        frame = sys._current_frames().get(loop_thread)
        location = None
        if frame is not None:
            code = frame.f_code
            location = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
            if found is None:
                found = self._trigger_on_stack(frame)
        trigger_id, classpath = found if found is not None else (None, None)
        return {
            "trigger_id": trigger_id,
            "classpath": classpath,
            "task": task.get_name() if task is not None else None,
            "location": location,
        }

    def _trigger_on_stack(self, frame: FrameType | None) -> Culprit | None:
        depth = 0
        while frame is not None and depth < _MAX_FRAMES:
            if "self" in frame.f_code.co_varnames:
                owner = frame.f_locals.get("self")
                if isinstance(owner, BaseTrigger):
                    return self._resolve_trigger(owner) or (None, type(owner).classpath())
            frame = frame.f_back
            depth += 1
        return None
