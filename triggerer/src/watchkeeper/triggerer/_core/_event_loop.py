"""Which event loop the daemon runs on: ``[triggerer] event_loop``.

``auto`` (the default) picks uvloop when it is installed (the ``uvloop`` extra of
watchkeeper-triggerer) and asyncio's own loop otherwise; ``asyncio`` always takes the standard
loop; ``uvloop`` insists on uvloop and is an error when it is missing. Either way the runtime is
asyncio through anyio: uvloop replaces only the loop underneath (its I/O and callbacks).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ._defaults import EVENT_LOOPS

__all__ = ["EventLoopUnavailableError", "anyio_backend_options", "uses_uvloop"]


class EventLoopUnavailableError(RuntimeError):
    """Raised when ``[triggerer] event_loop`` names a loop that cannot be used here."""

    def __init__(self, event_loop: str, reason: str) -> None:
        self.event_loop = event_loop
        super().__init__(f"[triggerer] event_loop = {event_loop!r}: {reason}")


def uses_uvloop(event_loop: str) -> bool:
    """Whether ``event_loop`` (a ``[triggerer] event_loop`` value) means uvloop here."""
    if event_loop not in EVENT_LOOPS:
        raise EventLoopUnavailableError(event_loop, f"expected one of {', '.join(EVENT_LOOPS)}")
    if event_loop == "asyncio":
        return False
    installed = importlib.util.find_spec("uvloop") is not None
    if event_loop == "uvloop" and not installed:
        raise EventLoopUnavailableError(
            event_loop, "uvloop is not installed (pip install 'watchkeeper-triggerer[uvloop]')"
        )
    return installed


def anyio_backend_options(event_loop: str) -> dict[str, Any]:
    """The ``backend_options`` of ``anyio.run(..., backend="asyncio")`` for ``event_loop``."""
    return {"use_uvloop": True} if uses_uvloop(event_loop) else {}
