"""The kill test's machinery: feed sources, run ``watchkeeper triggerer``, SIGKILL it, repeat.

One :class:`ChaosRun` drives one backend. It writes a watchers path with three watchers, one
per pattern (see ``chaos_watchers.py``), each on its own asset and its own cross-process
:class:`~watchkeeper.triggerer.testing.FakeEventSource` (a SQLite file). Then, ``kills`` times:
it publishes the next chunk of the stream into every source, starts the daemon, and SIGKILLs
it at a random point of the work still pending (a random number of new events of the ``state``
watcher), or at once when the Airflow-style watcher signals that it stopped right after its
``aset`` (its pause points). A last daemon drains what is left and is stopped with SIGTERM.
The asset events then committed per asset are compared with the items published into its
source. The results are read with the drivers themselves (``sqlite3``, ``asyncpg``: see
:class:`RawStore`), not through watchkeeper's API, so a bug in the product's read path cannot
hide a lost or duplicated event; the sources' SQLite files are read the same way.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.to_thread
from anyio.abc import Process
from watchkeeper.store import AssetEvent, AssetScope
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer.testing import FakeEventSource

from tests.support.daemons import reap

PATTERNS = ("state", "dedup", "airflow")
"""Watcher patterns: state= watermark, dedup_key on a redelivering queue, Airflow's aset+yield."""

WATCHERS_MODULE = Path(__file__).with_name("chaos_watchers.py")
POLL = 0.01
"""Seconds between two looks at the daemon's progress."""
ACK_EVERY = 25
"""The queue watcher acknowledges its committed messages this many at a time, so a kill
leaves committed messages unacknowledged: redeliveries that dedup_key has to suppress."""


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    """How hard to shake: the stream length, the SIGKILLs, the Airflow pause points."""

    items: int = 10_000
    kills: int = 20
    pauses: int = 4
    seed: int = 0
    round_timeout: float = 120.0
    """Seconds a round may take before the test fails (a hung daemon, not a slow one)."""

    def chunks(self) -> list[int]:
        """How many items to publish before each of the ``kills + 1`` daemon starts."""
        rounds = self.kills + 1
        base, extra = divmod(self.items, rounds)
        return [base + (1 if i < extra else 0) for i in range(rounds)]

    def pause_at(self) -> list[int]:
        """The Airflow watcher's pause points, spread over the first half of the stream (so
        the killing rounds, not the final drain, reach them)."""
        step = self.items // (2 * self.pauses)
        return [step * k for k in range(1, self.pauses + 1)]


@dataclass(slots=True)
class PatternResult:
    """What one watcher committed across all the kills, read with raw SQL."""

    backend: str
    pattern: str
    items: int
    kills: int
    published: list[int]
    """The ids published into the watcher's source, read from the source's file."""
    seqs: list[int]
    """The ``seq`` of each committed event of the watcher's asset, in commit order."""
    watermark: Any
    pause_kills: int = 0
    """Kills at an Airflow pause point (right after its ``aset``)."""
    redelivered: int | None = None
    """Items the queue delivered more than once (the dedup pattern's source)."""
    redelivered_after_commit: int | None = None
    """Of those, items whose event had committed before the kill that made the queue deliver
    them again: the duplicates that ``dedup_key`` had to suppress."""

    @property
    def lost(self) -> int:
        return len(set(self.published) - set(self.seqs))

    @property
    def duplicated(self) -> int:
        return len(self.seqs) - len(set(self.seqs))

    def summary(self) -> str:
        line = (
            f"chaos: backend={self.backend} pattern={self.pattern} kills={self.kills} "
            f"items={self.items} events={len(self.seqs)} lost={self.lost} "
            f"duplicated={self.duplicated}"
        )
        if self.redelivered is not None:
            line += f" redelivered={self.redelivered}"
        if self.redelivered_after_commit is not None:
            line += f" redelivered_after_commit={self.redelivered_after_commit}"
        return line


class RawStore(Protocol):
    """The daemon's database read with its driver, bypassing watchkeeper's own API."""

    async def seqs(self, asset: str) -> list[int]:
        """The ``seq`` of each committed event of ``asset``, in commit order."""
        ...

    async def watermark(self, asset: str) -> Any:
        """The asset's committed ``watermark`` value, or None."""
        ...


_EVENTS_SQL = "SELECT payload FROM asset_events WHERE asset_name = {0} ORDER BY id"
_WATERMARK_SQL = (
    "SELECT s.value FROM asset_state s JOIN assets a ON a.id = s.asset_id "
    "WHERE a.name = {0} AND s.key = 'watermark'"
)


def _sqlite_rows(path: Path, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    """One query on a fresh sqlite3 connection (blocking: call it in a thread)."""
    with closing(sqlite3.connect(path, timeout=30)) as db:
        return db.execute(sql, params).fetchall()


class SqliteRaw:
    """:class:`RawStore` over the daemon's SQLite file, with :mod:`sqlite3`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def seqs(self, asset: str) -> list[int]:
        rows = await anyio.to_thread.run_sync(
            _sqlite_rows, self.path, _EVENTS_SQL.format("?"), (asset,)
        )
        return [int(json.loads(payload)["seq"]) for (payload,) in rows]

    async def watermark(self, asset: str) -> Any:
        rows = await anyio.to_thread.run_sync(
            _sqlite_rows, self.path, _WATERMARK_SQL.format("?"), (asset,)
        )
        return json.loads(rows[0][0]) if rows else None


class PostgresRaw:
    """:class:`RawStore` over the daemon's PostgreSQL database, with asyncpg."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    async def _fetch(self, sql: str, *args: object) -> list[Any]:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    async def seqs(self, asset: str) -> list[int]:
        rows = await self._fetch(_EVENTS_SQL.format("$1"), asset)
        return [int(json.loads(row["payload"])["seq"]) for row in rows]

    async def watermark(self, asset: str) -> Any:
        rows = await self._fetch(_WATERMARK_SQL.format("$1"), asset)
        return json.loads(rows[0]["value"]) if rows else None


async def source_seqs(path: Path, where: str = "1") -> list[int]:
    """The ids of a FakeEventSource file's items matching ``where``, read with sqlite3."""
    sql = f"SELECT seq FROM wk_source_items WHERE {where} ORDER BY seq"
    return [int(seq) for (seq,) in await anyio.to_thread.run_sync(_sqlite_rows, path, sql)]


def daemon_command() -> list[str]:
    """The installed ``watchkeeper`` script of this interpreter's environment."""
    script = shutil.which("watchkeeper", path=str(Path(sys.executable).parent))
    if script is not None:
        return [script, "triggerer"]
    return [sys.executable, "-c", "from watchkeeper.triggerer.cli import main; main()", "triggerer"]


def daemon_env(url: str, *, debug: bool = False) -> dict[str, str]:
    """The environment of a chaos daemon on ``url``: fast restarts and heartbeats, JSON logs
    (``debug`` logs the deduplicated redeliveries too), no inherited WATCHKEEPER__ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        {
            "WATCHKEEPER__DATABASE__URL": url,
            "WATCHKEEPER__TRIGGERER__GC_INTERVAL": "0",
            "WATCHKEEPER__TRIGGERER__BACKOFF_INITIAL": "0.05",
            "WATCHKEEPER__TRIGGERER__BACKOFF_MAX": "0.5",
            "WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL": "0.5",
            "WATCHKEEPER__TRIGGERER__STOP_GRACE": "5",
            "WATCHKEEPER__LOGGING__FORMAT": "json",
        }
    )
    if debug:
        env["WATCHKEEPER__LOGGING__LEVEL"] = "debug"
    return env


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The last ``lines`` of a chaos daemon's log, for a failure message."""
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no daemon log)"
    return "\n".join(text.splitlines()[-lines:])


async def start_daemon(
    work: Path, watchers: Path, env: dict[str, str], log_path: Path
) -> anyio.abc.Process:
    """A ``watchkeeper triggerer`` on ``watchers``, its output appended to ``log_path``."""
    log = await anyio.to_thread.run_sync(lambda: log_path.open("ab"))
    try:
        return await anyio.open_process(
            [*daemon_command(), "--watchers-path", str(watchers)],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    finally:
        log.close()


def _definitions(sources: dict[str, FakeEventSource], pause_dir: Path, pause_at: list[int]) -> str:
    return textwrap.dedent(
        f"""
        from chaos_watchers import PollWatcher, QueueWatcher
        from watchkeeper.triggerer import Asset, AssetWatcher

        state = Asset(
            "chaos-state",
            watchers=[AssetWatcher("state", PollWatcher({sources["state"].address!r}))],
        )
        dedup = Asset(
            "chaos-dedup",
            watchers=[
                AssetWatcher(
                    "dedup", QueueWatcher({sources["dedup"].address!r}, ack_every={ACK_EVERY})
                )
            ],
        )
        airflow = Asset(
            "chaos-airflow",
            watchers=[
                AssetWatcher(
                    "airflow",
                    PollWatcher(
                        {sources["airflow"].address!r},
                        pattern="airflow",
                        pause_dir={str(pause_dir)!r},
                        pause_at={pause_at!r},
                    ),
                )
            ],
        )
        """
    )


@dataclass(slots=True)
class _Progress:
    """Events seen so far per asset, read incrementally from the backend."""

    last_id: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATTERNS, 0))

    async def refresh(self, backend: BaseStateBackend) -> None:
        events: list[AssetEvent] = await backend.events.alist_events(since_id=self.last_id)
        for event in events:
            pattern = event.asset.removeprefix("chaos-")
            if pattern in self.counts:
                self.counts[pattern] += 1
            self.last_id = max(self.last_id, event.id)


class ChaosRun:
    """Kill-test one backend; ``open_backend`` builds an unopened backend on the same data."""

    def __init__(
        self,
        name: str,
        url: str,
        open_backend: Callable[[], BaseStateBackend],
        raw: RawStore,
        work: Path,
        plan: ChaosPlan,
    ) -> None:
        self.name = name
        self.url = url
        self.open_backend = open_backend
        self.raw = raw
        self.work = work
        self.plan = plan
        self.random = random.Random(plan.seed)
        self.pause_dir = work / "pauses"
        self.log_path = work / "daemon.log"
        self.kills = 0
        """SIGKILLs sent so far."""
        self.pause_kills = 0
        """Of which at an Airflow pause point (right after its aset)."""
        self.redelivered_after_commit: set[int] = set()
        """Queue items unacknowledged at a kill although their event had committed."""

    def _env(self) -> dict[str, str]:
        return daemon_env(self.url)

    def _log_tail(self) -> str:
        return log_tail(self.log_path)

    async def _start(self, watchers: Path) -> anyio.abc.Process:
        return await start_daemon(self.work, watchers, self._env(), self.log_path)

    async def _paused(self) -> list[anyio.Path]:
        return [path async for path in anyio.Path(self.pause_dir).glob("*.paused")]

    async def _kill(self, process: Process) -> None:
        process.send_signal(signal.SIGKILL)
        with anyio.fail_after(10):
            await process.wait()
        self.kills += 1
        # The queue will deliver its unacknowledged items again; those whose event is already
        # committed are the redeliveries that dedup_key must suppress.
        unacked = await source_seqs(self._source_path("dedup"), "acked = 0")
        committed = set(await self.raw.seqs("chaos-dedup"))
        self.redelivered_after_commit.update(seq for seq in unacked if seq in committed)
        for flag in await self._paused():
            await flag.rename(flag.with_suffix(".done"))

    def _check_alive(self, process: Process) -> None:
        if process.returncode is not None:
            raise RuntimeError(
                f"{self.name}: the daemon exited with {process.returncode}:\n{self._log_tail()}"
            )

    async def _kill_at_random(
        self, process: Process, backend: BaseStateBackend, progress: _Progress, published: int
    ) -> None:
        """SIGKILL once the state watcher did a random part of its pending work, or at a pause."""
        pending = max(1, published - progress.counts["state"])
        target = progress.counts["state"] + self.random.randint(1, pending)
        with anyio.fail_after(self.plan.round_timeout):
            while True:
                self._check_alive(process)
                if await self._paused():
                    self.pause_kills += 1
                    break
                await progress.refresh(backend)
                if progress.counts["state"] >= target:
                    break
                await anyio.sleep(POLL)
        await self._kill(process)

    async def _drain(self, process: Process, backend: BaseStateBackend) -> bool:
        """Wait until every watcher caught up with the whole stream, then SIGTERM (True).

        An Airflow pause point reached on the way is killed like in the other rounds (False).
        """
        scopes = [AssetScope(name=f"chaos-{p}") for p in PATTERNS]
        with anyio.fail_after(self.plan.round_timeout):
            while True:
                self._check_alive(process)
                if await self._paused():
                    self.pause_kills += 1
                    await self._kill(process)
                    return False
                marks = [await backend.aget(scope, "watermark") for scope in scopes]
                if all(mark == self.plan.items for mark in marks):
                    break
                await anyio.sleep(POLL * 4)
        process.terminate()
        with anyio.fail_after(30):
            await process.wait()
        return True

    async def _round(
        self, watchers: Path, backend: BaseStateBackend, progress: _Progress, published: int
    ) -> bool:
        """One daemon life; True once the stream is drained and the daemon stopped cleanly."""
        process = await self._start(watchers)
        try:
            if self.kills < self.plan.kills:
                await self._kill_at_random(process, backend, progress, published)
                return False
            return await self._drain(process, backend)
        finally:
            await reap(process)

    def _source_path(self, pattern: str) -> Path:
        return self.work / f"source-{pattern}.db"

    async def run(self) -> dict[str, PatternResult]:
        """Run the whole plan; return the result of each pattern."""
        watchers = self.work / "watchers"
        await anyio.Path(watchers).mkdir(parents=True, exist_ok=True)
        await anyio.Path(self.pause_dir).mkdir(exist_ok=True)
        sources = {p: FakeEventSource.at(self._source_path(p)) for p in PATTERNS}
        await anyio.Path(watchers / "chaos_watchers.py").write_text(
            await anyio.Path(WATCHERS_MODULE).read_text()
        )
        await anyio.Path(watchers / "definitions.py").write_text(
            _definitions(sources, self.pause_dir, self.plan.pause_at())
        )
        progress = _Progress()
        chunks = self.plan.chunks()
        published = 0
        async with self.open_backend() as backend:
            for source in sources.values():
                await source.__aenter__()
            try:
                drained = False
                while not drained:
                    if chunks:
                        chunk = chunks.pop(0)
                        payloads = [{"n": published + i} for i in range(1, chunk + 1)]
                        for source in sources.values():
                            await source.publish(*payloads)
                        published += chunk
                    drained = await self._round(watchers, backend, progress, published)
            finally:
                for source in sources.values():
                    await source.aclose()
        return {p: await self._result(p) for p in PATTERNS}

    async def _result(self, pattern: str) -> PatternResult:
        """The pattern's outcome, read with raw SQL from the database and the source file."""
        asset = f"chaos-{pattern}"
        source = self._source_path(pattern)
        redelivered: int | None = None
        after_commit: int | None = None
        if pattern == "dedup":
            redelivered = len(await source_seqs(source, "deliveries > 1"))
            after_commit = len(self.redelivered_after_commit)
        return PatternResult(
            backend=self.name,
            pattern=pattern,
            items=self.plan.items,
            kills=self.kills,
            published=await source_seqs(source),
            seqs=await self.raw.seqs(asset),
            watermark=await self.raw.watermark(asset),
            pause_kills=self.pause_kills if pattern == "airflow" else 0,
            redelivered=redelivered,
            redelivered_after_commit=after_commit,
        )


def iter_lines(results: dict[str, PatternResult]) -> Iterator[str]:
    for pattern in PATTERNS:
        yield results[pattern].summary()
