"""``get_logger``: structured logging that stays quiet in a program that configured none.

watchkeeper's modules log structlog events (``log.debug("event_committed", event_id=3)``).
Who decides where they go is the application:

- when structlog has been configured (the ``watchkeeper`` command and the daemon do it with
  ``configure_logging``; so may the user's program, and ``structlog.testing.capture_logs``
  does), each call goes through that configuration, read at the time of the call;
- otherwise watchkeeper is a library in someone else's program, and the events go to the
  standard library's :mod:`logging`, to the logger named after the module
  (``watchkeeper.store.context``, ...). Nothing is printed unless the program configured
  logging: the stdlib's default threshold is WARNING, and its last-resort handler prints
  only warnings and errors. ``logging.basicConfig(level=logging.DEBUG)`` shows them all.

structlog's own default configuration (every level, printed to stdout) is never used: a
library must not write to a program's console because nobody configured it not to.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from ._redact import redact_secrets

__all__ = ["LibraryLogger", "get_logger"]


def _to_stdlib(
    _: WrappedLogger, __: str, event_dict: EventDict
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The final processor on the stdlib path: one ``event key=value ...`` message, with any
    URL's password masked; ``exc_info`` and ``stack_info`` are passed on as the stdlib's own."""
    kwargs: dict[str, Any] = {}
    for key in ("exc_info", "stack_info"):
        if key in event_dict:
            kwargs[key] = event_dict.pop(key)
    event = str(event_dict.pop("event", ""))
    fields = " ".join(f"{key}={value!r}" for key, value in event_dict.items())
    return (redact_secrets(f"{event} {fields}" if fields else event),), kwargs


_STDLIB_PROCESSORS: list[Processor] = [
    structlog.stdlib.filter_by_level,  # below the stdlib logger's level: dropped here, cheaply
    structlog.contextvars.merge_contextvars,
    _to_stdlib,
]


class LibraryLogger:
    """A module's logger: structlog's configuration when there is one, else stdlib logging.

    It has the methods of a structlog bound logger (``debug`` ... ``critical``,
    ``exception``, ``bind``); each call looks up which of the two paths is in force, so a
    logger created at import time follows a configuration applied later.
    """

    __slots__ = ("_stdlib", "_structlog", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        # structlog's lazy proxy reads the configuration each time it is used.
        self._structlog = structlog.get_logger()
        self._stdlib = structlog.stdlib.BoundLogger(
            logging.getLogger(name), processors=_STDLIB_PROCESSORS, context={}
        )

    def __repr__(self) -> str:
        path = "structlog" if structlog.is_configured() else "stdlib"
        return f"<LibraryLogger {self.name!r} via={path}>"

    def _target(self) -> Any:
        return self._structlog if structlog.is_configured() else self._stdlib

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)

    def is_enabled_for(self, level: int) -> bool:
        """Whether an event at ``level`` (a stdlib level number) would be emitted at all."""
        if not structlog.is_configured():
            return logging.getLogger(self.name).isEnabledFor(level)
        check = getattr(self._structlog.bind(), "is_enabled_for", None)
        return True if check is None else bool(check(level))


def get_logger(name: str) -> LibraryLogger:
    """The logger for module ``name`` (pass ``__name__``); see the module's docstring."""
    return LibraryLogger(name)
