"""Greenback portals on demand: the sync store calls of a trigger's ``run()``.

A sync store call (``self.asset_state_store.get(...)``) inside ``run()`` needs a greenback
portal in the trigger's task, which costs memory in every trigger. A trigger gets one once its
class is seen to need it: its first sync call without one calls the store's missing-portal
hook (the trigger's :class:`~._slot.TriggerSlot`), which cancels the trigger's task, so
``run()`` stops at its next await even when it catches the
:class:`~watchkeeper.store.SyncCallInLoopError`; the runner starts the trigger again at once in
a new task, with a portal, and it is not counted as a failure. Later triggers of that class
get their portal before ``run()`` starts.
"""

from __future__ import annotations

import weakref

import greenback

__all__ = ["note_portal_class", "open_portal_for", "wants_portal_up_front"]

_PORTAL_CLASSES: weakref.WeakSet[type] = weakref.WeakSet()
"""Trigger classes seen calling a sync store method."""


def wants_portal_up_front(trigger: object) -> bool:
    """Whether ``trigger``'s class was seen making sync store calls."""
    return type(trigger) in _PORTAL_CLASSES


def note_portal_class(trigger: object) -> None:
    """Remember that ``trigger``'s class makes sync store calls."""
    _PORTAL_CLASSES.add(type(trigger))


async def open_portal_for(trigger: object) -> None:
    """Give the current task a portal, and every later trigger of ``trigger``'s class too."""
    note_portal_class(trigger)
    await greenback.ensure_portal()
