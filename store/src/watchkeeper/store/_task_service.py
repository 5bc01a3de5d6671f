"""``TasksService``: event consumers, task specs and cursors, runs and run leases, their rules
and argument checks written once over a driver's primitives (as the services of
:mod:`._services`); the rules of runs themselves are :mod:`._tasks`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ._checks import check_items, check_limit
from ._drivers import (
    RunsDriver,
    TaskSpecsDriver,
)
from ._leases import check_owner, check_ttl
from ._services import Service
from ._tasks import (
    OutletEvent,
    RunOutcome,
    RunStep,
    StateWrite,
    TaskInfo,
    TaskRun,
    TaskSpec,
    TryCause,
    check_state,
)
from ._types import AssetEvent, Writer
from ._values import check_key, check_name, value_from_text
from .errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    from ._backend import BaseStateBackend

__all__ = ["TasksService"]


def _check_run_id(run_id: object) -> int:
    return check_limit(run_id, what="run_id")


def _check_names(what: str, names: object) -> list[str]:
    return [check_name(n, what=what) for n in check_items(what, names, str, "str names")]


def _check_outcome(outcome: object) -> RunOutcome:
    """A try's outcome with checked fields (the one place they are checked)."""
    if not isinstance(outcome, RunOutcome):
        raise ArgumentTypeError("finish", outcome, "a RunOutcome")
    _check_run_id(outcome.run_id)
    check_limit(outcome.token, what="token", least=0)
    check_items("outlets", outcome.outlets, OutletEvent, "OutletEvent objects")
    for what, text in (("error", outcome.error), ("traceback", outcome.traceback)):
        if text is not None and not isinstance(text, str):
            raise ArgumentTypeError(what, text, "a str or None")
    if not isinstance(outcome.retry_delay, timedelta):
        raise ArgumentTypeError("retry_delay", outcome.retry_delay, "a timedelta")
    if outcome.retry_delay < timedelta(0):
        raise InvalidArgumentError("retry_delay", outcome.retry_delay, "must not be negative")
    if outcome.cause not in _OWN_CAUSES:
        raise InvalidArgumentError(
            "cause", outcome.cause, f"must be one of {', '.join(_OWN_CAUSES)} (a worker_lost "
            "try is recorded by the store when its lease lapses)",
        )  # fmt: skip
    return RunOutcome(
        outcome.run_id, outcome.token, bool(outcome.success), tuple(outcome.outlets),
        outcome.error, outcome.traceback, outcome.retry_delay, outcome.cause,
        bool(outcome.retry),
    )  # fmt: skip


_OWN_CAUSES = ("task_error", "timeout")


class TasksService(Service[TaskSpecsDriver]):
    """Event consumers and the task queue (:class:`~.protocols.TaskQueue`): ``driver`` keeps
    the consumers and tasks, ``runs`` the runs (often the same object)."""

    __slots__ = ("_runs",)

    def __init__(self, store: BaseStateBackend, driver: TaskSpecsDriver, runs: RunsDriver) -> None:
        super().__init__(store, driver)
        self._runs = runs

    # -- event consumers ---------------------------------------------------------------------

    async def aconsumer_position(self, name: str) -> int:
        """The id of the last event ``name`` acknowledged (0: none yet)."""
        self._store._check_open()
        return await self._driver._aconsumer_position(check_name(name, what="consumer name"))

    async def aconsumer_fetch(
        self, name: str, *, assets: Sequence[str] | None = None, limit: int = 100
    ) -> list[AssetEvent]:
        """Up to ``limit`` events after ``name``'s cursor, in commit order (of ``assets``)."""
        self._store._check_open()
        name, limit = check_name(name, what="consumer name"), check_limit(limit)
        only = None if assets is None else _check_names("assets", assets)
        if only == []:
            return []
        return await self._driver._aconsumer_fetch(name, only, limit)

    async def aconsumer_ack(
        self,
        name: str,
        event_id: int,
        *,
        state: Sequence[StateWrite] = (),
        expected: int | None = None,
        writer: Writer | None = None,
    ) -> int:
        """Move ``name``'s cursor to ``event_id`` and apply ``state``, in one transaction."""
        self._store._check_open()
        name = check_name(name, what="consumer name")
        event_id = check_limit(event_id, what="event_id", least=0)
        if expected is not None:
            check_limit(expected, what="expected", least=0)
        writes = check_items("state", state, StateWrite, "StateWrite objects")
        checked = [self._state_write(w) for w in writes if isinstance(w, StateWrite)]
        return await self._driver._aconsumer_ack(name, event_id, checked, expected, writer)

    def _state_write(self, write: StateWrite) -> StateWrite:
        """``write`` checked by the rules of every other state write (scope, key, value)."""
        self._store._check_scope(write.scope)
        key = check_key(write.key)
        text = value_from_text(key, write.value_json, max_value_bytes=self._store.max_value_bytes)
        return StateWrite(write.scope, key, text)

    # -- tasks -------------------------------------------------------------------------------

    async def async_tasks(self, specs: Sequence[TaskSpec]) -> None:
        """Insert or update these tasks; a new task's cursors start at the end of the log, a
        removed one is present again (its cursors where they were)."""
        self._store._check_open()
        batch = check_items("specs", specs, TaskSpec, "TaskSpec objects")
        if batch:
            await self._driver._async_tasks([s for s in batch if isinstance(s, TaskSpec)])

    async def aretire_tasks(self, keep: Sequence[str]) -> list[str]:
        """Mark removed every task not named in ``keep`` (the tasks the definitions declare
        now); return the names of those this call marked, sorted. A removed task keeps its
        cursors and runs and gets no new run; :meth:`async_tasks` declares it again."""
        self._store._check_open()
        return await self._driver._aretire_tasks(sorted(set(_check_names("keep", keep))))

    async def adelete_task(self, name: str) -> None:
        """Forget task ``name`` for good: its spec and its cursors (its runs are kept, and
        none is claimed unless a task of that name is declared again).

        Raises:
            TaskNotFoundError: no task is named ``name``.
            RunStateError: a run of the task is running (a worker holds it): nothing changed.
        """
        self._store._check_open()
        await self._driver._adelete_task(check_name(name, what="task name"))

    async def alist_tasks(self) -> list[TaskInfo]:
        """Every registered task with its cursors and pending events, by name."""
        self._store._check_open()
        return await self._driver._alist_tasks()

    async def aset_task_paused(self, name: str, paused: bool) -> None:
        """Pause (no new runs, none claimed) or resume a task."""
        self._store._check_open()
        await self._driver._aset_task_paused(check_name(name, what="task name"), bool(paused))

    async def arewind_task(
        self, name: str, asset: str, to_event_id: int, *, writer: Writer | None = None
    ) -> None:
        """Move a task's cursor on ``asset`` back, so ``to_event_id`` and after run again."""
        self._store._check_open()
        name, asset = check_name(name, what="task name"), check_name(asset, what="asset name")
        await self._driver._arewind_task(
            name, asset, check_limit(to_event_id, what="to_event_id"), writer
        )

    async def acreate_run(self, name: str) -> TaskRun | None:
        """The next run of ``name`` from its pending events; ``None``: nothing to run."""
        created = await self.acreate_runs(name, 1)
        return created[0] if created else None

    async def acreate_runs(self, name: str, max_runs: int) -> list[TaskRun]:
        """Up to ``max_runs`` runs of ``name`` from its pending events, in one transaction."""
        self._store._check_open()
        name, max_runs = check_name(name, what="task name"), check_limit(max_runs, what="max_runs")
        return await self._runs._acreate_runs(name, max_runs)

    # -- runs --------------------------------------------------------------------------------

    async def aclaim_runs(
        self,
        owner: str,
        *,
        limit: int,
        ttl: timedelta | float,
        tasks: Sequence[str] | None = None,
    ) -> list[TaskRun]:
        """Claim up to ``limit`` ready runs for ``owner`` under a lease of ``ttl``."""
        self._store._check_open()
        owner, span, limit = check_owner(owner), check_ttl(ttl), check_limit(limit)
        only = None if tasks is None else _check_names("tasks", tasks)
        if only == []:
            return []
        return list((await self._runs._astep_runs(owner, None, limit, span, only, 0, 0)).claimed)

    async def astep_runs(
        self,
        owner: str,
        *,
        finish: RunOutcome | None = None,
        claim: int = 0,
        ttl: timedelta | float,
        tasks: Sequence[str] | None = None,
        create: int = 0,
        peers: int = 0,
    ) -> RunStep:
        """Finish the try ``finish`` reports (fenced by its lease, as :meth:`afinish_run`) and
        claim up to ``claim`` ready runs for ``owner`` under a lease of ``ttl``, in one
        transaction; when fewer are ready, create up to ``create`` runs of ``tasks`` from
        their pending events and claim from those. A refused finish claims nothing.

        ``peers`` is a hint: how many other steps of ``owner`` may follow this one at once
        (its other slots running a task). A backend that sends neighbouring steps together
        may wait a fraction of a millisecond for them."""
        self._store._check_open()
        owner, span = check_owner(owner), check_ttl(ttl)
        claim, create = (
            check_limit(claim, what="claim", least=0),
            check_limit(create, what="create", least=0),
        )
        peers = check_limit(peers, what="peers", least=0)
        only = None if tasks is None else _check_names("tasks", tasks)
        if finish is not None:
            finish = _check_outcome(finish)
        if only == []:
            claim = create = 0
        if finish is None and claim == 0:
            return RunStep(None, ())
        return await self._runs._astep_runs(owner, finish, claim, span, only, create, peers)

    async def aheartbeat_runs(
        self, owner: str, runs: Mapping[int, int], ttl: timedelta | float
    ) -> set[int]:
        """Renew the leases ``owner`` holds on ``runs`` (``{run_id: token}``); return those held."""
        self._store._check_open()
        owner, span = check_owner(owner), check_ttl(ttl)
        if not isinstance(runs, Mapping):
            raise ArgumentTypeError("runs", runs, "a mapping of run ids to lease tokens")
        held = {_check_run_id(r): check_limit(t, what="token", least=0) for r, t in runs.items()}
        if not held:
            return set()
        return await self._runs._aheartbeat_runs(owner, held, span)

    async def abreak_run_leases(self, owners: Sequence[str]) -> int:
        """Expire the run leases of ``owners`` now (dead workers); return how many."""
        self._store._check_open()
        names = sorted({check_owner(o) for o in check_items("owners", owners, str, "str owners")})
        if not names:
            return 0
        return await self._runs._abreak_run_leases(names)

    async def afinish_run(
        self,
        run_id: int,
        owner: str,
        token: int,
        *,
        success: bool,
        outlets: Sequence[OutletEvent] = (),
        error: str | None = None,
        traceback: str | None = None,
        retry_delay: timedelta = timedelta(0),
        cause: TryCause = "task_error",
    ) -> TaskRun:
        """Finish the try ``owner`` holds with ``token``: commit ``outlets`` on success, else
        record ``error`` (``cause``: ``task_error`` or ``timeout``) and queue a retry while
        tries remain (fenced by the lease)."""
        self._store._check_open()
        owner = check_owner(owner)
        emitted = check_items("outlets", outlets, OutletEvent, "OutletEvent objects")
        kept = tuple(o for o in emitted if isinstance(o, OutletEvent))
        outcome = _check_outcome(
            RunOutcome(run_id, token, bool(success), kept, error, traceback, retry_delay, cause)
        )
        step = await self._runs._astep_runs(owner, outcome, 0, timedelta(seconds=1), None, 0, 0)
        assert step.finished is not None
        return step.finished

    async def aget_run(self, run_id: int) -> TaskRun:
        """One run, with its events."""
        self._store._check_open()
        return await self._runs._aget_run(_check_run_id(run_id))

    async def alist_runs(
        self,
        *,
        task: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        before: int | None = None,
        event_ids: bool = False,
    ) -> list[TaskRun]:
        """Runs, newest first (of ``task``, in ``state``, with ids below ``before``, at most
        ``limit``), without events; with ``event_ids``, each run's event ids.

        Paging: pass the id of the last run of a page as ``before`` to get the next one (runs
        created meanwhile have higher ids, so no run is listed twice or skipped)."""
        self._store._check_open()
        check_state(state)
        name = None if task is None else check_name(task, what="task name")
        count = None if limit is None else check_limit(limit)
        below = None if before is None else check_limit(before, what="before")
        runs = await self._runs._alist_runs(name, state, count, below)
        if not event_ids or not runs:
            return runs
        ids = await self._runs._arun_event_ids([r.id for r in runs])
        return [replace(r, event_ids=tuple(ids.get(r.id, ()))) for r in runs]

    async def aretry_run(self, run_id: int) -> TaskRun:
        """Queue a failed run again with one more try."""
        self._store._check_open()
        return await self._runs._aretry_run(_check_run_id(run_id))

    async def acount_runs(self) -> dict[tuple[str, str], int]:
        """How many runs each task has in each state (pairs with no run are left out)."""
        self._store._check_open()
        return await self._driver._acount_runs()

    async def acount_tries(self) -> dict[tuple[str, str, bool], int]:
        """How many failed tries each task's runs recorded, by cause and by whether the try
        failed its run: ``{(task, cause, final): count}``. A run's tries stay recorded (a
        retry adds to them), so every count only grows."""
        self._store._check_open()
        return await self._runs._acount_tries()

    async def aoldest_pending(self) -> dict[tuple[str, str], datetime]:
        """When the oldest event past each task's cursor on each scheduled asset was
        committed: ``{(task, asset): created_at}`` (pairs with nothing pending left out)."""
        self._store._check_open()
        return await self._driver._aoldest_pending()

    async def arun_durations(self, bounds: Sequence[float]) -> dict[str, tuple[list[int], float]]:
        """The durations of the successful tries of each task's successful runs, in buckets:
        ``{task: (counts, total seconds)}``, ``counts[i]`` the runs of at most ``bounds[i]``
        seconds and above ``bounds[i - 1]``, the last one those above every bound. A
        successful run stays so: every count only grows."""
        self._store._check_open()
        edges = [float(b) for b in bounds]
        if edges != sorted(edges):
            raise InvalidArgumentError("bounds", bounds, "must be in increasing order")
        return await self._runs._arun_durations(tuple(edges))
