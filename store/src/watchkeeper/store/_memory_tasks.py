"""Event consumers, task cursors and runs for :class:`~watchkeeper.store.MemoryStateBackend`.

A mixin over the memory backend's lock, event list and state dicts; the rules are
:mod:`._tasks`'. Every method does its whole work without an await, under the backend's lock,
so it is one transaction as the SQL backends' are.
"""

from __future__ import annotations

import bisect
import builtins
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ._memory_part import MemoryCore, MemoryPart
from ._tasks import (
    MAX_LOST_TRIES,
    RunError,
    RunOutcome,
    RunStep,
    StateWrite,
    TaskInfo,
    TaskRun,
    TaskSpec,
    after_failure,
    after_lost,
    check_rewind,
    deleting_running,
    lapsed_error,
    lost_reason,
    plan_runs,
    window_waits,
)
from ._types import AssetEvent, AssetScope, Put, Writer
from ._values import decode_value
from .errors import (
    ConsumerCursorError,
    RunLeaseLostError,
    RunNotFoundError,
    RunStateError,
    TaskNotFoundError,
)

__all__ = ["MemoryTasks"]


@dataclass(slots=True)
class _Task:
    spec: TaskSpec
    paused: bool = False
    cursors: dict[str, int] = field(default_factory=dict)
    writers: dict[str, Writer | None] = field(default_factory=dict)
    removed_at: datetime | None = None


class MemoryTasks(MemoryPart):
    """The tasks driver of the memory backend (:class:`~.protocols.TaskSpecsDriver` and :class:`~.protocols.RunsDriver`)."""

    def __init__(self, store: MemoryCore) -> None:
        super().__init__(store)
        self._m_consumers: dict[str, int] = {}
        self._m_tasks: dict[str, _Task] = {}
        self._m_runs: dict[int, TaskRun] = {}

    def _tasks_state(self) -> tuple[dict[str, int], dict[str, _Task], dict[int, TaskRun]]:
        return self._m_consumers, self._m_tasks, self._m_runs

    def _after(self, event_id: int) -> list[AssetEvent]:
        start = bisect.bisect_right(self._events, event_id, key=lambda e: e.id)
        return self._events[start:]

    # -- consumers ---------------------------------------------------------------------------

    async def _aconsumer_position(self, name: str) -> int:
        consumers, _, _ = self._tasks_state()
        return consumers.get(name, 0)

    async def _aconsumer_fetch(
        self, name: str, assets: builtins.list[str] | None, limit: int
    ) -> builtins.list[AssetEvent]:
        wanted = None if assets is None else set(assets)
        with self._lock:
            consumers, _, _ = self._tasks_state()
            after = self._after(consumers.get(name, 0))
            found = [e for e in after if wanted is None or e.asset in wanted]
        return found[:limit]

    async def _aconsumer_ack(
        self,
        name: str,
        event_id: int,
        state: builtins.list[StateWrite],
        expected: int | None,
        writer: Writer | None,
    ) -> int:
        consumers, _, _ = self._tasks_state()
        with self._lock:
            current = consumers.get(name, 0)
            if expected is not None and expected != current:
                raise ConsumerCursorError(name, event_id, current, f"expected {expected}")
            if event_id < current:
                raise ConsumerCursorError(name, event_id, current, "a cursor only moves forward")
            for write in state:  # resolve first: an unknown asset changes nothing
                if isinstance(write.scope, AssetScope):
                    self._resolve(write.scope)
            if state:  # nor does a fenced writer without its lease
                self._check_writer(writer)
            consumers[name] = event_id
        for write in state:
            self._put(Put(write.scope, write.key, write.value_json, writer=writer))
        return event_id

    # -- tasks -------------------------------------------------------------------------------

    def _named_task(self, name: str) -> _Task:
        _, tasks, _ = self._tasks_state()
        task = tasks.get(name)
        if task is None:
            raise TaskNotFoundError(f"task {name!r}")
        return task

    def _last_event_id(self, asset: str) -> int:
        for event in reversed(self._events):
            if event.asset == asset:
                return event.id
        return 0

    async def _async_tasks(self, specs: builtins.list[TaskSpec]) -> None:
        with self._lock:
            _, tasks, _ = self._tasks_state()
            for spec in specs:
                task = tasks.setdefault(spec.name, _Task(spec))
                task.spec, task.removed_at = spec, None
                for asset in spec.assets:
                    if asset not in task.cursors:
                        task.cursors[asset] = self._last_event_id(asset)
                        task.writers[asset] = None

    async def _alist_tasks(self) -> builtins.list[TaskInfo]:
        with self._lock:
            _, tasks, _ = self._tasks_state()
            out = []
            for name in sorted(tasks):
                task = tasks[name]
                pending = {
                    asset: sum(1 for e in self._after(task.cursors[asset]) if e.asset == asset)
                    for asset in task.spec.assets
                }
                cursors = {a: task.cursors[a] for a in task.spec.assets}
                out.append(
                    TaskInfo(
                        task.spec, task.paused, cursors, pending, dict(task.writers),
                        task.removed_at,
                    )
                )  # fmt: skip
        return out

    async def _aretire_tasks(self, keep: builtins.list[str]) -> builtins.list[str]:
        kept = set(keep)
        with self._lock:
            _, tasks, _ = self._tasks_state()
            now = self.clock()
            retired = sorted(
                name for name, task in tasks.items() if name not in kept and task.removed_at is None
            )
            for name in retired:
                tasks[name].removed_at = now
        return retired

    async def _adelete_task(self, name: str) -> None:
        with self._lock:
            _, tasks, runs = self._tasks_state()
            self._named_task(name)
            running = sorted(r.id for r in runs.values() if r.task == name and r.state == "running")
            if running:
                raise deleting_running(name, running[0])
            del tasks[name]

    async def _aset_task_paused(self, name: str, paused: bool) -> None:
        with self._lock:
            self._named_task(name).paused = paused

    async def _arewind_task(
        self, name: str, asset: str, to_event_id: int, writer: Writer | None
    ) -> None:
        with self._lock:
            task = self._named_task(name)
            task.cursors[asset] = check_rewind(
                task.spec, asset, to_event_id, task.cursors.get(asset, 0),
                self._last_event_id(asset),
            )  # fmt: skip
            task.writers[asset] = writer

    async def _acreate_runs(self, name: str, max_runs: int) -> builtins.list[TaskRun]:
        with self._lock:
            return self._create(name, max_runs)

    def _create(self, name: str, max_runs: int) -> list[TaskRun]:
        _, _, runs = self._tasks_state()
        task = self._named_task(name)
        if task.paused or task.removed_at is not None:  # no new runs
            return []
        spec = task.spec
        pending: dict[str, list[tuple[int, str]]] = {}
        by_id = {e.id: e for e in self._events}
        for asset in spec.assets:
            found = [e for e in self._after(task.cursors[asset]) if e.asset == asset]
            pending[asset] = [(e.id, asset) for e in found[: max_runs * spec.max_events]]
        now = self.clock()
        firsts = [by_id[p[0][0]].created_at for p in pending.values() if p]
        count = sum(len(p) for p in pending.values())
        if window_waits(spec, count, min(firsts, default=None), now):
            return []
        created: list[TaskRun] = []
        for taken, cursors in plan_runs(spec, pending, max_runs):
            task.cursors.update(cursors)
            for asset in cursors:
                task.writers[asset] = None
            run_id = len(runs) + 1
            runs[run_id] = TaskRun(
                id=run_id, task=name, state="queued", try_number=0, max_tries=spec.max_tries,
                event_count=len(taken), created_at=now, updated_at=now,
                events=tuple(by_id[event_id] for event_id, _ in taken),
            )  # fmt: skip
            created.append(runs[run_id])
        return created

    # -- runs --------------------------------------------------------------------------------

    async def _astep_runs(
        self,
        owner: str,
        finish: RunOutcome | None,
        claim: int,
        ttl: timedelta,
        tasks: builtins.list[str] | None,
        create: int,
        peers: int,
    ) -> RunStep:
        with self._lock:
            # Only the finish can fail, and it checks everything before it changes anything.
            _, known, _ = self._tasks_state()
            finished = None if finish is None else self._finish(owner, finish)
            claimed = self._claim(owner, claim, ttl, tasks) if claim else []
            created = 0
            if create and len(claimed) < claim:
                for name in sorted(known) if tasks is None else tasks:
                    if name in known:
                        created += len(self._create(name, create))
                claimed += self._claim(owner, claim - len(claimed), ttl, tasks)
            return RunStep(finished, tuple(claimed), created)

    def _claim(
        self, owner: str, limit: int, span: timedelta, tasks: builtins.list[str] | None
    ) -> list[TaskRun]:
        _, known, runs = self._tasks_state()
        now = self.clock()
        wanted = None if tasks is None else set(tasks)
        claimed: list[TaskRun] = []
        for run_id in sorted(runs):
            run = runs[run_id]
            task = known.get(run.task)
            if task is None or task.paused or (wanted is not None and run.task not in wanted):
                continue
            lapsed = (
                run.state == "running"
                and run.lease_expires_at is not None
                and run.lease_expires_at <= now
            )
            ready = run.state == "queued" and (run.not_before is None or run.not_before <= now)
            if not (lapsed or ready):
                continue
            if lapsed:
                failed = after_lost(run.lost_tries + 1) == "failed"
                lost = lapsed_error(run.lease_owner, run.try_number, now, final=failed)
                errors = (*run.errors, lost)
                run = runs[run_id] = replace(
                    run, state="failed" if failed else "queued", errors=errors,
                    finished_at=now if failed else None, updated_at=now, lease_owner=None,
                    lease_expires_at=None, not_before=None, lost_tries=run.lost_tries + 1,
                )  # fmt: skip
                if failed:
                    continue
            if len(claimed) >= limit:
                continue
            run = runs[run_id] = replace(
                run, state="running", try_number=run.try_number + 1,
                lease_owner=owner, lease_token=run.lease_token + 1,
                lease_expires_at=now + span, started_at=now, updated_at=now, not_before=None,
            )  # fmt: skip
            claimed.append(run)
        return claimed

    async def _aheartbeat_runs(self, owner: str, runs: dict[int, int], span: timedelta) -> set[int]:
        held: set[int] = set()
        with self._lock:
            _, _, rows = self._tasks_state()
            now = self.clock()
            for run_id, token in runs.items():
                run = rows.get(run_id)
                if run is None or _lost(run, owner, token, now) is not None:
                    continue
                rows[run_id] = replace(run, lease_expires_at=now + span)
                held.add(run_id)
        return held

    async def _abreak_run_leases(self, owners: builtins.list[str]) -> int:
        gone = set(owners)
        count = 0
        with self._lock:
            _, _, runs = self._tasks_state()
            now = self.clock()
            for run_id, run in runs.items():
                if run.state == "running" and run.lease_owner in gone:
                    runs[run_id] = replace(run, lease_expires_at=now)
                    count += 1
        return count

    def _finish(self, owner: str, outcome: RunOutcome) -> TaskRun:
        _, _, runs = self._tasks_state()
        now = self.clock()
        run_id, token = outcome.run_id, outcome.token
        run = runs.get(run_id)
        if run is None:
            raise RunNotFoundError(run_id)
        reason = _lost(run, owner, token, now)
        if reason is not None:
            raise RunLeaseLostError(run_id, owner, token, reason)
        if outcome.success:
            targets = [self._resolve(AssetScope(name=o.asset)) for o in outcome.outlets]
            outlet_ids: list[int] = []
            for outlet, target in zip(outcome.outlets, targets, strict=True):
                event = AssetEvent(
                    id=self._next_event_id,
                    asset=target.name,
                    watcher=f"task:{run.task}",
                    payload=decode_value(outlet.payload_json),
                    dedup_key=None,
                    created_at=now,
                )
                self._next_event_id += 1
                self._events.append(event)
                outlet_ids.append(event.id)
            run = replace(
                run, state="success", finished_at=now, updated_at=now, lease_owner=None,
                lease_expires_at=None, outlet_event_ids=tuple(outlet_ids),
            )  # fmt: skip
        else:
            failures = run.failures + 1
            state, not_before = after_failure(
                failures, run.max_tries, now, outcome.retry_delay, retry=outcome.retry
            )
            entry = RunError(
                run.try_number, outcome.error or "failed", outcome.traceback, now, outcome.cause,
                state == "failed",
            )  # fmt: skip
            run = replace(
                run, state=state, not_before=not_before, updated_at=now, lease_owner=None,
                lease_expires_at=None, errors=(*run.errors, entry),
                finished_at=now if state == "failed" else None, failures=failures,
            )  # fmt: skip
        runs[run_id] = run
        return replace(run, events=())

    async def _aget_run(self, run_id: int) -> TaskRun:
        with self._lock:
            _, _, runs = self._tasks_state()
            run = runs.get(run_id)
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    async def _alist_runs(
        self, task: str | None, state: str | None, limit: int | None, before: int | None
    ) -> builtins.list[TaskRun]:
        with self._lock:
            _, _, runs = self._tasks_state()
            found = [
                replace(r, events=())
                for run_id, r in sorted(runs.items(), reverse=True)
                if (task is None or r.task == task)
                and (state is None or r.state == state)
                and (before is None or run_id < before)
            ]
        return found if limit is None else found[:limit]

    async def _arun_event_ids(self, run_ids: builtins.list[int]) -> dict[int, builtins.list[int]]:
        with self._lock:
            _, _, runs = self._tasks_state()
            return {i: [e.id for e in runs[i].events] for i in run_ids if i in runs}

    async def _acount_runs(self) -> dict[tuple[str, str], int]:
        with self._lock:
            _, _, runs = self._tasks_state()
            return dict(Counter((r.task, r.state) for r in runs.values()))

    async def _acount_tries(self) -> dict[tuple[str, str, bool], int]:
        with self._lock:
            _, _, runs = self._tasks_state()
            return dict(
                Counter((r.task, e.cause, e.final) for r in runs.values() for e in r.errors)
            )

    async def _arun_durations(
        self, bounds: tuple[float, ...]
    ) -> dict[str, tuple[builtins.list[int], float]]:
        found: dict[str, tuple[list[int], float]] = {}
        with self._lock:
            _, _, runs = self._tasks_state()
            done = [r for r in runs.values() if r.state == "success"]
        for run in done:
            assert run.started_at is not None and run.finished_at is not None
            took = (run.finished_at - run.started_at).total_seconds()
            counts, total = found.get(run.task) or ([0] * (len(bounds) + 1), 0.0)
            counts[bisect.bisect_left(bounds, took)] += 1
            found[run.task] = (counts, total + took)
        return found

    async def _aoldest_pending(self) -> dict[tuple[str, str], datetime]:
        found: dict[tuple[str, str], datetime] = {}
        with self._lock:
            _, tasks, _ = self._tasks_state()
            for name, task in tasks.items():
                for asset in task.spec.assets:
                    for event in self._after(task.cursors.get(asset, 0)):
                        if event.asset == asset:
                            found[(name, asset)] = event.created_at
                            break
        return found

    async def _aretry_run(self, run_id: int) -> TaskRun:
        with self._lock:
            _, _, runs = self._tasks_state()
            run = runs.get(run_id)
            if run is None:
                raise RunNotFoundError(run_id)
            if run.state != "failed":
                raise RunStateError(run_id, run.state, "only a failed run can be retried")
            now = self.clock()
            run = runs[run_id] = replace(
                run, state="queued", max_tries=run.failures + 1, not_before=None,
                finished_at=None, updated_at=now,
                lost_tries=min(run.lost_tries, MAX_LOST_TRIES - 1),
            )  # fmt: skip
            return run


def _lost(run: TaskRun, owner: str, token: int, now: datetime) -> str | None:
    """Why ``owner`` with ``token`` does not hold ``run``'s lease at ``now``; None if it does."""
    return lost_reason(
        run.state, run.lease_owner, run.lease_token, run.lease_expires_at, owner, token, now
    )
