"""A backend wrapper that lets the harness watch a run and kill it at a named point.

:class:`ObservedBackend` forwards every call to the real backend and notes each commit; it has the
services of the backend it wraps (their methods are forwarded generically). Armed
with a :class:`CrashPlan`, it "kills the process" at one point of the trigger's life: from then
on every call raises :class:`SimulatedCrash` before reaching the real backend, so nothing the
dying run does afterwards (its ``finally`` blocks, its ``cleanup()``) becomes durable — just as
nothing happens after a ``kill -9``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any, Literal, cast, get_args

import anyio
from watchkeeper.store import AssetEvent, BaseStateBackend, StateScope
from watchkeeper.store.protocols import (
    EventBatchCommit,
    EventCommit,
    EventLog,
    Put,
    RawEntry,
    Services,
    Writer,
    encode_json,
)

__all__ = ["CRASH_POINTS", "CrashPlan", "CrashPoint", "ObservedBackend", "SimulatedCrash"]

CrashPoint = Literal["before_commit", "after_commit", "between_items"]
"""Where a harness crash hits, relative to the trigger's ``event``-th yielded event (a
:class:`~watchkeeper.triggerer.TriggerEventBatch` is one yielded event: it commits whole):

- ``before_commit``: the event was yielded, the process dies before it commits;
- ``after_commit``: the event and its ``state`` committed, the process dies before the
  generator resumes (the code after ``yield``, e.g. an ack, never runs);
- ``between_items``: the generator resumed after the commit; the process dies at its next
  step that touches the store: a direct write (``asset_state_store.aset``) lands and then the
  process dies, otherwise it dies before the next event commits.
"""

CRASH_POINTS: tuple[CrashPoint, ...] = get_args(CrashPoint)


class SimulatedCrash(Exception):
    """Raised inside a run that the harness killed at a crash point (the harness catches it)."""

    def __init__(self, point: str, event: int) -> None:
        super().__init__(f"simulated crash at {point} of event {event}")
        self.point = point
        self.event = event


@dataclass(frozen=True, slots=True)
class CrashPlan:
    """Kill the run at ``point`` of the ``event``-th event the trigger yields (1-based)."""

    point: CrashPoint
    event: int

    def __post_init__(self) -> None:
        if self.point not in CRASH_POINTS:
            raise ValueError(
                f"unknown crash point {self.point!r}; expected one of {', '.join(CRASH_POINTS)}"
            )
        if not isinstance(self.event, int) or isinstance(self.event, bool) or self.event < 1:
            raise ValueError(f"crash event must be an int >= 1, got {self.event!r}")


class ObservedBackend(BaseStateBackend):
    """Forwards to ``inner``; records commits; dies at the crash point of ``plan``."""

    def __init__(
        self,
        inner: BaseStateBackend,
        plan: CrashPlan | None = None,
        on_crash: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            max_value_bytes=inner.max_value_bytes, max_payload_bytes=inner.max_payload_bytes
        )
        self.inner = inner
        self.plan = plan
        self._on_crash = on_crash
        self.yielded = 0
        """Trigger events (or batches) that reached the commit (suppressed duplicates
        included)."""
        self.committed: list[AssetEvent] = []
        self.crashed: SimulatedCrash | None = None
        self.last_commit_at = 0.0
        """``anyio.current_time()`` of the latest commit (suppressed duplicates included)."""
        self.first_commit = anyio.Event()
        forwarded = {
            f.name: None
            if (svc := getattr(inner.services, f.name)) is None
            else _Forwarded(self, svc)
            for f in fields(Services)
        }
        if inner.services.events is not None:
            forwarded["events"] = _ObservedEvents(self, inner.services.events)
        self.services = Services(**cast("dict[str, Any]", forwarded))

    def _describe(self) -> str:
        return f"inner={self.inner!r} crashed={self.crashed is not None}"

    async def _die(self, point: str, event: int) -> SimulatedCrash:
        self.crashed = SimulatedCrash(point, event)
        if self._on_crash is not None:
            with anyio.move_on_after(5, shield=True):
                await self._on_crash()
        return self.crashed

    def _check_alive(self) -> None:
        if self.crashed is not None:
            raise self.crashed

    async def _direct_write(self, write: Callable[[], Awaitable[Any]]) -> Any:
        """A write of the trigger's own (not through an event): ``between_items`` hits here."""
        self._check_alive()
        result = await write()
        plan = self.plan
        if plan is not None and plan.point == "between_items" and self.yielded == plan.event:
            raise await self._die("between_items", plan.event)
        return result

    async def _commit(self, commit: Callable[[], Awaitable[list[AssetEvent]]]) -> list[AssetEvent]:
        """One yielded event's (or batch's) commit, with the crash points around it."""
        self._check_alive()
        plan = self.plan
        number = self.yielded + 1
        if plan is not None:
            if plan.point == "before_commit" and number == plan.event:
                raise await self._die("before_commit", number)
            if plan.point == "between_items" and number == plan.event + 1:
                raise await self._die("between_items", plan.event)
        written = await commit()
        self.yielded = number
        self.committed.extend(written)
        self.last_commit_at = anyio.current_time()
        self.first_commit.set()
        if plan is not None and plan.point == "after_commit" and number == plan.event:
            raise await self._die("after_commit", number)
        return written

    # -- state hooks: reads pass, writes are direct writes -----------------------------------------

    async def _aget(self, scope: StateScope, key: str) -> RawEntry | None:
        self._check_alive()
        return await self.inner.aget_raw(scope, key)

    async def _aput(self, put: Put) -> int:
        version: int = await self._direct_write(lambda: self.inner.aput(put))
        return version

    async def _adelete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        await self._direct_write(lambda: self.inner.adelete(scope, key, writer=writer))
        return True

    async def _aclear(
        self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None
    ) -> int:
        count: int = await self._direct_write(
            lambda: self.inner.aclear(scope, all_map_indices=all_map_indices, writer=writer)
        )
        return count

    async def _alist(self, scope: StateScope) -> list[RawEntry]:
        self._check_alive()
        return [
            RawEntry(
                key=e.key,
                value_json=encode_json(e.value),
                version=e.version,
                updated_at=e.updated_at,
                writer=e.writer,
                expires_at=e.expires_at,
                never_expire=e.never_expire,
            )
            for e in await self.inner.alist(scope)
        ]

    async def amigrate(self) -> list[int]:
        self._check_alive()
        return await self.inner.amigrate()


class _Forwarded:
    """A service of the wrapped backend whose calls first check the run is alive."""

    def __init__(self, owner: ObservedBackend, service: object) -> None:
        self._owner = owner
        self._service = service

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._service, name)
        if not name.startswith("a") or not callable(found):
            return found

        async def forward(*args: Any, **kwargs: Any) -> Any:
            self._owner._check_alive()
            return await found(*args, **kwargs)

        return forward


class _ObservedEvents(_Forwarded):
    """The event log of the wrapped backend, each commit noted and crashed as planned."""

    _service: EventLog

    async def acommit(self, commit: EventCommit) -> list[AssetEvent]:
        return await self._owner._commit(lambda: self._service.acommit(commit))

    async def acommit_batch(self, batch: EventBatchCommit) -> list[AssetEvent]:
        return await self._owner._commit(lambda: self._service.acommit_batch(batch))
