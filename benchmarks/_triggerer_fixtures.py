"""What ``triggerer_bench.py`` runs: fake in-process sources, the benchmark triggers, the
databases it observes, and the raw group-commit pipelines it measures them against.

Not a test and not part of any package: imported by ``benchmarks/triggerer_bench.py`` only.

The raw pipelines these are compared with live in ``_raw_pipeline.py``.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg
from watchkeeper.store import PostgresStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, Writer
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent

__all__ = [
    "PLANS",
    "SOURCES",
    "Database",
    "Firehose",
    "IdleSource",
    "Paced",
    "Plan",
    "PollingWatcher",
    "commit_firehose",
    "firehose_producer",
    "open_database",
    "paced_producer",
]

Submit = Callable[[int, str, str, int], Awaitable[None]]
"""``submit(asset_id, asset_name, payload_json, watermark)``: returns once committed."""


# -- fake in-process sources and the benchmark triggers ----------------------------------------


class IdleSource:
    """An in-process source that never has anything new; it counts the polls it answers.

    ``all_started`` is set once ``expected`` watchers have entered their ``run()``.
    """

    def __init__(self, expected: int) -> None:
        self.polls = 0
        self.started = 0
        self.expected = expected
        self.all_started = anyio.Event()

    def connected(self) -> None:
        self.started += 1
        if self.started == self.expected:
            self.all_started.set()

    def poll(self, after: int) -> list[tuple[int, Any]]:
        self.polls += 1
        return []


SOURCES: dict[str, IdleSource] = {}
"""In-process sources by name: a trigger keeps the name (its kwargs must be JSON)."""

PLANS: dict[str, Plan] = {}


class PollingWatcher(BaseEventTrigger):
    """Polls its source every ``interval`` seconds, jittered by +-10 %, from a random phase."""

    def __init__(self, source: str, interval: float = 1.0) -> None:
        super().__init__()
        self.source = source
        self.interval = interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"source": self.source, "interval": self.interval}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        source = SOURCES[self.source]
        source.connected()
        interval = self.interval
        cursor = 0
        await anyio.sleep(random.uniform(0.0, interval))  # spread the first polls
        while True:
            for seq, payload in source.poll(cursor):
                cursor = seq
                yield TriggerEvent(payload, state={"watermark": seq})
            await anyio.sleep(interval * random.uniform(0.9, 1.1))


class Firehose(BaseEventTrigger):
    """Yields events as fast as they commit, each advancing the watermark."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"name": self.name}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        n = 0
        while True:
            n += 1
            yield TriggerEvent({"n": n}, state={"watermark": n})


@dataclass
class Plan:
    """An open-loop schedule: ``watchers`` emitters, each every ``period`` s, phases staggered.

    The latency of an event is the time its commit was observed minus the time it was
    *scheduled* (not the time it was produced), so a system that falls behind is charged for
    the queueing too. Only events scheduled in ``[start, end)`` are recorded.
    """

    watchers: int
    period: float
    t0: float
    start: float
    end: float
    latencies: list[float] = field(default_factory=list)
    committed_in_window: int = 0
    """Commits observed in ``[start, end)``, whatever their schedule: the rate sustained."""
    passed: set[int] = field(default_factory=set)
    caught_up: anyio.Event = field(default_factory=anyio.Event)
    """Set once every emitter has committed an event scheduled at or after ``end``."""

    def first(self, index: int) -> float:
        return self.t0 + self.period * index / self.watchers

    def record(self, index: int, scheduled: float, committed: float) -> None:
        if self.start <= committed < self.end:
            self.committed_in_window += 1
        if self.start <= scheduled < self.end:
            self.latencies.append(committed - scheduled)
        elif scheduled >= self.end and index not in self.passed:
            self.passed.add(index)
            if len(self.passed) == self.watchers:
                self.caught_up.set()

    def expected(self) -> int:
        """How many events the schedule places in ``[start, end)`` (same float steps as the
        emitters take, so the boundaries agree)."""
        count = 0
        for index in range(self.watchers):
            t = self.first(index)
            while t < self.end:
                if t >= self.start:
                    count += 1
                t += self.period
        return count


class Paced(BaseEventTrigger):
    """Emits on the schedule of a :class:`Plan`; records each event's latency after ``yield``.

    The generator resumes only once its event has committed, so the time ``yield`` returns is
    the commit-observed time.
    """

    def __init__(self, plan: str, index: int) -> None:
        super().__init__()
        self.plan = plan
        self.index = index

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"plan": self.plan, "index": self.index}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        plan = PLANS[self.plan]
        index = self.index
        scheduled = plan.first(index)
        k = 0
        while True:
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            k += 1
            yield TriggerEvent({"scheduled": scheduled}, state={"watermark": k})
            plan.record(index, scheduled, time.perf_counter())
            scheduled += plan.period


async def paced_producer(plan: Plan, index: int, asset_id: int, submit: Submit) -> None:
    """The raw pipeline's counterpart of :class:`Paced`."""
    scheduled = plan.first(index)
    k = 0
    name = f"a{index}"
    while True:
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await anyio.sleep(delay)
        k += 1
        await submit(asset_id, name, json.dumps({"scheduled": scheduled}), k)
        plan.record(index, scheduled, time.perf_counter())
        scheduled += plan.period


async def firehose_producer(index: int, asset_id: int, submit: Submit) -> None:
    """The raw pipeline's counterpart of :class:`Firehose`."""
    n = 0
    name = f"a{index}"
    while True:
        n += 1
        await submit(asset_id, name, json.dumps({"n": n}), n)


async def commit_firehose(index: int, backend: BaseStateBackend) -> None:
    """Between the two: ``backend.events.acommit`` called from a bare task, no runtime around it.

    It does what the supervisor does for each event minus the trigger, its validation and its
    supervision: build an :class:`EventCommit` (payload and watermark as JSON text) and await it.
    """
    n = 0
    watcher, assets, writer = f"w{index}", (f"a{index}",), Writer("watcher", f"w{index}")
    while True:
        n += 1
        commit = EventCommit(
            watcher, assets, json.dumps({"n": n}), None, {"watermark": str(n)}, writer
        )
        await backend.events.acommit(commit)


# -- the databases: a fresh one per measurement, and an observer beside the writer -------------


class Database:
    """A fresh SQLite file or PostgreSQL schema, and read-only queries on it."""

    def __init__(self, kind: str, path: Path | None, dsn: str | None, schema: str | None) -> None:
        self.kind = kind
        self.path = path
        self.dsn = dsn
        self.schema = schema
        self._sqlite: sqlite3.Connection | None = None
        self._pg: asyncpg.Connection | None = None

    @property
    def prefix(self) -> str:
        return f'"{self.schema}".' if self.schema else ""

    def backend(self) -> BaseStateBackend:
        if self.kind == "sqlite":
            assert self.path is not None
            return SqliteStateBackend(self.path)
        assert self.dsn is not None
        return PostgresStateBackend(self.dsn, schema=self.schema)

    async def scalar(self, sql: str) -> Any:
        """One value, read beside the writer (WAL reader, or another PostgreSQL session)."""
        if self.kind == "sqlite":
            if self._sqlite is None:
                assert self.path is not None
                self._sqlite = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False
                )
            conn = self._sqlite
            return await anyio.to_thread.run_sync(lambda: conn.execute(sql).fetchone()[0])
        if self._pg is None:
            self._pg = await asyncpg.connect(self.dsn)
        return await self._pg.fetchval(sql)

    async def last_event_id(self) -> int:
        found = await self.scalar(f"SELECT max(id) FROM {self.prefix}asset_events")
        return int(found or 0)

    async def consistency(self) -> dict[str, int]:
        """Committed events, and the sum of the watermarks (equal when each commit kept both)."""
        events = await self.scalar(f"SELECT count(*) FROM {self.prefix}asset_events")
        cast = "bigint" if self.kind == "postgres" else "INTEGER"
        marks = await self.scalar(
            f"SELECT coalesce(sum(CAST(value AS {cast})), 0) FROM {self.prefix}asset_state "
            "WHERE key = 'watermark'"
        )
        return {"events": int(events), "watermark_sum": int(marks)}

    async def aclose(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None
        if self._pg is not None:
            await self._pg.close()
            self._pg = None


@asynccontextmanager
async def open_database(kind: str, tmp: Path, dsn: str) -> AsyncIterator[Database]:
    """A fresh database of ``kind`` ("sqlite" or "postgres"), dropped on exit."""
    tag = uuid.uuid4().hex[:10]
    if kind == "sqlite":
        db = Database(kind, tmp / f"bench-{tag}.db", None, None)
    else:
        db = Database(kind, None, dsn, f"wk_bench_{tag}")
    try:
        yield db
    finally:
        with anyio.move_on_after(30, shield=True):
            await db.aclose()
            if kind == "postgres":
                conn = await asyncpg.connect(dsn)
                try:
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{db.schema}" CASCADE')
                finally:
                    await conn.close()
            else:
                assert db.path is not None
                for suffix in ("", "-wal", "-shm"):
                    await anyio.Path(f"{db.path}{suffix}").unlink(missing_ok=True)
