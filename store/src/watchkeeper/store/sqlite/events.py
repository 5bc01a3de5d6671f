"""Event commits of :class:`~watchkeeper.store.SqliteStateBackend` run as a group.

The writer (:mod:`watchkeeper.store.sqlite.writer`) hands neighbouring ``acommit_event`` operations of a batch
to :data:`EVENT_COMMITS` in one call: a handful of statements for the whole group instead of a
savepoint and two statements per event. The effects are those of
:func:`.meta.commit_event` run once per commit, in call order, which stays the path
for a lone commit and the fallback when the group's call fails.

An ``acommit_events`` batch (:class:`~watchkeeper.store.EventBatchCommit`) is one operation of
the same group, its events rows like any others; alone (or in the fallback) it runs through
:meth:`EventCommits.commit_batch`, the same code on a group of one, inside its savepoint, so a
batch of a thousand events is still a few multi-row statements and still all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from .._leases import HeldLease, check_fence
from .._types import AssetEvent, EventBatchCommit, EventCommit
from ..errors import StateStoreError
from .leases import HELD_SQL, held_of
from .ops import Row
from .writer import Tx

__all__ = ["COMMIT_BATCH", "EVENT_COMMITS", "EventCommits"]


class EventCommits:
    """Neighbouring :func:`commit_event` operations of a batch, run together by the writer.

    Same effects as running them one by one, in fewer statements: every fence and asset is
    checked first (a commit refused there writes nothing and fails alone); the dedup keys of
    the group are looked up at once, a key repeated inside the group counting as recorded
    after its first commit; the events are inserted with multi-row statements (ids follow the
    call order); and the state writes are folded per key, in the order keys were first written:
    the last value wins and the version grows by one per write, as if applied one at a time.
    """

    _CHUNKS: Final = (256, 64, 16, 4, 1)
    _LOOKUP: Final = 256  # keys per IN (...) list
    _EVENT_ROW: Final = "(?, ?, ?, ?, ?, ?)"
    _STATE_ROW: Final = "(?, ?, ?, ?, ?, ?, ?, ?)"

    def __init__(self) -> None:
        self._event_sql: dict[int, str] = {}
        self._state_sql: dict[int, str] = {}

    def _insert_events(self, n: int) -> str:
        sql = self._event_sql.get(n)
        if sql is None:
            rows = ", ".join([self._EVENT_ROW] * n)
            sql = self._event_sql[n] = (
                "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, "
                f"created_at) VALUES {rows}"
            )
        return sql

    def _upsert_state(self, n: int) -> str:
        # Each row carries how many writes it stands for, in place of the version 1 of a
        # single write: a new key starts at that count, an existing one grows by it.
        sql = self._state_sql.get(n)
        if sql is None:
            rows = ", ".join([self._STATE_ROW] * n)
            sql = self._state_sql[n] = (
                "INSERT INTO asset_state (asset_id, key, value, version, updated_at, "
                f"writer_kind, writer_name, writer_try) VALUES {rows} "
                "ON CONFLICT (asset_id, key) DO UPDATE SET value = excluded.value, "
                "version = asset_state.version + excluded.version, "
                "updated_at = excluded.updated_at, writer_kind = excluded.writer_kind, "
                "writer_name = excluded.writer_name, writer_try = excluded.writer_try"
            )
        return sql

    def _chunks(self, rows: list[Row]) -> list[list[Row]]:
        out: list[list[Row]] = []
        start = 0
        while start < len(rows):
            size = next(n for n in self._CHUNKS if n <= len(rows) - start)
            out.append(rows[start : start + size])
            start += size
        return out

    def _leases(
        self, tx: Tx, commits: Sequence[EventCommit | EventBatchCommit]
    ) -> dict[str, HeldLease]:
        ids = sorted({c.fence.trigger_id for c in commits if c.fence is not None})
        held: dict[str, HeldLease] = {}
        for start in range(0, len(ids), self._LOOKUP):
            part = ids[start : start + self._LOOKUP]
            marks = ", ".join("?" * len(part))
            for row in tx.conn.execute(f"{HELD_SQL} WHERE l.trigger_id IN ({marks})", part):
                held[row[0]] = held_of(row)
        return held

    def _recorded(self, tx: Tx, pairs: set[tuple[int, str]]) -> set[tuple[int, str]]:
        """Which ``(asset_id, dedup_key)`` pairs already have an event."""
        found: set[tuple[int, str]] = set()
        keys = sorted({key for _, key in pairs})
        asset_ids = sorted({asset_id for asset_id, _ in pairs})
        for start in range(0, len(keys), self._LOOKUP):
            part = keys[start : start + self._LOOKUP]
            sql = (
                "SELECT asset_id, dedup_key FROM asset_events WHERE dedup_key IN "
                f"({', '.join('?' * len(part))}) AND asset_id IN "
                f"({', '.join('?' * len(asset_ids))})"
            )
            found.update(
                pair
                for pair in tx.conn.execute(sql, (*part, *asset_ids))
                if (pair[0], pair[1]) in pairs
            )
        return found

    def run(self, tx: Tx, items: Sequence[Any]) -> list[Any]:
        commits: Sequence[EventCommit | EventBatchCommit] = items
        now, stamp = tx.now()
        outcomes: list[Any] = [None] * len(commits)
        held = self._leases(tx, commits)
        resolve = tx.resolve_name
        # 1. Fences and assets: a refused commit fails here, alone, having written nothing.
        # Each accepted commit with its targets (asset_id, name), an asset named twice once.
        accepted: list[tuple[int, list[tuple[int, str]]]] = []
        keyed = False  # whether any accepted commit carries a dedup key (or is a batch)
        for index, commit in enumerate(commits):
            try:
                if commit.fence is not None:
                    check_fence(commit.fence, held.get(commit.fence.trigger_id), now)
                names = commit.assets
                if len(names) == 1:
                    targets = [resolve(names[0])]
                else:
                    targets = list(dict(resolve(name) for name in names).items())
            except StateStoreError as exc:
                outcomes[index] = exc
                continue
            accepted.append((index, targets))
            if not keyed and (type(commit) is not EventCommit or commit.dedup_key is not None):
                keyed = True
        # 2. Dedup: recorded before the group, or by an earlier commit (or batch event) of it.
        seen: set[tuple[int, str]] = set()
        if keyed:
            pairs: set[tuple[int, str]] = set()
            for index, targets in accepted:
                for _, dedup_key in _entries(commits[index]):
                    if dedup_key is not None:
                        pairs.update((asset_id, dedup_key) for asset_id, _ in targets)
            if pairs:
                seen = self._recorded(tx, pairs)
        # The rows, in call order: a batch's events in order, each on every asset (the ids a
        # caller yielding them one by one would get); the commit and event of each row.
        rows: list[Row] = []
        owners: list[int] = []  # the index of each row's commit
        for index, targets in accepted:
            commit = commits[index]
            watcher = commit.watcher
            outcomes[index] = []
            if type(commit) is EventCommit and commit.dedup_key is None:
                payload_json = commit.payload_json
                for asset_id, name in targets:
                    rows.append((asset_id, name, watcher, payload_json, None, stamp))
                    owners.append(index)
                continue
            for payload_json, key in _entries(commit):
                for asset_id, name in targets:
                    if key is not None:
                        if (asset_id, key) in seen:
                            continue
                        seen.add((asset_id, key))
                    rows.append((asset_id, name, watcher, payload_json, key, stamp))
                    owners.append(index)
        # 3. The events. One multi-row INSERT numbers its rows one after the other, in the
        # order of its VALUES (AUTOINCREMENT: each id is one more than the largest ever
        # used, and the batch holds the write lock): the ids of a chunk end at its last
        # rowid. The count is checked, so a row that was not inserted cannot go unseen.
        conn = tx.conn
        ids: list[int] = []
        for chunk in self._chunks(rows):
            n = len(chunk)
            cursor = conn.execute(self._insert_events(n), _flat(chunk))
            last = cursor.lastrowid
            if cursor.rowcount != n or last is None:
                raise StateStoreError("the events were not all inserted")  # the writer falls back
            ids.extend(range(last - n + 1, last + 1))
        # 4. The events returned, and the state: written once per (commit, asset) that inserted
        # a row (a single event has one row per asset; a batch writes its state once), folded
        # per key in first-write order: the last value wins, the count of writes adds up.
        folded: dict[tuple[int, str], Row] = {}
        batch_stated: set[tuple[int, int]] = set()  # (batch, asset_id) whose state is folded
        event_of = AssetEvent.from_json
        for row, owner, event_id in zip(rows, owners, ids, strict=True):
            commit = commits[owner]
            # The payload stays the commit's text: the event decodes it if it is read.
            outcomes[owner].append(event_of(event_id, row[1], row[2], row[3], row[4], now))
            state = commit.state
            if not state:
                continue
            asset_id = row[0]
            if type(commit) is EventBatchCommit:  # one row per event: its state once per asset
                if (owner, asset_id) in batch_stated:
                    continue
                batch_stated.add((owner, asset_id))
            writer = commit.writer
            if writer is None:
                who: tuple[str | None, str | None, int | None] = _NO_WRITER
            else:
                who = (writer.kind, writer.name, writer.try_number)
            for key, value_json in state.items():
                slot = folded.get((asset_id, key))
                count = 1 if slot is None else slot[3] + 1
                folded[(asset_id, key)] = (asset_id, key, value_json, count, stamp, *who)
        for chunk in self._chunks(list(folded.values())):
            conn.execute(self._upsert_state(len(chunk)), _flat(chunk))
        return outcomes

    def commit_batch(self, tx: Tx, batch: EventBatchCommit) -> list[AssetEvent]:
        """One batch alone (inside its savepoint): its events, or its error raised."""
        (outcome,) = self.run(tx, [batch])
        if isinstance(outcome, BaseException):
            raise outcome
        events: list[AssetEvent] = outcome
        return events


def _entries(commit: EventCommit | EventBatchCommit) -> Sequence[tuple[str, str | None]]:
    """The ``(payload_json, dedup_key)`` of each event a commit carries."""
    if type(commit) is EventBatchCommit:
        return commit.events
    return ((commit.payload_json, commit.dedup_key),)  # type: ignore[union-attr]


_NO_WRITER: Final = (None, None, None)


def _flat(rows: list[Row]) -> list[object]:
    return [value for row in rows for value in row]


EVENT_COMMITS: Final = EventCommits()

COMMIT_BATCH: Final = EVENT_COMMITS.commit_batch
"""One ``acommit_events`` batch alone: the fallback operation of its :class:`~.writer.Op`."""
