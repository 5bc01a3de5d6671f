"""``MemoryStateBackend``: a complete backend in a dict, and the fake the tests use."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Self

from ._backend import BaseStateBackend
from ._builtin import builtin_services
from ._gc import GcPlan
from ._leases import HeldLease, check_fence, spread_key
from ._memory_controls import MemoryControls
from ._memory_logs import MemoryLogs
from ._memory_tasks import MemoryTasks
from ._types import (
    Asset,
    AssetEvent,
    AssetInfo,
    AssetScope,
    DaemonStatus,
    EventBatchCommit,
    EventCommit,
    Fence,
    GcReport,
    Lease,
    NodeHeartbeat,
    NodeLease,
    Put,
    RawEntry,
    StateScope,
    TaskScope,
    TriggerStatus,
    Writer,
)
from ._values import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_VALUE_BYTES
from .errors import AssetNotFoundError, VersionConflictError

__all__ = ["MemoryStateBackend"]

_TaskRow = tuple[str, str, str, int, str]  # dag_id, run_id, task_id, map_index, key


@dataclass(slots=True)
class _AssetRow:
    asset_id: int
    name: str
    uri: str | None
    active: bool
    updated_at: datetime


class MemoryStateBackend(BaseStateBackend):
    """Everything in process memory, behind one lock; nothing survives the process.

    It implements the sync and the async hooks directly (each operation is a few dict
    look-ups), so neither side pays for a bridge, and the whole metastore: assets, events and
    garbage collection, with the same semantics as the SQLite and PostgreSQL backends.
    """

    def __init__(
        self,
        *,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(max_value_bytes=max_value_bytes, max_payload_bytes=max_payload_bytes)
        self._lock = threading.Lock()
        self._task: dict[_TaskRow, RawEntry] = {}
        self._asset_state: dict[tuple[int, str], RawEntry] = {}
        self._assets: dict[str, _AssetRow] = {}
        self._events: list[AssetEvent] = []  # in id order; GC deletes from anywhere in it
        self._next_event_id = 1  # ids are never reused, as in SQL, even after GC
        self._dedup: set[tuple[int, str]] = set()
        self._statuses: dict[str, TriggerStatus] = {}
        self._daemons: dict[str, DaemonStatus] = {}
        self._leases: dict[str, tuple[str | None, int]] = {}  # trigger id: (owner, token)
        self._nodes: dict[str, NodeLease] = {}
        tasks, controls = MemoryTasks(self), MemoryControls(self)
        self._logs = MemoryLogs(tasks)
        self.services = builtin_services(
            self, events=self, feed=controls, tasks=tasks, runs=tasks, leases=self, controls=controls,
            status=self, gc=self, logs=self._logs,
        )  # fmt: skip
        self._open = True  # usable without 'async with'; entering it is harmless

    async def __aenter__(self) -> Self:
        self._open = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def _describe(self) -> str:
        return f"assets={len(self._assets)} events={len(self._events)}"

    # -- scope resolution ----------------------------------------------------------------------

    def _resolve(self, scope: AssetScope) -> _AssetRow:
        for row in self._assets.values():
            if not row.active:
                continue
            if scope.asset_id is not None and row.asset_id == scope.asset_id:
                return row
            if scope.name is not None and row.name == scope.name:
                return row
            if scope.name is None and scope.uri is not None and row.uri == scope.uri:
                return row
        raise AssetNotFoundError(str(scope))

    def _held(self, trigger_id: str) -> HeldLease | None:
        """With the lock held: the lease row with its holder's node lease expiry."""
        row = self._leases.get(trigger_id)
        if row is None:
            return None
        node = self._nodes.get(row[0]) if row[0] is not None else None
        return row[0], row[1], node.expires_at if node is not None and node.alive else None

    def _check_fence(self, fence: Fence | None, now: datetime) -> None:
        """With the lock held: refuse a write whose fence is not the live lease."""
        if fence is not None:
            check_fence(fence, self._held(fence.trigger_id), now)

    def _check_writer(self, writer: Writer | None) -> None:
        """With the lock held: refuse a write by a writer whose fence is not the live lease."""
        if writer is not None and writer.fence is not None:
            check_fence(writer.fence, self._held(writer.fence.trigger_id), self.clock())

    def _task_key(self, scope: TaskScope, key: str) -> _TaskRow:
        return (scope.dag_id, scope.run_id, scope.task_id, scope.map_index, key)

    # -- key/value hooks: both sides -----------------------------------------------------------

    def _get(self, scope: StateScope, key: str) -> RawEntry | None:
        with self._lock:
            if isinstance(scope, TaskScope):
                return self._task.get(self._task_key(scope, key))
            return self._asset_state.get((self._resolve(scope).asset_id, key))

    def _put(self, put: Put) -> int:
        scope, key, expected_version = put.scope, put.key, put.expected_version
        with self._lock:
            self._check_writer(put.writer)
            table: dict[object, RawEntry]
            if isinstance(scope, TaskScope):
                table, row_key = self._task, self._task_key(scope, key)  # type: ignore[assignment]
            else:
                table = self._asset_state  # type: ignore[assignment]
                row_key = (self._resolve(scope).asset_id, key)  # type: ignore[assignment]
            old = table.get(row_key)
            current = old.version if old is not None else 0
            if expected_version is not None and expected_version != current:
                raise VersionConflictError(key, expected_version, current)
            table[row_key] = RawEntry(
                key=key,
                value_json=put.value_json,
                version=current + 1,
                updated_at=self.clock(),
                writer=put.writer,
                expires_at=put.expires_at,
                never_expire=put.never_expire,
            )
            return current + 1

    def _delete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        with self._lock:
            self._check_writer(writer)
            if isinstance(scope, TaskScope):
                return self._task.pop(self._task_key(scope, key), None) is not None
            return self._asset_state.pop((self._resolve(scope).asset_id, key), None) is not None

    def _clear(self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None) -> int:
        with self._lock:
            self._check_writer(writer)
            if isinstance(scope, TaskScope):
                doomed = [
                    k
                    for k in self._task
                    if k[:3] == (scope.dag_id, scope.run_id, scope.task_id)
                    and (all_map_indices or k[3] == scope.map_index)
                ]
                for k in doomed:
                    del self._task[k]
                return len(doomed)
            asset_id = self._resolve(scope).asset_id
            gone = [a for a in self._asset_state if a[0] == asset_id]
            for a in gone:
                del self._asset_state[a]
            return len(gone)

    def _list(self, scope: StateScope) -> list[RawEntry]:
        with self._lock:
            if isinstance(scope, TaskScope):
                prefix = (scope.dag_id, scope.run_id, scope.task_id, scope.map_index)
                rows = [v for k, v in self._task.items() if k[:4] == prefix]
            else:
                asset_id = self._resolve(scope).asset_id
                rows = [v for k, v in self._asset_state.items() if k[0] == asset_id]
        return sorted(rows, key=lambda r: r.key)

    async def _aget(self, scope: StateScope, key: str) -> RawEntry | None:
        return self._get(scope, key)

    async def _aput(self, put: Put) -> int:
        return self._put(put)

    async def _adelete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        return self._delete(scope, key, writer=writer)

    async def _aclear(
        self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None
    ) -> int:
        return self._clear(scope, all_map_indices, writer=writer)

    async def _alist(self, scope: StateScope) -> list[RawEntry]:
        return self._list(scope)

    # -- metastore -------------------------------------------------------------------------------

    async def _aregister_assets(self, assets: list[Asset]) -> None:
        now = self.clock()
        with self._lock:
            for asset in assets:
                row = self._assets.get(asset.name)
                if row is None:
                    self._assets[asset.name] = _AssetRow(
                        len(self._assets) + 1, asset.name, asset.uri, True, now
                    )
                else:
                    row.uri, row.active, row.updated_at = asset.uri, True, now

    async def _adeactivate_asset(self, name: str) -> bool:
        with self._lock:
            row = self._assets.get(name)
            if row is None or not row.active:
                return False
            row.active, row.updated_at = False, self.clock()
            return True

    async def _alist_assets(self, active_only: bool) -> list[AssetInfo]:
        with self._lock:
            return [
                AssetInfo(r.asset_id, r.name, r.uri, r.active, r.updated_at)
                for r in sorted(self._assets.values(), key=lambda r: r.name)
                if r.active or not active_only
            ]

    async def _acommit_event(self, commit: EventCommit) -> list[AssetEvent]:
        with self._lock:
            now = self.clock()
            self._check_fence(commit.fence, now)
            rows = [self._resolve(AssetScope(name=name)) for name in commit.assets]
            # Check every compare first, so a failure changes nothing.
            fresh = [
                r
                for r in rows
                if commit.dedup_key is None or (r.asset_id, commit.dedup_key) not in self._dedup
            ]
            written: list[AssetEvent] = []
            for row in fresh:
                event = AssetEvent.from_json(
                    self._next_event_id,
                    row.name,
                    commit.watcher,
                    commit.payload_json,
                    commit.dedup_key,
                    now,
                )
                self._next_event_id += 1
                self._events.append(event)
                written.append(event)
                if commit.dedup_key is not None:
                    self._dedup.add((row.asset_id, commit.dedup_key))
                self._write_asset_state(row.asset_id, commit.state, commit.writer, now)
            return written

    async def _acommit_events(self, batch: EventBatchCommit) -> list[AssetEvent]:
        with self._lock:
            now = self.clock()
            self._check_fence(batch.fence, now)
            rows: dict[int, _AssetRow] = {}
            for name in batch.assets:  # resolve all first: an unknown asset writes nothing
                row = self._resolve(AssetScope(name=name))
                rows.setdefault(row.asset_id, row)
            written: list[AssetEvent] = []
            stated: set[int] = set()
            for payload_json, dedup_key in batch.events:
                for row in rows.values():
                    if dedup_key is not None:
                        if (row.asset_id, dedup_key) in self._dedup:
                            continue  # recorded before, or by an earlier event of the batch
                        self._dedup.add((row.asset_id, dedup_key))
                    event = AssetEvent.from_json(
                        self._next_event_id, row.name, batch.watcher, payload_json, dedup_key, now
                    )
                    self._next_event_id += 1
                    self._events.append(event)
                    written.append(event)
                    stated.add(row.asset_id)
            for row in rows.values():
                if row.asset_id not in stated:
                    continue  # every event of the batch was a duplicate here
                self._write_asset_state(row.asset_id, batch.state, batch.writer, now)
            return written

    def _write_asset_state(
        self, asset_id: int, state: Mapping[str, str], writer: Writer | None, now: datetime
    ) -> None:
        """Upsert an event's ``state`` (JSON texts) on one asset, each key one version up."""
        for key, value_json in state.items():
            old = self._asset_state.get((asset_id, key))
            self._asset_state[(asset_id, key)] = RawEntry(
                key=key,
                value_json=value_json,
                version=(old.version if old else 0) + 1,
                updated_at=now,
                writer=writer,
            )

    async def _alist_events(
        self,
        asset: str | None,
        since_id: int,
        limit: int | None,
        before_id: int | None,
        newest_first: bool,
    ) -> list[AssetEvent]:
        with self._lock:
            start = bisect.bisect_right(self._events, since_id, key=lambda e: e.id)
            end = len(self._events)
            if before_id is not None:
                end = max(start, bisect.bisect_left(self._events, before_id, key=lambda e: e.id))
            events = [e for e in self._events[start:end] if asset is None or e.asset == asset]
        if newest_first:
            events.reverse()
        return events if limit is None else events[:limit]

    async def _acollect_garbage(self, plan: GcPlan) -> GcReport:
        now, dry_run, cutoff, events_due = plan.now, plan.dry_run, plan.stale_before, plan.events
        report = GcReport(dry_run=dry_run)
        with self._lock:
            for k, row in list(self._task.items()):
                scope = TaskScope._from_row(*k[:4])
                if row.never_expire:
                    continue
                if row.expires_at is not None:
                    if row.expires_at < now:
                        report.expired.append((scope, k[4]))
                        if not dry_run:
                            del self._task[k]
                elif cutoff is not None and row.updated_at < cutoff:
                    report.retention.append((scope, k[4]))
                    if not dry_run:
                        del self._task[k]
            inactive = {r.asset_id: r.name for r in self._assets.values() if not r.active}
            for asset_key in [k for k in self._asset_state if k[0] in inactive]:
                report.orphaned.append((inactive[asset_key[0]], asset_key[1]))
                if not dry_run:
                    del self._asset_state[asset_key]
            if events_due is not None:  # a finished run's logs go with its events
                report.logs = self._logs.collect(events_due.events, dry_run)
                due = [e for e in self._events if events_due.due(e.created_at, e.dedup_key)]
                report.events = len(due)
                if due and not dry_run:
                    gone = {id(e) for e in due}
                    self._events = [e for e in self._events if id(e) not in gone]
                    for event in due:
                        if event.dedup_key is not None:
                            asset_id = self._assets[event.asset].asset_id
                            self._dedup.discard((asset_id, event.dedup_key))
        return report

    async def _asave_trigger_status(self, statuses: list[TriggerStatus]) -> None:
        with self._lock:
            for status in statuses:
                self._statuses[status.trigger_id] = status

    async def _adelete_trigger_status(self, trigger_ids: list[str]) -> None:
        with self._lock:
            for trigger_id in trigger_ids:
                self._statuses.pop(trigger_id, None)

    async def _alist_trigger_status(self) -> list[TriggerStatus]:
        with self._lock:
            return [self._statuses[k] for k in sorted(self._statuses)]

    async def _asave_daemon_status(self, status: DaemonStatus) -> None:
        with self._lock:
            self._daemons[status.owner] = status

    async def _adelete_daemon_status(self, owners: list[str]) -> None:
        with self._lock:
            for owner in owners:
                self._daemons.pop(owner, None)

    async def _alist_daemon_status(self) -> list[DaemonStatus]:
        with self._lock:
            return [self._daemons[k] for k in sorted(self._daemons)]

    def _renew_node(self, owner: str, span: timedelta, now: datetime) -> NodeHeartbeat:
        """With the lock held: renew or (re)create ``owner``'s node lease, reap the others."""
        node = self._nodes.get(owner)
        renewed = node is not None and node.alive
        if not renewed:  # new, or reaped: whatever it held before is free
            for trigger_id, (holder, token) in self._leases.items():
                if holder == owner:
                    self._leases[trigger_id] = (None, token)
        self._nodes[owner] = NodeLease(owner, True, now + span, 0)
        reaped = []
        for name, other in self._nodes.items():
            if other.alive and name != owner and other.expires_at <= now:
                self._nodes[name] = replace(other, alive=False)
                reaped.append(name)
        counts: dict[str | None, int] = {}
        for holder, _ in self._leases.values():
            counts[holder] = counts.get(holder, 0) + 1
        for name in [n for n, x in self._nodes.items() if not x.alive and not counts.get(n)]:
            del self._nodes[name]  # reaped and taken over: nothing left to free
        nodes = tuple(replace(self._nodes[n], held=counts.get(n, 0)) for n in sorted(self._nodes))
        return NodeHeartbeat(renewed, nodes, tuple(sorted(reaped)), now)

    async def _arenew_node(self, owner: str, span: timedelta) -> NodeHeartbeat:
        with self._lock:
            return self._renew_node(owner, span, self.clock())

    async def _aclaim_leases(
        self, owner: str, ids: list[str], span: timedelta, limit: int | None
    ) -> dict[str, int]:
        with self._lock:
            self._renew_node(owner, span, self.clock())
            live = {n for n, node in self._nodes.items() if node.alive}
            free = [
                t
                for t in ids
                if (row := self._leases.get(t)) is None or row[0] is None or row[0] not in live
            ]
            free.sort(key=lambda t: spread_key(owner, t))
            for trigger_id in free[:limit]:
                _, token = self._leases.get(trigger_id, (None, 0))
                self._leases[trigger_id] = (owner, token + 1)
            return {t: row[1] for t in ids if (row := self._leases.get(t)) and row[0] == owner}

    async def _arelease_leases(self, owner: str, ids: list[str], leave: bool) -> None:
        with self._lock:
            targets = set(ids)
            for trigger_id, (holder, token) in self._leases.items():
                if holder == owner and (leave or trigger_id in targets):
                    self._leases[trigger_id] = (None, token)
            if leave:
                self._nodes.pop(owner, None)

    async def _abreak_node(self, owner: str) -> bool:
        with self._lock:
            node = self._nodes.get(owner)
            if node is None or not node.alive:
                return False
            self._nodes[owner] = replace(node, alive=False)
            return True

    async def _alist_leases(self) -> list[Lease]:
        with self._lock:
            return [Lease(k, *self._held(k)) for k in sorted(self._leases)]  # type: ignore[misc]
