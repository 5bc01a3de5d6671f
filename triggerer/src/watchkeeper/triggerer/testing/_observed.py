"""A backend wrapper that lets the harness watch a run and kill it at a named point.

:class:`ObservedBackend` forwards every call to the real backend and notes each commit. Armed
with a :class:`CrashPlan`, it "kills the process" at one point of the trigger's life: from then
on every call raises :class:`SimulatedCrash` before reaching the real backend, so nothing the
dying run does afterwards (its ``finally`` blocks, its ``cleanup()``) becomes durable — just as
nothing happens after a ``kill -9``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, get_args

import anyio
from watchkeeper.store import (
    Asset,
    AssetEvent,
    AssetInfo,
    BaseStateBackend,
    EventCommit,
    GcReport,
    RawEntry,
    StateScope,
    TriggerStatus,
    Writer,
    encode_json,
)

__all__ = ["CRASH_POINTS", "CrashPlan", "CrashPoint", "ObservedBackend", "SimulatedCrash"]

CrashPoint = Literal["before_commit", "after_commit", "between_items"]
"""Where a harness crash hits, relative to the trigger's ``event``-th yielded event:

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

    supports_events: ClassVar[bool] = True

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
        """Trigger events that reached the commit (suppressed duplicates included)."""
        self.committed: list[AssetEvent] = []
        self.crashed: SimulatedCrash | None = None
        self.last_commit_at = 0.0
        """``anyio.current_time()`` of the latest commit (suppressed duplicates included)."""
        self.first_commit = anyio.Event()

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

    # -- events ----------------------------------------------------------------------------------

    async def acommit_event(self, commit: EventCommit) -> list[AssetEvent]:
        self._check_alive()
        plan = self.plan
        number = self.yielded + 1
        if plan is not None:
            if plan.point == "before_commit" and number == plan.event:
                raise await self._die("before_commit", number)
            if plan.point == "between_items" and number == plan.event + 1:
                raise await self._die("between_items", plan.event)
        written = await self.inner.acommit_event(commit)
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

    async def _aput(
        self,
        scope: StateScope,
        key: str,
        value_json: str,
        *,
        expires_at: datetime | None,
        never_expire: bool,
        expected_version: int | None,
        writer: Writer | None,
    ) -> int:
        version: int = await self._direct_write(
            lambda: self.inner.aput_json(
                scope,
                key,
                value_json,
                expires_at=expires_at,
                never_expire=never_expire,
                expected_version=expected_version,
                writer=writer,
            )
        )
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

    # -- the rest of the metastore, forwarded --------------------------------------------------

    async def amigrate(self) -> list[int]:
        self._check_alive()
        return await self.inner.amigrate()

    async def aregister_assets(self, assets: Sequence[Asset]) -> None:
        self._check_alive()
        await self.inner.aregister_assets(assets)

    async def adeactivate_asset(self, name: str) -> bool:
        self._check_alive()
        return await self.inner.adeactivate_asset(name)

    async def alist_assets(self, *, active_only: bool = False) -> list[AssetInfo]:
        self._check_alive()
        return await self.inner.alist_assets(active_only=active_only)

    async def alist_events(
        self, *, asset: str | None = None, since_id: int = 0, limit: int | None = None
    ) -> list[AssetEvent]:
        self._check_alive()
        return await self.inner.alist_events(asset=asset, since_id=since_id, limit=limit)

    async def acollect_garbage(
        self,
        *,
        default_retention_days: int = 30,
        batch_size: int = 0,
        dry_run: bool = False,
        now: datetime | None = None,
        event_retention_days: int = 30,
        dedup_retention_days: int = 7,
    ) -> GcReport:
        self._check_alive()
        return await self.inner.acollect_garbage(
            default_retention_days=default_retention_days,
            batch_size=batch_size,
            dry_run=dry_run,
            now=now,
            event_retention_days=event_retention_days,
            dedup_retention_days=dedup_retention_days,
        )

    async def asave_trigger_status(self, statuses: Sequence[TriggerStatus]) -> None:
        self._check_alive()
        await self.inner.asave_trigger_status(statuses)

    async def adelete_trigger_status(self, trigger_ids: Sequence[str]) -> None:
        self._check_alive()
        await self.inner.adelete_trigger_status(trigger_ids)

    async def alist_trigger_status(self) -> list[TriggerStatus]:
        self._check_alive()
        return await self.inner.alist_trigger_status()
