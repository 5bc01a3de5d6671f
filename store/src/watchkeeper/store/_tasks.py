"""Tasks on asset events, the store's half: event consumers, task cursors, runs and their leases.

Two capabilities, each a ``runtime_checkable`` Protocol the built-in backends satisfy:

- :class:`EventConsumers`: a named consumer with a durable cursor on the event log. ``fetch``
  returns the events after the cursor; ``ack`` moves the cursor and, in the same transaction,
  applies optional state writes. What a user needs to consume events in their own process.
- :class:`TaskQueue`: what the worker runtime needs. Each task keeps one cursor per scheduled
  asset; creating a run and moving the cursors past its events is one transaction, so every
  event reaches exactly one run of each task that schedules it. Runs are claimed under a lease
  (owner, token, expiry); finishing a run is fenced by that lease and commits the run's outlet
  events (one per outlet) in the same transaction.

The rules every backend shares live here, once: the argument checks (applied by
:class:`~._taskstore.TaskStoreBackend` before any backend hook), which pending events make a
run (:func:`plan_run`), what a failure or a lapsed lease does to a run (:func:`after_failure`).
Times come from the backend's ``clock``, as for trigger leases (:mod:`._leases`).

Event ids are commit order on every backend: SQLite and memory assign them under their one
writer; on PostgreSQL every event-inserting transaction holds an advisory lock (shared), and
a reader that moves a cursor goes no further than an id below which the holders have all
ended (see :mod:`.postgres.tasks`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from ._checks import check_limit
from ._run_errors import (
    LAPSED,
    MAX_LOST_TRIES,
    TRY_CAUSES,
    RunError,
    TryCause,
    errors_from_json,
    errors_to_json,
    ids_from_json,
    ids_to_json,
    lapsed_error,
)
from ._types import AssetEvent, StateScope, Writer
from ._values import JSONValue, check_name
from .errors import ArgumentTypeError, InvalidArgumentError, RunStateError

__all__ = [
    "LAPSED",
    "MAX_LOST_TRIES",
    "RUN_STATES",
    "TRY_CAUSES",
    "OutletEvent",
    "RunError",
    "RunOutcome",
    "RunStep",
    "StateWrite",
    "TaskInfo",
    "TaskRun",
    "TaskSpec",
    "TryCause",
    "after_failure",
    "after_lost",
    "check_rewind",
    "check_state",
    "deleting_running",
    "errors_from_json",
    "errors_to_json",
    "ids_from_json",
    "ids_to_json",
    "lapsed_error",
    "lost_reason",
    "plan_run",
    "plan_runs",
    "window_waits",
]

RunState = Literal["queued", "running", "success", "failed"]
RUN_STATES: tuple[RunState, ...] = ("queued", "running", "success", "failed")


def check_state(state: object) -> None:
    """A run state filter: ``None`` or one of :data:`RUN_STATES`."""
    if state is not None and state not in RUN_STATES:
        raise InvalidArgumentError("state", state, f"must be one of {', '.join(RUN_STATES)}")


def check_rewind(spec: TaskSpec, asset: str, to_event_id: int, cursor: int, last: int) -> int:
    """The cursor a rewind of ``spec``'s cursor on ``asset`` to ``to_event_id`` sets (the
    events from ``to_event_id`` on run again), checked against the task's ``cursor`` there and
    the ``last`` event id of the asset (0: none). A rewind only moves a cursor back.

    Raises:
        InvalidArgumentError: ``asset`` is not in the task's schedule, or ``to_event_id`` is
            past the asset's last event or after the cursor (those events are pending).
    """
    if asset not in spec.assets:
        raise InvalidArgumentError(
            "asset",
            asset,
            f"is not in the schedule of task {spec.name!r} ({', '.join(spec.assets)})",
        )
    if to_event_id > last:
        where = f"the last event of {asset!r} is {last}" if last else f"{asset!r} has no events"
        raise InvalidArgumentError(
            "to_event_id",
            to_event_id,
            f"is past the end of the log ({where}); a rewind only moves back",
        )
    if to_event_id > cursor:
        raise InvalidArgumentError(
            "to_event_id", to_event_id,
            f"is after the cursor of task {spec.name!r} on {asset!r} ({cursor}): the events after "
            f"it are still pending; a rewind only moves back, to an id of at most {cursor}",
        )  # fmt: skip
    return to_event_id - 1


def deleting_running(name: str, run_id: int) -> RunStateError:
    """Why task ``name`` cannot be deleted: its run ``run_id`` is running. A worker holds
    that try; deleting the task under it would leave the try's finish nothing to go by."""
    return RunStateError(
        run_id, "running", f"so task {name!r} cannot be deleted until it ends; nothing was changed"
    )


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What the store keeps of a declared task: its scheduled assets and its limits.

    ``mode`` ``"all"`` runs the task once every scheduled asset has a new event, ``"any"``
    once any has. ``max_tries`` is ``retries + 1``. ``batch_window``: seconds a run waits
    for more events after the first pending one (unless ``max_events`` are pending already);
    ``max_active_runs``: the most runs of the task running at once across every worker
    (``None``: no limit).
    """

    name: str
    assets: tuple[str, ...]
    mode: Literal["all", "any"] = "all"
    max_events: int = 100
    max_tries: int = 1
    batch_window: float = 0.0
    max_active_runs: int | None = None

    def __post_init__(self) -> None:
        check_name(self.name, what="TaskSpec.name")
        assets = tuple(self.assets)
        if not assets or not all(isinstance(a, str) and a for a in assets):
            raise InvalidArgumentError("TaskSpec.assets", assets, "must be non-empty asset names")
        if len(set(assets)) != len(assets):
            raise InvalidArgumentError("TaskSpec.assets", assets, "names an asset twice")
        object.__setattr__(self, "assets", assets)
        if self.mode not in ("all", "any"):
            raise InvalidArgumentError("TaskSpec.mode", self.mode, "must be 'all' or 'any'")
        check_limit(self.max_events, what="TaskSpec.max_events")
        check_limit(self.max_tries, what="TaskSpec.max_tries")
        window = self.batch_window
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise ArgumentTypeError("TaskSpec.batch_window", window, "a number of seconds")
        if not math.isfinite(window) or window < 0:
            raise InvalidArgumentError(
                "TaskSpec.batch_window", window, "must be a finite number of seconds >= 0"
            )
        object.__setattr__(self, "batch_window", float(window))
        if self.max_active_runs is not None:
            check_limit(self.max_active_runs, what="TaskSpec.max_active_runs")


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A registered task: its spec, whether it is paused, its cursor and pending events per
    asset, and ``removed_at``: when the definitions stopped declaring it (``None``: declared).
    A removed task keeps its cursors and runs, gets no new run, and is present again once
    declared again."""

    spec: TaskSpec
    paused: bool
    cursors: Mapping[str, int]
    pending: Mapping[str, int]
    cursor_writers: Mapping[str, Writer | None] = field(default_factory=dict)
    removed_at: datetime | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def removed(self) -> bool:
        """Whether the definitions no longer declare the task (see ``removed_at``)."""
        return self.removed_at is not None


@dataclass(frozen=True, slots=True)
class TaskRun:
    """One run of a task: the events it owns, its state, its current try and its lease.

    ``try_number`` counts every try; ``failures`` the tries the task itself failed (an
    error or a timeout: the run fails once they reach ``max_tries``), ``lost_tries`` those
    lost to the infrastructure (the run fails once they reach :data:`MAX_LOST_TRIES`).
    ``events`` is filled by the calls that hand a run to a worker or show one run (claim,
    get); listings leave it empty and give ``event_count``, and ``event_ids`` (the ids of
    its events, in order) when asked for.
    """

    id: int
    task: str
    state: RunState
    try_number: int
    max_tries: int
    event_count: int
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    not_before: datetime | None = None
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires_at: datetime | None = None
    errors: tuple[RunError, ...] = ()
    outlet_event_ids: tuple[int, ...] = ()
    events: tuple[AssetEvent, ...] = ()
    failures: int = 0
    lost_tries: int = 0
    event_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class OutletEvent:
    """The event a successful run emits on one outlet asset (``payload_json``: JSON text)."""

    asset: str
    payload_json: str = "{}"


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How one try ended, as the worker reports it: success with the outlet events, or a
    failure (``error``, ``traceback``; ``cause`` ``task_error`` or ``timeout``) retried after
    ``retry_delay`` while tries remain, unless ``retry`` is False (the task's ``retry_on`` does
    not name the error): then the run fails at once."""

    run_id: int
    token: int
    success: bool
    outlets: tuple[OutletEvent, ...] = ()
    error: str | None = None
    traceback: str | None = None
    retry_delay: timedelta = timedelta(0)
    cause: TryCause = "task_error"
    retry: bool = True


@dataclass(frozen=True, slots=True)
class RunStep:
    """What :meth:`TaskQueue.astep_runs` did in its transaction: the finished run (without
    its events), the runs it claimed for the worker (with their events), and how many runs
    it created (claimed or left queued; as many as it was allowed means more events may be
    pending)."""

    finished: TaskRun | None
    claimed: tuple[TaskRun, ...]
    created: int = 0


@dataclass(frozen=True, slots=True)
class StateWrite:
    """One state write committed with a consumer's acknowledgement (JSON text, validated)."""

    scope: StateScope
    key: str
    value_json: str


# -- the shared rules -----------------------------------------------------------------------------


def plan_run(
    spec: TaskSpec, pending: Mapping[str, Sequence[tuple[int, str]]]
) -> tuple[list[tuple[int, str]], dict[str, int]] | None:
    """Which events make the next run of ``spec``, and the cursors after it; ``None``: no run.

    ``pending`` maps each scheduled asset to its events after the task's cursor, ``(id,
    asset)`` in id order (at most ``max_events`` each are needed). ``"all"`` needs an event on
    every asset, ``"any"`` on one. The run takes the oldest ``max_events`` events across the
    assets, and each asset's cursor moves to the last of its events the run took.
    """
    have = [asset for asset in spec.assets if pending.get(asset)]
    if not have or (spec.mode == "all" and len(have) != len(spec.assets)):
        return None
    merged = sorted(event for asset in have for event in pending[asset])[: spec.max_events]
    cursors: dict[str, int] = {}
    for event_id, asset in merged:
        cursors[asset] = max(cursors.get(asset, 0), event_id)
    return merged, cursors


def window_waits(spec: TaskSpec, pending: int, oldest: datetime | None, now: datetime) -> bool:
    """Whether creating runs of ``spec`` waits for its batch window: fewer than
    ``max_events`` events pending (``pending``, across its assets) and the oldest of them
    (created at ``oldest``) younger than ``batch_window`` seconds at ``now``. A window adds
    up to its length to an event's latency, and lets one run take what arrives meanwhile."""
    if spec.batch_window <= 0 or oldest is None or pending >= spec.max_events:
        return False
    return now - oldest < timedelta(seconds=spec.batch_window)


def plan_runs(
    spec: TaskSpec, pending: Mapping[str, Sequence[tuple[int, str]]], max_runs: int
) -> list[tuple[list[tuple[int, str]], dict[str, int]]]:
    """Up to ``max_runs`` successive runs of ``spec`` (:func:`plan_run` each, in order).

    ``pending`` needs at most ``max_runs * max_events`` events per asset: each run takes at
    most ``max_events``, so every plan sees the first ``max_events`` left on each asset.
    """
    left = {asset: list(pending.get(asset, ())) for asset in spec.assets}
    plans: list[tuple[list[tuple[int, str]], dict[str, int]]] = []
    while len(plans) < max_runs:
        plan = plan_run(spec, {a: events[: spec.max_events] for a, events in left.items()})
        if plan is None:
            break
        for asset, cursor in plan[1].items():
            left[asset] = [e for e in left[asset] if e[0] > cursor]
        plans.append(plan)
    return plans


def after_failure(
    failures: int, max_tries: int, now: datetime, retry_delay: timedelta, *, retry: bool = True
) -> tuple[RunState, datetime | None]:
    """A run whose task failed a try (``failures``: its own failures, this one included):
    queued again at ``now + retry_delay`` while fewer than ``max_tries`` and ``retry``, else
    failed."""
    if retry and failures < max_tries:
        return "queued", now + retry_delay
    return "failed", None


def after_lost(lost_tries: int) -> RunState:
    """A run whose try was lost to the infrastructure (``lost_tries``: this one included):
    queued again at once (not counted against ``retries``) until :data:`MAX_LOST_TRIES`."""
    return "queued" if lost_tries < MAX_LOST_TRIES else "failed"


def lost_reason(
    state: str,
    lease_owner: str | None,
    lease_token: int,
    expires: datetime | None,
    owner: str,
    token: int,
    now: datetime,
) -> str | None:
    """Why ``owner`` with ``token`` does not hold a run's lease at ``now`` (the fence of
    ``afinish_run`` and ``aheartbeat_runs``); ``None`` when it does."""
    if state != "running":
        return f"the run is {state}"
    if lease_owner != owner or lease_token != token:
        return f"{lease_owner!r} holds it with token {lease_token}"
    if expires is None or expires <= now:
        return f"it expired at {expires.isoformat() if expires else '?'}"
    return None


def encode_state_writes(
    backend: Any, writes: Iterable[tuple[StateScope, str, JSONValue]]
) -> list[StateWrite]:
    """Validate ``(scope, key, value)`` triples as ``aset`` does; return them as JSON text."""
    out: list[StateWrite] = []
    for scope, key, value in writes:
        put = backend._prepare_put(scope, key, value, None, None, None)
        out.append(StateWrite(put.scope, put.key, put.value_json))
    return out
