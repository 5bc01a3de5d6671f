"""The broker kill test's machinery: a real broker, a real daemon, SIGKILLs, then raw SQL.

One :class:`BrokerChaos` drives one push source (NATS JetStream, RabbitMQ or MQTT) end to
end: it writes a watchers path with one ready-made broker watcher on one asset, and, while a
publisher sends the ``items`` messages into the broker (never more than ``window`` ahead of
the events committed), starts ``watchkeeper triggerer`` (SQLite state) again and again,
SIGKILLing it each time once it committed a random number of new events. After ``kills``
lives a last daemon drains the rest and is stopped with SIGTERM. The events are then read
with plain ``sqlite3`` from the daemon's database and compared with the ids published: every
id must be there exactly once.

The daemon logs at debug level, so each redelivery that the ``dedup_key`` suppressed shows
in the log (``event_deduplicated`` for a message committed alone, ``batch_deduplicated`` and
``batch_partly_deduplicated`` with a count for a batch): their sum is the ``redelivered``
figure.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import textwrap
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import Process

from tests.chaos._chaos import daemon_env, log_tail, start_daemon
from tests.support.brokers import suppressed_count
from tests.support.daemons import reap

POLL = 0.05
"""Seconds between two looks at the daemon's progress."""
_BATCH = 50
"""Messages the publisher sends at a time."""
ASSET = "chaos-broker"

Publish = Callable[[list[int]], Coroutine[Any, Any, None]]
"""Publishes the messages ``{"id": "c-<n>", "n": n}`` of the given numbers, in order."""


@dataclass(frozen=True, slots=True)
class BrokerPlan:
    """How hard to shake: the messages, the SIGKILLs, the time a round may take."""

    items: int = 5_000
    kills: int = 10
    seed: int = 0
    round_timeout: float = 120.0
    settle: float = 10.0
    """Seconds without a new event after which a daemon's life ends anyway (messages lost)."""
    window: int = 500
    """At most this many messages published and not yet committed."""


@dataclass(slots=True)
class BrokerResult:
    """What one broker's watcher committed across all the kills, read with raw SQL."""

    broker: str
    items: int
    kills: int
    numbers: list[int]
    redelivered: int

    @property
    def lost(self) -> int:
        return len(set(range(1, self.items + 1)) - set(self.numbers))

    @property
    def duplicated(self) -> int:
        return len(self.numbers) - len(set(self.numbers))

    def summary(self) -> str:
        return (
            f"chaos: broker={self.broker} kills={self.kills} messages={self.items} "
            f"events={len(self.numbers)} lost={self.lost} duplicated={self.duplicated} "
            f"redelivered={self.redelivered}"
        )


def message_number(payload: Any) -> int:
    """The ``n`` of a broker watcher's event: its message body's."""
    return int(payload["data"]["n"])


def committed_numbers(database: Path, number: Callable[[Any], int] = message_number) -> list[int]:
    """The ``n`` of every event of the chaos asset, in commit order, by plain SQL."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        rows = connection.execute(
            "SELECT payload FROM asset_events WHERE asset_name = ? ORDER BY id", (ASSET,)
        ).fetchall()
    return [number(json.loads(payload)) for (payload,) in rows]


def committed_count(database: Path) -> int:
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            (count,) = connection.execute(
                "SELECT count(*) FROM asset_events WHERE asset_name = ?", (ASSET,)
            ).fetchone()
    except sqlite3.OperationalError:
        return 0  # the daemon has not created its database yet
    return int(count)


class BrokerChaos:
    """Kill-test one broker watcher; ``watcher`` is its constructor call as Python source."""

    def __init__(
        self,
        broker: str,
        watcher: str,
        publish: Publish,
        work: Path,
        plan: BrokerPlan,
        watcher_name: str = "chaos",
        number: Callable[[Any], int] = message_number,
    ) -> None:
        self.broker = broker
        self.number = number
        self.watcher = watcher
        self.watcher_name = watcher_name
        self.publish = publish
        self.work = work
        self.plan = plan
        self.random = random.Random(plan.seed)
        self.database = work / "state.db"
        self.log_path = work / "daemon.log"
        self.kills = 0

    def _env(self) -> dict[str, str]:
        return daemon_env(f"sqlite:///{self.database}", debug=True)

    def _log_tail(self) -> str:
        return log_tail(self.log_path)

    async def _start(self, watchers: Path) -> Process:
        return await start_daemon(self.work, watchers, self._env(), self.log_path)

    async def _count(self) -> int:
        return await anyio.to_thread.run_sync(committed_count, self.database)

    def _check_alive(self, process: Process) -> None:
        if process.returncode is not None:
            raise RuntimeError(
                f"{self.broker}: the daemon exited with {process.returncode}:\n{self._log_tail()}"
            )

    async def _started(self, offset: int) -> bool:
        """True once the daemon started at log offset ``offset`` logged that it runs its
        watchers (on a loaded machine, starting takes seconds)."""

        def read() -> bool:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return b'"daemon_started"' in log.read()

        return await anyio.to_thread.run_sync(read)

    async def _wait_for(self, process: Process, target: int, offset: int) -> None:
        """Return once ``target`` events committed, or once nothing was committed for
        ``settle`` seconds after the daemon started (what is missing then was lost, and the
        result says how much). The daemon must stay alive meanwhile."""
        last, changed = -1, anyio.current_time()
        started = False
        with anyio.fail_after(self.plan.round_timeout):
            while True:
                self._check_alive(process)
                count = await self._count()
                if count >= target:
                    return
                if not started:
                    started = await self._started(offset)
                    changed = anyio.current_time()
                if count != last:
                    last, changed = count, anyio.current_time()
                elif anyio.current_time() - changed > self.plan.settle:
                    return
                await anyio.sleep(POLL)

    async def _publish_all(self) -> None:
        """Publish 1..items in small batches, never more than ``window`` ahead of the events
        committed: a broker's queue for an absent consumer is bounded (Mosquitto drops what
        is past ``max_queued_messages``, 1000 by default), and the test is about our crashes,
        not about that limit."""
        published = 0
        while published < self.plan.items:
            with anyio.fail_after(self.plan.round_timeout * 2):
                while True:
                    if published - await self._count() <= self.plan.window - _BATCH:
                        break
                    await anyio.sleep(POLL)
            batch = list(range(published + 1, min(published + _BATCH, self.plan.items) + 1))
            await self.publish(batch)
            published = batch[-1]

    async def _life(self, watchers: Path, final: bool) -> None:
        """One daemon life: SIGKILLed once it committed a random number of new events (up
        to two rounds' share of the stream), or, the last one, stopped with SIGTERM once
        everything committed."""
        done = await self._count()
        share = self.plan.items // (self.plan.kills + 1)
        target = (
            self.plan.items
            if final
            else min(self.plan.items - 1, done + self.random.randint(1, 2 * share))
        )
        offset = (await anyio.Path(self.log_path).stat()).st_size if self.log_path.exists() else 0
        process = await self._start(watchers)
        try:
            await self._wait_for(process, target, offset)
            if final:
                process.terminate()
                with anyio.fail_after(30):
                    await process.wait()
            else:
                process.send_signal(signal.SIGKILL)
                with anyio.fail_after(10):
                    await process.wait()
                self.kills += 1
        finally:
            await reap(process)

    async def run(self) -> BrokerResult:
        """Run the whole plan while the messages are published; return what was committed."""
        watchers = self.work / "watchers"
        await anyio.Path(watchers).mkdir(parents=True, exist_ok=True)
        definitions = textwrap.dedent(
            f"""
            from watchkeeper.triggerer import Asset, AssetWatcher
            from watchkeeper.watchers import *  # noqa: F403

            chaos = Asset({ASSET!r}, watchers=[AssetWatcher({self.watcher_name!r}, {self.watcher})])
            """
        )
        await anyio.Path(watchers / "definitions.py").write_text(definitions)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._publish_all)
            while self.kills < self.plan.kills:
                await self._life(watchers, final=False)
            await self._life(watchers, final=True)
        return await self._result()

    async def _result(self) -> BrokerResult:
        """What the lives committed: the numbers, in commit order, and how many redeliveries
        the daemons' log shows suppressed. A source with other numbers overrides it."""
        numbers = await anyio.to_thread.run_sync(committed_numbers, self.database, self.number)
        log = await anyio.Path(self.log_path).read_text(errors="replace")
        redelivered = suppressed_count(log_records(log))
        return BrokerResult(self.broker, self.plan.items, self.kills, numbers, redelivered)


def log_records(log: str) -> list[dict[str, object]]:
    """The JSON records of the daemons' shared log. A SIGKILL can cut the last line a daemon
    was writing; the next daemon's first record then follows it on the same line. The cut
    record is dropped, every whole one is kept."""
    decoder = json.JSONDecoder()
    records: list[dict[str, object]] = []
    for line in log.splitlines():
        at = line.find("{")
        while at != -1:
            try:
                record, end = decoder.raw_decode(line, at)
            except json.JSONDecodeError:
                at = line.find("{", at + 1)  # a cut record: look for the next one
                continue
            if isinstance(record, dict):
                records.append(record)
            at = line.find("{", end)
    return records
