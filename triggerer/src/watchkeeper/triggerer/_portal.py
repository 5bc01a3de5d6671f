"""Greenback portals on demand: the sync store calls of a trigger's ``run()``.

A sync store call (``self.asset_state_store.get(...)``) inside ``run()`` needs a greenback
portal in the trigger's task, which costs about 3 KiB per trigger. A trigger gets one once its
class is seen to need it: its first sync call without one stops ``run()`` (at its next await,
even when ``run()`` catches the :class:`~watchkeeper.store.SyncCallInLoopError`) and the
supervisor starts it again at once with a portal; it is not counted as a failure. Later
triggers of that class get their portal before ``run()`` starts.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio
import greenback
from watchkeeper.store.backend import SYNC_CALL_WITHOUT_PORTAL

if TYPE_CHECKING:
    from ._supervisor import TriggerSlot

__all__ = ["PortalRequest", "open_portal_for", "wants_portal_up_front"]

_PORTAL_CLASSES: weakref.WeakSet[type] = weakref.WeakSet()
"""Trigger classes seen calling a sync store method."""


def wants_portal_up_front(trigger: object) -> bool:
    """Whether ``trigger``'s class was seen making sync store calls."""
    return type(trigger) in _PORTAL_CLASSES


async def open_portal_for(trigger: object) -> None:
    """Give the current task a portal, and every later trigger of ``trigger``'s class too."""
    _PORTAL_CLASSES.add(type(trigger))
    await greenback.ensure_portal()


class PortalRequest:
    """One run of a trigger, stopped if it makes a sync store call without a portal: at its
    next await (the cancel scope) or its next yield (``slot.portal_missing``), whichever
    comes first; nothing it yields after that call is committed."""

    __slots__ = ("_scope", "_slot")

    def __init__(self, slot: TriggerSlot) -> None:
        self._scope = anyio.CancelScope()
        self._slot = slot
        slot.portal_missing = False

    def __call__(self) -> None:
        self._slot.portal_missing = True
        self._scope.cancel()

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Run the body with this request as the task's missing-portal hook."""
        token = SYNC_CALL_WITHOUT_PORTAL.set(self)
        try:
            with self._scope:
                yield
        finally:
            SYNC_CALL_WITHOUT_PORTAL.reset(token)

    def needed(self) -> bool:
        """Whether the run ended for want of a portal that the task does not have yet (the
        store called this request, as the task's hook, before raising the error)."""
        return self._slot.portal_missing and not greenback.has_portal()
