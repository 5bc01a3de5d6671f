"""Scripted triggers, a gated backend and a log watcher shared by the runtime tests."""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger
from watchkeeper.store import (
    Asset,
    BaseStateBackend,
    MemoryStateBackend,
    SqliteStateBackend,
    StateScope,
)
from watchkeeper.store.protocols import Put, RawEntry
from watchkeeper.triggerer import (
    BaseEventTrigger,
    RunnerConfig,
    TriggerEvent,
    TriggerEventBatch,
    WatchSpec,
)

FAST = RunnerConfig(
    backoff_initial=0.001,
    backoff_max=0.005,
    backoff_jitter=0.0,
    max_failures=3,
    cleanup_timeout=1.0,
    stop_grace=2.0,
    lag_threshold=0,
    status_interval=0,
)
"""Quick restarts, no lag monitor, no status saving: the base of most runtime tests."""


def fast(**changes: Any) -> RunnerConfig:
    return FAST.model_copy(update=changes)


def spec(trigger_id: str, trigger: BaseEventTrigger, *assets: Asset) -> WatchSpec:
    return WatchSpec(trigger_id, trigger, tuple(assets))


class Scripted(BaseEventTrigger):
    """Yields ``events`` in order, then holds (``then="hold"``), returns, or raises.

    After each yield it records the ``wm`` watermark of its first asset, so a test can see what the
    generator observed once it was resumed. ``drained`` is set when every event was yielded and
    the generator resumed after the last one.
    """

    def __init__(
        self,
        events: Sequence[TriggerEvent],
        *,
        then: str = "hold",
        error: Exception | None = None,
    ) -> None:
        self.events = list(events)
        self.then = then
        self.error = error
        self.runs = 0
        self.cleanups = 0
        self.seen_after_yield: list[Any] = []
        self.drained = anyio.Event()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.runs += 1
        for event in self.events:
            yield event
            store = self.asset_state_store
            self.seen_after_yield.append(await store[store.assets[0]].aget("wm"))
        self.drained.set()
        if self.then == "raise":
            raise self.error or RuntimeError("scripted failure")
        if self.then == "hold":
            await anyio.sleep_forever()

    async def cleanup(self) -> None:
        self.cleanups += 1


class Ticker(BaseEventTrigger):
    """A healthy watcher: yields ``tick i`` with watermark ``i`` forever, yielding control
    between events; ``reached(n)`` returns an Event set once ``n`` events were committed."""

    def __init__(self) -> None:
        self.count = 0
        self._waits: list[tuple[int, anyio.Event]] = []

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    def reached(self, n: int) -> anyio.Event:
        event = anyio.Event()
        if self.count >= n:
            event.set()
        else:
            self._waits.append((n, event))
        return event

    async def run(self) -> AsyncIterator[TriggerEvent]:
        start = await self.asset_state_store.aget("wm", 0)
        i = start
        while True:
            i += 1
            yield TriggerEvent({"tick": i}, state={"wm": i})
            self.count += 1
            for n, event in self._waits:
                if self.count >= n:
                    event.set()
            await anyio.lowlevel.checkpoint()


class GatedBackend(MemoryStateBackend):
    """A memory backend that sync callers reach only through the async bridge, and whose
    async reads wait for ``gate`` when one is set (to prove a sync call does not block)."""

    _get = BaseStateBackend._get  # un-override the sync hooks: force the async bridge
    _put = BaseStateBackend._put

    def __init__(self) -> None:
        super().__init__()
        self.gate: anyio.Event | None = None

    async def _aget(self, scope: StateScope, key: str) -> RawEntry | None:
        if self.gate is not None:
            await self.gate.wait()
        return MemoryStateBackend._get(self, scope, key)

    async def _aput(self, put: Put) -> int:
        return MemoryStateBackend._put(self, put)


def open_backend(kind: str, tmp_path: Path) -> BaseStateBackend:
    """An unopened backend of ``kind`` (``memory`` or ``sqlite``, a file under tmp_path)."""
    if kind == "memory":
        return MemoryStateBackend()
    return SqliteStateBackend(tmp_path / "state.db")


class LogWatch:
    """Captured structlog events, and a way to await one without sleeping.

    Waiting works for events logged on the event loop thread (everything but the lag
    monitor's, which are logged while the loop is blocked and so are present once it resumes).
    """

    def __init__(self) -> None:
        self.entries: list[EventDict] = []
        self._waiters: list[tuple[Callable[[EventDict], bool], anyio.Event]] = []
        self._loop_thread = threading.get_ident()

    def __call__(self, logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
        if threading.get_ident() == self._loop_thread:
            for predicate, event in self._waiters:
                if predicate(event_dict):
                    event.set()
        return event_dict

    def named(self, name: str, **fields: Any) -> list[EventDict]:
        return [e for e in self.entries if _matches(e, name, fields)]

    async def wait_for(self, name: str, count: int = 1, **fields: Any) -> list[EventDict]:
        """Wait (at most 20 s: some of these events follow a child process's start, slow on
        a loaded machine) until ``count`` events called ``name`` with ``fields`` exist."""
        with anyio.fail_after(20):
            while len(self.named(name, **fields)) < count:
                event = anyio.Event()
                waiter = (lambda e: _matches(e, name, fields), event)
                self._waiters.append(waiter)
                try:
                    await event.wait()
                finally:
                    self._waiters.remove(waiter)
        return self.named(name, **fields)


def _matches(entry: EventDict, name: str, fields: dict[str, Any]) -> bool:
    return entry.get("event") == name and all(entry.get(k) == v for k, v in fields.items())


@contextmanager
def watch_logs() -> Iterator[LogWatch]:
    """``structlog.testing.capture_logs()`` with the bound context merged in, and a
    :class:`LogWatch` in front of it."""
    watch = LogWatch()
    processors: list[Processor] = [structlog.contextvars.merge_contextvars, watch]
    with structlog.testing.capture_logs(processors=processors) as entries:
        watch.entries = entries
        yield watch


TriggerT = TypeVar("TriggerT", bound=BaseEventTrigger)


def rebuilt(trigger: TriggerT) -> TriggerT:
    """A new instance from ``serialize()``, its kwargs through JSON, as a restarted daemon
    builds it from what it stored."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    instance = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert isinstance(instance, type(trigger))
    return instance


class Signalling(BaseEventTrigger):
    """Mix in before a ready-made watcher class (they yield batches): sets ``committed`` once
    ``signal_after`` events were committed (the run resumes after a batch once all of it
    committed)."""

    signal_after = 1
    committed: anyio.Event

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        count = 0
        async with aclosing(super().run()) as batches:  # type: ignore[type-var, safe-super]
            async for batch in batches:
                assert isinstance(batch, TriggerEventBatch)
                yield batch
                count += len(batch)
                if count >= self.signal_after:
                    self.committed.set()
