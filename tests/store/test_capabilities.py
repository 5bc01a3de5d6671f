"""The capability checks of watchkeeper.store.backend: require_event_log remembers classes."""

from __future__ import annotations

from typing import Any

import pytest
from watchkeeper.store import MemoryStateBackend, MissingCapabilityError
from watchkeeper.store.backend import EventLog, require_event_log


class _Log:
    """An event log by its methods alone (no base class)."""

    async def acommit_event(self, commit: Any) -> list[Any]:
        return []

    async def acommit_events(self, batch: Any) -> list[Any]:
        return []

    async def alist_events(self, **kwargs: Any) -> list[Any]:
        return []


class TestRequireEventLog:
    def test_a_backend_passes_every_time(self) -> None:
        """The first check remembers the class; the next ones give the same answer."""
        backend = MemoryStateBackend()
        assert require_event_log(backend) is backend
        assert require_event_log(backend) is backend
        assert require_event_log(MemoryStateBackend()) is not backend

    def test_a_remembered_class_answers_as_isinstance_does(self) -> None:
        """An instance that shadows a method (set to None) gets the runtime Protocol's own
        answer, not the remembered class's."""
        assert require_event_log(_Log()) is not None  # the class is remembered now
        odd = _Log()
        odd.alist_events = None  # type: ignore[method-assign, assignment]
        if isinstance(odd, EventLog):
            assert require_event_log(odd) is odd
        else:
            with pytest.raises(MissingCapabilityError, match="_Log has no EventLog"):
                require_event_log(odd)

    def test_an_object_without_the_methods_is_refused(self) -> None:
        with pytest.raises(MissingCapabilityError, match="object has no EventLog"):
            require_event_log(object())
