"""``EventConsumer``: read the event log in your own process, with a durable cursor."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._backend import BaseStateBackend
from ._tasks import encode_state_writes
from ._types import AssetEvent, StateScope, Writer
from ._values import JSONValue, check_name

__all__ = ["EventConsumer"]


class EventConsumer:
    """A named consumer of asset events: ``fetch`` what comes after its cursor, ``ack`` to move it.

    The cursor lives in the store, so a restarted process resumes after the last
    acknowledged event. ``ack(event_id, state=[(scope, key, value), ...])`` writes the state in
    the same transaction as the cursor: both happen, or neither. ``assets`` restricts what
    ``fetch`` returns (the cursor is still one position in the whole log).
    """

    def __init__(
        self,
        backend: BaseStateBackend,
        name: str,
        *,
        assets: Sequence[str] | None = None,
    ) -> None:
        self.backend = backend
        self._consumers = backend.tasks
        self.name = check_name(name, what="consumer name")
        self.assets = None if assets is None else tuple(assets)
        self.writer = Writer("api", f"consumer:{name}")

    def __repr__(self) -> str:
        return f"<EventConsumer name={self.name!r} assets={self.assets!r}>"

    async def position(self) -> int:
        """The id of the last acknowledged event (0: none yet)."""
        return await self._consumers.aconsumer_position(self.name)

    async def fetch(self, limit: int = 100) -> list[AssetEvent]:
        """Up to ``limit`` events after the cursor, in commit order."""
        return await self._consumers.aconsumer_fetch(self.name, assets=self.assets, limit=limit)

    async def ack(
        self,
        event: AssetEvent | int,
        *,
        state: Iterable[tuple[StateScope, str, JSONValue]] = (),
        expected: int | None = None,
    ) -> int:
        """Move the cursor to ``event`` (an event or its id) and write ``state`` with it."""
        event_id = event.id if isinstance(event, AssetEvent) else event
        writes = encode_state_writes(self.backend, state)
        return await self._consumers.aconsumer_ack(
            self.name, event_id, state=writes, expected=expected, writer=self.writer
        )
