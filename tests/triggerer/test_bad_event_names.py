"""A watcher's event with a bad dedup key or state key fails the same way on every backend.

A NUL in a ``dedup_key`` was stored by SQLite and failed the watcher on PostgreSQL
(as a driver error, five times). The event is now refused when its commit is built, before any
I/O, with the store's :class:`InvalidNameError`, whatever the backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from watchkeeper.store import Asset, InvalidKeyError, InvalidNameError
from watchkeeper.store.protocols import BaseStateBackend
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
from watchkeeper.triggerer.testing import run_trigger

ORDERS = Asset("orders")


class ThenBad(BaseEventTrigger):
    """One good event with a watermark, then one whose ``dedup_key`` or state key is bad."""

    def __init__(self, dedup_key: str, state_key: str = "wm") -> None:
        self.dedup_key = dedup_key
        self.state_key = state_key

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"dedup_key": self.dedup_key, "state_key": self.state_key}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"n": 1}, state={"wm": 1}, dedup_key="m1")
        yield TriggerEvent({"n": 2}, state={self.state_key: 2}, dedup_key=self.dedup_key)


class TestBadNamesInEvents:
    @pytest.mark.parametrize(
        "dedup_key", ["a\x00b", "\ud800", "x" * 1025], ids=["NUL", "surrogate", "too-long"]
    )
    async def test_a_bad_dedup_key_is_refused_alike(
        self, backend: BaseStateBackend, dedup_key: str
    ) -> None:
        """The bad event raises InvalidNameError naming the dedup key on every backend; the
        event before it stays committed with its watermark, nothing of the bad one is."""
        with pytest.raises(InvalidNameError, match=r"^invalid dedup key "):
            await run_trigger(ThenBad(dedup_key), assets=ORDERS, backend=backend)
        assert [e.payload for e in await backend.events.alist_events()] == [{"n": 1}]
        assert await backend.aget(ORDERS.scope, "wm") == 1

    async def test_a_bad_state_key_is_refused_alike(self, backend: BaseStateBackend) -> None:
        """A state key with a control character is InvalidKeyError on every backend."""
        with pytest.raises(InvalidKeyError, match="control character"):
            await run_trigger(ThenBad("m2", state_key="w\x00m"), assets=ORDERS, backend=backend)
        assert [e.payload for e in await backend.events.alist_events()] == [{"n": 1}]
