"""Where a :class:`~.sources.FakeEventSource` keeps its items: in memory, or in a SQLite file.

Both stores hold the same four things: the published items (sequence number, JSON payload,
acknowledged flag, delivery count), a FIFO of scripted faults, and a connection *generation*
that :meth:`~.sources.FakeEventSource.disconnect` bumps. The SQLite store lets a producer and a
consumer live in different processes; every call goes through aiosqlite, so the event loop
never blocks on the file.
"""

from __future__ import annotations

import abc
import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

__all__ = ["Fault", "MemorySourceStore", "Row", "SourceStore", "SqliteSourceStore"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Row:
    """One stored item: its sequence number, JSON text, ack flag and delivery count."""

    seq: int
    payload_json: str
    acked: bool
    deliveries: int


@dataclass(frozen=True, slots=True)
class Fault:
    """The head of the fault queue: ``remaining`` is the count still to apply."""

    fault_id: int
    kind: str
    remaining: int
    message: str | None


class SourceStore(abc.ABC):
    """The primitive operations a source handle is built on; each one is atomic."""

    address: str

    async def aopen(self) -> None:  # noqa: B027 - optional hook, empty by design
        """Connect (and create the tables); the memory store has nothing to do."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by design
        """Disconnect; the memory store has nothing to do."""

    @abc.abstractmethod
    async def publish(self, payloads: list[str], seq: int | None) -> list[int]:
        """Append ``payloads`` after the highest sequence number, or store one at ``seq``."""

    @abc.abstractmethod
    async def fetch(self, after: int, limit: int, *, unacked_only: bool) -> list[Row]:
        """Items with ``seq > after`` in order, at most ``limit``; counts one delivery each."""

    @abc.abstractmethod
    async def head(self) -> tuple[int, Fault | None]:
        """The current generation and the oldest pending fault."""

    @abc.abstractmethod
    async def consume_fault(self, fault_id: int, used: int) -> None:
        """Take ``used`` off a fault's remaining count; drop it when nothing remains."""

    @abc.abstractmethod
    async def add_fault(self, kind: str, count: int, message: str | None) -> None: ...

    @abc.abstractmethod
    async def bump_generation(self) -> int: ...

    @abc.abstractmethod
    async def ack(self, seq: int, generation: int) -> str:
        """Mark ``seq`` acknowledged unless the generation moved on since ``generation``.

        Returns ``"acked"``, ``"disconnected"`` (nothing written) or ``"unknown"`` (no item).
        """

    @abc.abstractmethod
    async def min_unacked(self) -> int | None: ...

    @abc.abstractmethod
    async def rows(self) -> list[Row]:
        """Every item, in sequence order."""

    async def wait_for_change(self, idle_for: int = 0) -> None:
        """Return once something may have changed (a publish, a fault, a disconnect).

        ``idle_for`` counts the waits since the last delivery: a file-backed store looks
        again after 1 ms, then backs off to 50 ms.
        """
        await anyio.sleep(min(0.001 * 2**idle_for, 0.05))


class MemorySourceStore(SourceStore):
    """Items in a dict; producer and consumer share it inside one process."""

    def __init__(self, name: str) -> None:
        self.address = f"memory://{name}"
        self._items: dict[int, list[Any]] = {}  # seq -> [payload_json, acked, deliveries]
        self._faults: list[list[Any]] = []  # [fault_id, kind, remaining, message]
        self._next_fault_id = 1
        self._generation = 0
        self._waiters: list[anyio.Event] = []

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()

    async def wait_for_change(self, idle_for: int = 0) -> None:
        event = anyio.Event()
        self._waiters.append(event)
        try:
            await event.wait()
        finally:
            if event in self._waiters:
                self._waiters.remove(event)

    async def publish(self, payloads: list[str], seq: int | None) -> list[int]:
        if seq is not None:
            if seq in self._items:
                raise ValueError(f"seq {seq} is already published in {self.address}")
            self._items[seq] = [payloads[0], False, 0]
            self._notify()
            return [seq]
        start = max(self._items, default=0) + 1
        seqs = list(range(start, start + len(payloads)))
        for number, payload in zip(seqs, payloads, strict=True):
            self._items[number] = [payload, False, 0]
        self._notify()
        return seqs

    async def fetch(self, after: int, limit: int, *, unacked_only: bool) -> list[Row]:
        rows: list[Row] = []
        for seq in sorted(s for s in self._items if s > after):
            item = self._items[seq]
            if unacked_only and item[1]:
                continue
            item[2] += 1
            rows.append(Row(seq, item[0], item[1], item[2]))
            if len(rows) >= limit:
                break
        return rows

    async def head(self) -> tuple[int, Fault | None]:
        if not self._faults:
            return self._generation, None
        fault_id, kind, remaining, message = self._faults[0]
        return self._generation, Fault(fault_id, kind, remaining, message)

    async def consume_fault(self, fault_id: int, used: int) -> None:
        for index, fault in enumerate(self._faults):
            if fault[0] == fault_id:
                fault[2] -= used
                if fault[2] <= 0:
                    del self._faults[index]
                return

    async def add_fault(self, kind: str, count: int, message: str | None) -> None:
        self._faults.append([self._next_fault_id, kind, count, message])
        self._next_fault_id += 1
        self._notify()

    async def bump_generation(self) -> int:
        self._generation += 1
        self._notify()
        return self._generation

    async def ack(self, seq: int, generation: int) -> str:
        if generation != self._generation:
            return "disconnected"
        item = self._items.get(seq)
        if item is None:
            return "unknown"
        item[1] = True
        return "acked"

    async def min_unacked(self) -> int | None:
        return min((s for s, item in self._items.items() if not item[1]), default=None)

    async def rows(self) -> list[Row]:
        return [Row(s, i[0], i[1], i[2]) for s, i in sorted(self._items.items())]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS wk_source_items (
    seq INTEGER PRIMARY KEY,
    payload TEXT NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0,
    deliveries INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS wk_source_faults (
    fault_id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    remaining INTEGER NOT NULL,
    message TEXT
);
CREATE TABLE IF NOT EXISTS wk_source_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO wk_source_meta (key, value) VALUES ('generation', 0);
"""


class SqliteSourceStore(SourceStore):
    """Items in a SQLite file (WAL mode), so another process can publish or consume.

    Each operation runs, whole, in a worker thread (one at a time per handle), so a
    transaction never spans two hops and the event loop never waits on the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.address = f"sqlite:///{path}"
        self._db: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def aopen(self) -> None:
        self._db = await self._call(self._open)

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout = 30000")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")
        except BaseException:
            db.close()
            raise
        return db

    async def aclose(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await self._call(db.close)

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"{self.address} is not open")
        return self._db

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- the operations, each run in the worker thread -------------------------------------------

    def _publish(self, payloads: list[str], seq: int | None) -> list[int]:
        try:
            with self._transaction() as db:
                if seq is not None:
                    seqs = [seq]
                else:
                    (top,) = db.execute(
                        "SELECT COALESCE(MAX(seq), 0) FROM wk_source_items"
                    ).fetchone()
                    seqs = list(range(int(top) + 1, int(top) + 1 + len(payloads)))
                db.executemany(
                    "INSERT INTO wk_source_items (seq, payload) VALUES (?, ?)",
                    list(zip(seqs, payloads, strict=True)),
                )
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"seq {seq} is already published in {self.address}") from exc
        return seqs

    def _fetch(self, after: int, limit: int, unacked_only: bool) -> list[Row]:
        where = "seq > ? AND acked = 0" if unacked_only else "seq > ?"
        query = (
            f"SELECT seq, payload, acked, deliveries FROM wk_source_items "
            f"WHERE {where} ORDER BY seq LIMIT ?"
        )
        if not self.db.execute(query, (after, 1)).fetchone():
            return []  # nothing new: no write transaction for an idle consumer
        with self._transaction() as db:
            found = db.execute(query, (after, limit)).fetchall()
            if found:
                db.executemany(
                    "UPDATE wk_source_items SET deliveries = deliveries + 1 WHERE seq = ?",
                    [(r[0],) for r in found],
                )
        return [Row(int(r[0]), str(r[1]), bool(r[2]), int(r[3]) + 1) for r in found]

    def _head(self) -> tuple[int, Fault | None]:
        row = self.db.execute(
            "SELECT m.value, f.fault_id, f.kind, f.remaining, f.message "
            "FROM wk_source_meta AS m LEFT JOIN "
            "(SELECT * FROM wk_source_faults ORDER BY fault_id LIMIT 1) AS f "
            "WHERE m.key = 'generation'"
        ).fetchone()
        if row is None:
            return 0, None
        if row[1] is None:
            return int(row[0]), None
        return int(row[0]), Fault(int(row[1]), str(row[2]), int(row[3]), row[4])

    def _consume_fault(self, fault_id: int, used: int) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE wk_source_faults SET remaining = remaining - ? WHERE fault_id = ?",
                (used, fault_id),
            )
            db.execute("DELETE FROM wk_source_faults WHERE remaining <= 0")

    def _add_fault(self, kind: str, count: int, message: str | None) -> None:
        self.db.execute(
            "INSERT INTO wk_source_faults (kind, remaining, message) VALUES (?, ?, ?)",
            (kind, count, message),
        )

    def _bump_generation(self) -> int:
        with self._transaction() as db:
            db.execute("UPDATE wk_source_meta SET value = value + 1 WHERE key = 'generation'")
            (generation,) = db.execute(
                "SELECT value FROM wk_source_meta WHERE key = 'generation'"
            ).fetchone()
        return int(generation)

    def _ack(self, seq: int, generation: int) -> str:
        with self._transaction() as db:
            (current,) = db.execute(
                "SELECT value FROM wk_source_meta WHERE key = 'generation'"
            ).fetchone()
            if int(current) != generation:
                return "disconnected"
            changed = db.execute(
                "UPDATE wk_source_items SET acked = 1 WHERE seq = ?", (seq,)
            ).rowcount
        return "acked" if changed else "unknown"

    def _min_unacked(self) -> int | None:
        (oldest,) = self.db.execute(
            "SELECT MIN(seq) FROM wk_source_items WHERE acked = 0"
        ).fetchone()
        return None if oldest is None else int(oldest)

    def _rows(self) -> list[Row]:
        found = self.db.execute(
            "SELECT seq, payload, acked, deliveries FROM wk_source_items ORDER BY seq"
        ).fetchall()
        return [Row(int(r[0]), str(r[1]), bool(r[2]), int(r[3])) for r in found]

    # -- the SourceStore interface ---------------------------------------------------------------

    async def publish(self, payloads: list[str], seq: int | None) -> list[int]:
        return await self._call(self._publish, payloads, seq)

    async def fetch(self, after: int, limit: int, *, unacked_only: bool) -> list[Row]:
        return await self._call(self._fetch, after, limit, unacked_only)

    async def head(self) -> tuple[int, Fault | None]:
        return await self._call(self._head)

    async def consume_fault(self, fault_id: int, used: int) -> None:
        await self._call(self._consume_fault, fault_id, used)

    async def add_fault(self, kind: str, count: int, message: str | None) -> None:
        await self._call(self._add_fault, kind, count, message)

    async def bump_generation(self) -> int:
        return await self._call(self._bump_generation)

    async def ack(self, seq: int, generation: int) -> str:
        return await self._call(self._ack, seq, generation)

    async def min_unacked(self) -> int | None:
        return await self._call(self._min_unacked)

    async def rows(self) -> list[Row]:
        return await self._call(self._rows)
