"""The worker: runs the ``asset_task`` tasks of the definition files on their assets' events.

``watchkeeper worker`` opens the store, declares the tasks (their specs and assets), then loops:

1. with free slots, take a *step* (:meth:`~watchkeeper.store.protocols.TaskQueue.astep_runs`):
   claim ready runs under a lease (``[worker] lease_ttl``) and, when too few are ready,
   create a batch of runs from the pending events and claim from it, in one transaction
   (each creation moves the task's cursors with it);
2. execute each claimed run in a slot: a sync task in a thread (at most ``concurrency``), an
   async one on the loop with a greenback portal, under ``execution_timeout``; then its slot
   finishes it with one step that records the outcome (success with the outlet events, or a
   failure retried after an exponential, jittered delay; fenced by the lease token) and
   claims the slot's next run; a slot with nothing to claim frees itself;
3. wait for new events: ``await_events`` (LISTEN/NOTIFY on PostgreSQL, an adaptive poll on
   SQLite), at most ``poll_interval``, or for a slot to free.

One step of a worker at a time creates runs; the others only claim.
A heartbeat task renews the leases of the runs in flight every ``heartbeat_interval`` and
cancels a run whose lease was lost (its result would be refused anyway), and it frees at once
the leases of dead worker processes of this host (as the triggerer does for its leases), so a
restarted worker retries a killed worker's runs without waiting for the lease to lapse.
Several workers may share one PostgreSQL database; on SQLite they serialise on the file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import anyio
import anyio.abc
import greenback
from watchkeeper.store import (
    BaseStateBackend,
    RunLeaseLostError,
    StateStoreError,
    TaskScope,
)
from watchkeeper.store.protocols import (
    EventLog,
    LoopThreads,
    OutletEvent,
    RunOutcome,
    RunStep,
    TaskQueue,
    TaskRun,
    encode_payload,
    get_logger,
)

from .._core import describe_error
from ..daemon import daemon_identity, is_dead_local_owner
from ..settings import Settings, WorkerSettings
from ._asset_task import AssetTask
from ._callbacks import call_back
from ._context import retry_delay_for, run_context
from ._isolation import ChildResult, ProcessPool, process_pool_for
from ._task_files import TaskFiles, TaskLoad
from ._task_traceback import format_task_traceback
from ._try_logs import TryLogs

__all__ = ["Worker"]

log = get_logger(__name__)

_JITTER = 0.2
_CREATE_EVENTS = 4096
"""The most events a creation that grew past the base batch takes (runs x max_events)."""


def _cancelled_from_outside() -> bool:
    """Whether a cancel scope around the current task is cancelled (or past its deadline),
    or, on asyncio, the task itself was asked to stop: a cancellation exception raised then
    is the caller's, one raised without it is the task code's own."""
    if anyio.current_effective_deadline() <= anyio.current_time():
        return True
    try:
        current = asyncio.current_task()
    except RuntimeError:  # not on asyncio
        return False
    return current is not None and current.cancelling() > 0


@dataclass(slots=True)
class _InFlight:
    token: int
    scope: anyio.CancelScope


class Worker:
    """Runs ``tasks`` from ``backend`` until cancelled: ``await worker.run()``.

    :param backend: an open backend with the tasks service (``backend.tasks``).
    :param tasks: the tasks to declare and run (each name once).
    :param settings: ``[worker]`` settings (default: the defaults).
    :param owner: the name its run leases are held under (default: ``host:pid:random``).
    :param process_settings: the whole configuration, for tasks run in child processes
        (``isolation="process"``): each child opens the store from it and finds the task's
        definition file under ``[triggerer] watchers_path``. Its ``[worker]`` section is used
        in place of ``settings``.
    :param files: the definition files ``tasks`` were loaded from, to follow while running
        (every ``[worker] reload_interval``); None: the tasks stay as given.
    :raises IsolationUnavailableError: a task runs in child processes and there are no
        ``process_settings``, or they name an in-memory store the children cannot share.
    """

    def __init__(
        self,
        backend: BaseStateBackend,
        tasks: Sequence[AssetTask],
        settings: WorkerSettings | None = None,
        *,
        owner: str | None = None,
        process_settings: Settings | None = None,
        files: TaskFiles | None = None,
    ) -> None:
        self.backend = backend
        self.queue: TaskQueue = backend.tasks
        self.registry: EventLog = backend.events
        self.tasks = {task.name: task for task in tasks}
        if process_settings is not None:
            settings = process_settings.worker
        self.settings = settings or WorkerSettings()
        self.owner = owner or daemon_identity()
        self.files = files
        self._process_settings = process_settings
        self._gone: dict[str, AssetTask] = {}  # for the runs claimed before their task went
        isolated = {name for name, task in self.tasks.items() if self._isolated(task)}
        self._pool = process_pool_for(isolated, self.settings, process_settings)
        logs, cap = backend.services.logs, self.settings.log_max_bytes
        #: Each in-process try's output, kept with its run (a child keeps its own).
        self.try_logs = TryLogs(logs, max_bytes=cap) if logs is not None and cap else None
        self._threads = LoopThreads(self.settings.concurrency, name="watchkeeper-task")
        self._running: dict[int, _InFlight] = {}
        self._errors: dict[int, BaseException] = {}
        """The exception of each failed try not yet handed to its callback, by run id."""
        self._slot_freed = anyio.Event()
        self._accepting = True
        self._finishing = 0
        self._creating = False
        self._names = sorted(self.tasks)
        # Runs created at once when too few are ready: a batch per slot round, not one each,
        # doubled while each creation fills (see _step).
        self._base_batch = self._batch = 4 * self.settings.concurrency
        self._max_batch = self._max_batch_for(self.tasks)
        self.finished = 0
        self._log_starts = False

    def __repr__(self) -> str:
        return f"<Worker owner={self.owner!r} tasks={len(self.tasks)} running={len(self._running)}>"

    @property
    def ttl(self) -> float:
        return self.settings.lease_seconds

    def _isolated(self, task: AssetTask) -> bool:
        return (task.isolation or self.settings.isolation) == "process"

    def _max_batch_for(self, tasks: dict[str, AssetTask]) -> int:
        most = max((task.spec.max_events for task in tasks.values()), default=1)
        return max(self._base_batch, min(32 * self.settings.concurrency, _CREATE_EVENTS // most))

    def _task_of(self, name: str) -> AssetTask:
        """A run's code: its task's now, or its last one if it went after the run was claimed."""
        return self.tasks.get(name) or self._gone[name]

    async def apply_tasks(self, load: TaskLoad) -> None:
        """Run the tasks of ``load`` from now on: the new and changed ones are declared, the
        runs claimed from now on run their code, and a task no longer defined gets no new
        run and is marked removed in the store (its pending events and cursor stay). A try
        already running finishes with the code it started with."""
        tasks = load.tasks
        changed = [name for name, task in tasks.items() if self.tasks.get(name) is not task]
        gone = sorted(self.tasks.keys() - tasks.keys())
        if not changed and not gone:
            return
        await self._declare([tasks[name] for name in changed])
        if gone:  # only those this worker ran: another worker's tasks are not its to retire
            others = {info.name for info in await self.queue.alist_tasks()} - set(gone)
            await self.queue.aretire_tasks(sorted(others | tasks.keys()))
        isolated = {name for name, task in tasks.items() if self._isolated(task)}
        pool = self._pool
        if pool is None and isolated:
            pool = process_pool_for(isolated, self.settings, self._process_settings)
        for name in gone:
            self._gone[name] = self.tasks[name]
        for name in changed:
            self._gone.pop(name, None)
        self.tasks, self._names, self._pool = tasks, sorted(tasks), pool
        self._max_batch = self._max_batch_for(tasks)
        if pool is not None and isolated.intersection(changed):
            await pool.renew()  # children hold the tasks they ran: new ones load the files
        log.info(
            "tasks_reloaded", tasks=self._names, changed=sorted(changed), removed=gone,
            refused=[str(error) for error in load.errors],
        )  # fmt: skip

    async def declare(self) -> None:
        """Register the tasks' assets and specs (idempotent; a new task starts at the log's end)."""
        await self._declare(list(self.tasks.values()))

    async def _declare(self, tasks: Sequence[AssetTask]) -> None:
        assets = {a.name: a for task in tasks for a in task.assets}
        if assets:
            await self.registry.aregister_assets(list(assets.values()))
        if tasks:
            await self.queue.async_tasks([task.spec for task in tasks])

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Declare the tasks, then create, claim and execute runs until cancelled."""
        await self.declare()
        # Read once: a disabled debug call still costs a lookup on every run.
        self._log_starts = log.is_enabled_for(logging.DEBUG)
        log.info("worker_started", owner=self.owner, tasks=sorted(self.tasks))
        try:
            async with anyio.create_task_group() as tg:
                await self._free_dead_owners()
                tg.start_soon(self._heartbeat)
                if self.try_logs is not None:
                    await tg.start(self.try_logs.run)
                if self._pool is not None:
                    tg.start_soon(self._pool.warm)
                if self.files is not None:
                    tg.start_soon(
                        self.files.follow, self.settings.reload_interval, self.apply_tasks
                    )
                task_status.started()
                await self._loop(tg)
        finally:
            self._threads.close()
            if self._pool is not None:
                with anyio.CancelScope(shield=True):
                    await self._pool.aclose()

    def stop_claiming(self) -> None:
        """Take no new runs (a graceful stop lets the running ones finish)."""
        self._accepting = False

    async def drained(self) -> None:
        """Return once no run is in flight."""
        while self._running or self._finishing:
            self._slot_freed = anyio.Event()
            await self._slot_freed.wait()

    async def _loop(self, tg: anyio.abc.TaskGroup) -> None:
        last_seen = 0
        poll = self.settings.poll_interval
        while True:
            try:
                free = self.settings.concurrency - self._in_flight()
                if self._accepting and free > 0:
                    step = await self._step(claim=free)
                    for run in step.claimed:
                        self._start(tg, run)
                    if len(step.claimed) == free:
                        continue  # each slot claims its next run as it finishes
                if free <= 0 or not self._accepting:
                    self._slot_freed = anyio.Event()
                    with anyio.move_on_after(poll):
                        await self._slot_freed.wait()
                    continue
                last_seen = await self.registry.await_events(last_seen, poll)
            except StateStoreError as exc:  # unavailable, or a conflict: look again shortly
                log.warning("worker_store_error", error=describe_error(exc))
                await anyio.sleep(max(poll, 1.0))

    def _in_flight(self) -> int:
        """Runs claimed and not yet finished: running, or being recorded (whose slot may
        claim the next one in the same step)."""
        return len(self._running) + self._finishing

    def _start(self, tg: anyio.abc.TaskGroup, run: TaskRun) -> None:
        scope = anyio.CancelScope()
        self._running[run.id] = _InFlight(run.lease_token, scope)
        tg.start_soon(self._execute, run, scope)

    async def _execute(self, run: TaskRun, scope: anyio.CancelScope) -> None:
        """Run ``run``, then the run claimed with its finish, and so on: one slot.

        ``scope`` is the slot's: the heartbeat cancels it when the lease of the run it
        executes is lost, which ends the slot (one scope per slot, not per run: entering and
        leaving one costs more than a no-op run's thread hand-off). Recording an outcome is
        shielded, and the run being recorded is no longer in ``_running``."""
        try:
            with scope:
                while True:
                    outcome = await self._try_logged(self._task_of(run.task), run)
                    self._running.pop(run.id, None)
                    self._finishing += 1
                    try:
                        done, next_run = await self._finish(run, outcome)
                        if next_run is not None:
                            self._running[next_run.id] = _InFlight(next_run.lease_token, scope)
                        if done is not None:
                            await self._call_back(run, outcome, done)
                    finally:
                        self._finishing -= 1
                        self._errors.pop(run.id, None)
                    if next_run is None:
                        return
                    run = next_run
        finally:
            self._running.pop(run.id, None)
            self._slot_freed.set()

    async def _try_logged(self, task: AssetTask, run: TaskRun) -> RunOutcome:
        """A try, its output kept with its run and stored before the outcome is recorded."""
        logs = self.try_logs
        if logs is None or self._isolated(task):
            return await self._try(task, run)
        buffer = logs.open(run.id, run.try_number)
        try:
            with logs.routed(buffer):
                return await self._try(task, run)
        finally:
            await logs.close(buffer)

    async def _try(self, task: AssetTask, run: TaskRun) -> RunOutcome:
        if self._log_starts:
            log.debug("run_started", run_id=run.id, task=task.name, try_number=run.try_number)
        if self._pool is not None and self._isolated(task):
            return await self._try_in_child(self._pool, task, run)
        context = run_context(self.backend, task, run)
        limit: anyio.CancelScope | None = None
        try:
            timeout = task.execution_timeout
            if timeout is None:  # no scope to enter and leave: one fewer per run
                await self._call(task, context)
            else:
                with anyio.move_on_after(timeout.total_seconds()) as limit:
                    await self._call(task, context)
                if limit.cancelled_caught:
                    seconds = timeout.total_seconds()
                    late = TimeoutError(f"the try ran past its execution_timeout of {seconds:g} s")
                    return self._failed(task, run, late, cause="timeout")
            outlets = tuple(
                OutletEvent(
                    a.name,
                    encode_payload(
                        context["outlet_events"][a].extra,
                        max_payload_bytes=self.backend.max_payload_bytes,
                    ),
                )
                for a in task.outlets
            )
        except Exception as exc:  # noqa: BLE001 - a task's failure is its run's, never the worker's
            # One raised while the timeout cancels the try (cleanup that failed) is the timeout's.
            timed_out = limit is not None and limit.cancel_called
            return self._failed(task, run, exc, cause="timeout" if timed_out else "task_error")
        except BaseException as exc:
            # sys.exit(), KeyboardInterrupt, GeneratorExit or the task's own BaseException
            # subclass end the try, not the worker. A cancellation is the worker's only when
            # a scope around this slot was cancelled (the worker stopping, a lost lease).
            if isinstance(exc, anyio.get_cancelled_exc_class()) and _cancelled_from_outside():
                raise
            return self._failed(task, run, exc)
        return RunOutcome(run.id, run.lease_token, True, outlets)

    async def _try_in_child(self, pool: ProcessPool, task: AssetTask, run: TaskRun) -> RunOutcome:
        timeout = task.execution_timeout
        answer = await pool.run(task, run, timeout.total_seconds() if timeout else None)
        if isinstance(answer, ChildResult):
            return RunOutcome(run.id, run.lease_token, True, answer.outlets)
        cause: Literal["task_error", "timeout"] = (
            "timeout" if answer.cause == "timeout" else "task_error"
        )
        return self._failed(
            task, run, answer.error, cause=cause, traceback=answer.traceback, described=True
        )

    def _failed(
        self,
        task: AssetTask,
        run: TaskRun,
        exc: BaseException,
        *,
        cause: Literal["task_error", "timeout"] = "task_error",
        traceback: str | None = None,
        described: bool = False,
    ) -> RunOutcome:
        """The outcome of a try that raised ``exc`` (or timed out): a failure of the task's
        own, retried after a delay. ``described``: ``exc``'s message already says what
        failed (a try in a child process: its exception's type and message, or how the
        child ended)."""
        delay = retry_delay_for(task, run.failures + 1)
        if task.on_failure is not None or task.on_retry is not None:
            self._errors[run.id] = exc
        error = str(exc) if described else describe_error(exc)
        log.warning(
            "run_try_failed", run_id=run.id, task=task.name, try_number=run.try_number,
            error=error, cause=cause,
        )  # fmt: skip
        return RunOutcome(
            run.id, run.lease_token, False, error=error,
            traceback=traceback if traceback is not None else format_task_traceback(exc),
            retry_delay=delay, cause=cause, retry=task.retries_on(exc),
        )  # fmt: skip

    async def _call(self, task: AssetTask, context: dict[str, Any]) -> Any:
        if task.is_async:
            return await greenback.with_portal_run(task.fn, **context)
        return await self._threads.call(partial(task.fn, **context))

    async def _finish(
        self, run: TaskRun, outcome: RunOutcome
    ) -> tuple[TaskRun | None, TaskRun | None]:
        """Record ``outcome`` and, in the same transaction, claim this slot's next run: the
        run as recorded (None when the record was refused or failed) and the next run."""
        task = self._task_of(run.task)
        with anyio.CancelScope(shield=True):
            try:
                step = await self._step(
                    finish=outcome, claim=1 if self._accepting else 0, peers=len(self._running)
                )
            except RunLeaseLostError as exc:
                log.warning("run_fenced", run_id=run.id, task=run.task, reason=exc.reason)
                return None, None
            except StateStoreError as exc:
                # Not recorded: the lease lapses and the run is tried again.
                log.warning("run_finish_failed", run_id=run.id, error=describe_error(exc))
                return None, None
        done = step.finished
        self.finished += 1
        log.info(
            "run_finished", run_id=run.id, task=run.task,
            state=done.state if done is not None else "?", try_number=run.try_number,
            events=run.event_count,
        )  # fmt: skip
        if outcome.success and task.clear_on_success:
            try:
                await self.backend.aclear(TaskScope(task.name, str(run.id), task.name))
            except StateStoreError as exc:
                log.warning("run_clear_failed", run_id=run.id, error=describe_error(exc))
        return done, step.claimed[0] if step.claimed else None

    async def _call_back(self, run: TaskRun, outcome: RunOutcome, done: TaskRun) -> None:
        error = None if outcome.success else self._errors.get(run.id)
        await call_back(
            self._task_of(run.task), outcome, done, error,
            time_limit=self.settings.callback_timeout, threads=self._threads,
        )  # fmt: skip

    async def _step(
        self, *, finish: RunOutcome | None = None, claim: int, peers: int = 0
    ) -> RunStep:
        """Finish and claim in one step, creating runs when too few are ready. One step of
        this worker at a time creates, the others only claim. While each creation makes as
        many runs as it was allowed (a backlog), the next may make twice as many, up to
        ``_max_batch``: the slots run dry, and wait for a creation, less often. Once one
        makes fewer, the next makes the base number again. A step that created nothing says
        nothing about the backlog: it claimed all it wanted, another worker had just
        created the runs (it waited for that worker's creation, then found the cursor
        moved), or nothing was pending."""
        create = 0 if self._creating else self._batch
        self._creating |= create > 0
        try:
            step = await self.queue.astep_runs(
                self.owner, finish=finish, claim=claim, ttl=self.ttl, tasks=self._names,
                create=create, peers=peers,
            )  # fmt: skip
        finally:
            if create:
                self._creating = False
        if step.created >= create > 0:
            self._batch = min(2 * create, self._max_batch)
        elif step.created:  # fewer than allowed: the backlog is drained
            self._batch = self._base_batch
        return step

    async def _heartbeat(self) -> None:
        interval = self.settings.heartbeat_interval
        while True:
            await anyio.sleep(interval)
            try:
                held = {run_id: f.token for run_id, f in self._running.items()}
                if held:
                    kept = await self.queue.aheartbeat_runs(self.owner, held, self.ttl)
                    for run_id in held.keys() - kept:
                        flight = self._running.get(run_id)
                        if flight is not None:
                            log.warning("run_lease_lost", run_id=run_id, owner=self.owner)
                            flight.scope.cancel()
                await self._free_dead_owners()
            except StateStoreError as exc:
                log.warning("worker_store_error", error=describe_error(exc))

    async def _free_dead_owners(self) -> None:
        running = await self.queue.alist_runs(state="running")
        dead = sorted(
            {r.lease_owner for r in running if r.lease_owner and is_dead_local_owner(r.lease_owner)}
        )
        if dead:
            count = await self.queue.abreak_run_leases(dead)
            log.info("run_leases_freed", owners=dead, runs=count)
