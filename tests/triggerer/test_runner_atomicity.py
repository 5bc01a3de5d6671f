"""The runner commits each event and the state it carries in one transaction: no split commit.

The crash tests show this only when a kill lands between two commits. Here the database is
watched without any crash: the backend is a real SQLite or PostgreSQL backend whose write hooks
(``acommit_event``, ``_aput``, ``_adelete``, ``_aclear``) are wrapped so that, each time a
write has returned (it is committed), a second connection of its own (``sqlite3`` /
``asyncpg``) reads the committed events and watermarks in one read transaction. A runner that
wrote the watermark and the event in two transactions, in either order, leaves a committed
moment where they disagree, and the observation right after the first of the two sees it. On
PostgreSQL the observer also compares the ``xmin`` (the writing transaction) of an asset's last
event with that of its watermark row.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
import pytest
from watchkeeper.store import (
    Asset,
    AssetEvent,
    PostgresStateBackend,
    SqliteStateBackend,
    StateScope,
)
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, Put, Writer
from watchkeeper.triggerer import TriggerEvent, TriggerRunner, WatchSpec

from tests.support.runtime import FAST, Scripted

ALSO_ON_UVLOOP = True  # the runner on asyncio's loop and on uvloop (see tests/conftest.py)
ORDERS = Asset("orders")
USERS = Asset("users")
WATERMARK = "wm"
EVENTS = 25
"""Events each trigger yields, each carrying ``{WATERMARK: its seq}``."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What another connection saw committed right after one write of the backend returned."""

    write: str
    seqs: dict[str, list[int]]
    """Per asset, the ``seq`` of its committed events in commit order."""
    watermarks: dict[str, Any]
    same_transaction: dict[str, bool] = field(default_factory=dict)
    """PostgreSQL: per asset, whether its last event and its watermark row share an xmin."""

    def problems(self) -> list[str]:
        """How this moment breaks "event n and watermark n commit together"."""
        found = []
        for asset, seqs in self.seqs.items():
            expected = seqs[-1] if seqs else None
            watermark = self.watermarks.get(asset)
            if seqs != list(range(1, len(seqs) + 1)) or watermark != expected:
                found.append(f"after {self.write}: {asset} events {seqs} but watermark {watermark}")
        for asset, same in self.same_transaction.items():
            if not same:
                found.append(
                    f"after {self.write}: {asset}'s last event and watermark come from two "
                    "transactions"
                )
        return found


class Observer(Protocol):
    async def snapshot(self, write: str) -> Snapshot: ...


class SqliteObserver:
    """Reads the SQLite file through a connection of its own, in one read transaction."""

    def __init__(self, path: Path, assets: Sequence[str]) -> None:
        self.path = path
        self.assets = list(assets)

    def _read(self, write: str) -> Snapshot:
        marks = ",".join("?" * len(self.assets))
        with closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)) as db:
            db.execute("BEGIN")  # both reads from one snapshot of the WAL
            events = db.execute(
                f"SELECT asset_name, payload FROM asset_events WHERE asset_name IN ({marks}) "
                "ORDER BY id",
                self.assets,
            ).fetchall()
            states = db.execute(
                "SELECT a.name, s.value FROM assets a JOIN asset_state s ON s.asset_id = a.id "
                f"WHERE s.key = ? AND a.name IN ({marks})",
                [WATERMARK, *self.assets],
            ).fetchall()
            db.execute("COMMIT")
        seqs: dict[str, list[int]] = {asset: [] for asset in self.assets}
        for asset, payload in events:
            seqs[asset].append(json.loads(payload)["seq"])
        return Snapshot(write, seqs, {asset: json.loads(value) for asset, value in states})

    async def snapshot(self, write: str) -> Snapshot:
        return await anyio.to_thread.run_sync(self._read, write)


class PostgresObserver:
    """Reads the schema through an asyncpg connection of its own, in one read transaction."""

    def __init__(self, conn: Any, schema: str, assets: Sequence[str]) -> None:
        self.conn = conn
        self.schema = schema
        self.assets = list(assets)
        self._lock = anyio.Lock()  # one connection: one look at a time

    async def snapshot(self, write: str) -> Snapshot:
        s = self.schema
        async with (
            self._lock,
            self.conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            events = await self.conn.fetch(
                f'SELECT asset_name, payload, xmin::text AS xact FROM "{s}".asset_events '
                "WHERE asset_name = ANY($1::text[]) ORDER BY id",
                self.assets,
            )
            states = await self.conn.fetch(
                f'SELECT a.name, st.value, st.xmin::text AS xact FROM "{s}".assets a '
                f'JOIN "{s}".asset_state st ON st.asset_id = a.id '
                "WHERE st.key = $1 AND a.name = ANY($2::text[])",
                WATERMARK,
                self.assets,
            )
        seqs: dict[str, list[int]] = {asset: [] for asset in self.assets}
        last_xact: dict[str, str] = {}
        for row in events:
            seqs[row["asset_name"]].append(json.loads(row["payload"])["seq"])
            last_xact[row["asset_name"]] = row["xact"]
        watermarks = {row["name"]: json.loads(row["value"]) for row in states}
        same = {
            row["name"]: last_xact.get(row["name"]) == row["xact"]
            for row in states
            if row["name"] in last_xact
        }
        return Snapshot(write, seqs, watermarks, same)


class ObservedWrites(BaseStateBackend):
    """Mixed into a real backend: after each state or event write returns, take a snapshot."""

    _observer: Observer | None = None

    def observe(self, observer: Observer) -> list[Snapshot]:
        """Start observing; the returned list fills with a snapshot per write."""
        self._observer = observer
        self.snapshots: list[Snapshot] = []
        return self.snapshots

    async def _after(self, write: str) -> None:
        if self._observer is not None:
            self.snapshots.append(await self._observer.snapshot(write))

    async def _acommit_event(self, commit: EventCommit) -> list[AssetEvent]:
        written: list[AssetEvent] = await super()._acommit_event(commit)  # type: ignore[misc]
        await self._after(f"acommit_event({json.loads(commit.payload_json)})")
        return written

    async def _aput(self, put: Put) -> int:
        version = await super()._aput(put)
        await self._after(f"put({put.key}={put.value_json})")
        return version

    async def _adelete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        deleted = await super()._adelete(scope, key, writer=writer)
        await self._after(f"delete({key})")
        return deleted

    async def _aclear(
        self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None
    ) -> int:
        cleared = await super()._aclear(scope, all_map_indices, writer=writer)
        await self._after("clear()")
        return cleared


class ObservedSqlite(ObservedWrites, SqliteStateBackend):
    pass


class ObservedPostgres(ObservedWrites, PostgresStateBackend):
    pass


@dataclass(slots=True)
class Observed:
    backend: ObservedWrites
    snapshots: list[Snapshot]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def observed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Observed]:
    """A real backend whose every committed write is followed by a look from another connection."""
    names = [ORDERS.name, USERS.name]
    if request.param == "sqlite":
        path = tmp_path / "state.db"
        async with ObservedSqlite(path) as sqlite:
            await sqlite.events.aregister_assets([ORDERS, USERS])
            yield Observed(sqlite, sqlite.observe(SqliteObserver(path, names)))
        return
    import asyncpg

    dsn: str = request.getfixturevalue("pg_dsn")
    schema = f"wk_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(dsn)  # the observer's own connection
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        async with ObservedPostgres(dsn, schema=schema) as postgres:
            await postgres.events.aregister_assets([ORDERS, USERS])
            yield Observed(postgres, postgres.observe(PostgresObserver(conn, schema, names)))
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


def _events(count: int = EVENTS) -> list[TriggerEvent]:
    return [TriggerEvent({"seq": n}, state={WATERMARK: n}) for n in range(1, count + 1)]


async def _run(backend: BaseStateBackend, *specs: tuple[str, Scripted, tuple[Asset, ...]]) -> None:
    """Run the scripted triggers in one runner until each resumed after its last event."""
    async with TriggerRunner(backend, FAST) as runner:
        for trigger_id, trigger, assets in specs:
            await runner.start_trigger(WatchSpec(trigger_id, trigger, assets))
        with anyio.fail_after(30):
            for _, trigger, _ in specs:
                await trigger.drained.wait()


def _all_problems(snapshots: list[Snapshot]) -> list[str]:
    return [problem for snapshot in snapshots for problem in snapshot.problems()]


class TestNoSplitCommit:
    async def test_no_committed_moment_has_an_event_without_its_watermark(
        self, observed: Observed
    ) -> None:
        """After every write the runner makes, the committed events 1..k and watermark k agree."""
        trigger = Scripted(_events())
        await _run(observed.backend, ("w", trigger, (ORDERS,)))
        snapshots = observed.snapshots
        commits = [s for s in snapshots if s.write.startswith("acommit_event")]
        assert len(commits) >= EVENTS  # every event's commit was looked at
        assert _all_problems(snapshots) == []
        assert snapshots[-1].seqs[ORDERS.name] == list(range(1, EVENTS + 1))
        assert snapshots[-1].watermarks[ORDERS.name] == EVENTS

    async def test_an_event_on_two_assets_commits_once_for_both(self, observed: Observed) -> None:
        """A trigger watching two assets: each moment shows both assets at the same event."""
        trigger = Scripted(_events())
        await _run(observed.backend, ("w", trigger, (ORDERS, USERS)))
        snapshots = observed.snapshots
        assert len(snapshots) >= EVENTS
        assert _all_problems(snapshots) == []
        uneven = [s for s in snapshots if s.seqs[ORDERS.name] != s.seqs[USERS.name]]
        assert uneven == []
        assert snapshots[-1].seqs[USERS.name] == list(range(1, EVENTS + 1))

    async def test_group_commit_keeps_each_event_with_its_watermark(
        self, observed: Observed
    ) -> None:
        """Two triggers whose commits share transactions: each asset stays consistent."""
        orders, users = Scripted(_events()), Scripted(_events())
        await _run(observed.backend, ("o", orders, (ORDERS,)), ("u", users, (USERS,)))
        snapshots = observed.snapshots
        assert len(snapshots) >= 2 * EVENTS
        assert _all_problems(snapshots) == []
        final = snapshots[-1]
        assert final.seqs == {
            name: list(range(1, EVENTS + 1)) for name in (ORDERS.name, USERS.name)
        }


class TestTheObserverSeesASplit:
    async def test_a_watermark_written_before_its_event_is_reported(
        self, observed: Observed
    ) -> None:
        """Writing the watermark with aset and then the plain event shows the split moment."""
        backend = observed.backend
        await backend.aset(ORDERS.scope, WATERMARK, 1)
        await backend.events.acommit(EventCommit("w", (ORDERS.name,), json.dumps({"seq": 1})))
        problems = _all_problems(observed.snapshots)
        assert problems[:1] == ["after put(wm=1): orders events [] but watermark 1"]
