"""structlog configuration, applied once by the entry point (never at import time).

Modules log through ``structlog.get_logger()`` at module scope, a lazy proxy that picks up
this configuration whenever it is applied. Logs go to stderr, so a command's stdout stays
clean for the data it prints.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
from structlog.typing import Processor

__all__ = ["configure_logging", "wants_json"]

LogFormat = Literal["auto", "json", "console"]


def wants_json(fmt: LogFormat, stream: TextIO) -> bool:
    """JSON for ``json``, or for ``auto`` when ``stream`` is not a terminal."""
    if fmt == "json":
        return True
    if fmt == "console":
        return False
    if fmt != "auto":
        raise ValueError(f"log format must be 'auto', 'json' or 'console', got {fmt!r}")
    return not _isatty(stream)


def _level_number(level: str | int) -> int:
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str):
        number = logging.getLevelNamesMapping().get(level.upper())
        if number is not None:
            return number
    raise ValueError(
        f"log level must be one of debug, info, warning, error, critical; got {level!r}"
    )


def configure_logging(
    level: str | int = "info",
    fmt: LogFormat = "auto",
    *,
    stream: TextIO | None = None,
    cache_logger_on_first_use: bool = False,
) -> None:
    """Configure structlog for this process: events below ``level`` are dropped cheaply.

    The chain merges context variables (``trigger_id``, ``asset``), adds the level and an
    ISO UTC timestamp, then renders JSON (tracebacks as dicts) or coloured console lines
    (pretty tracebacks) to ``stream`` (default: stderr). Logger caching stays off unless asked
    for, so tests that reconfigure structlog see their configuration.
    """
    out = sys.stderr if stream is None else stream
    number = _level_number(level)
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.StackInfoRenderer(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if wants_json(fmt, out):
        processors += [
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ]
    else:
        # ConsoleRenderer formats exceptions itself; format_exc_info would spoil them.
        processors += [
            structlog.dev.set_exc_info,
            structlog.dev.ConsoleRenderer(colors=_isatty(out)),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(number),
        context_class=dict,
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=cache_logger_on_first_use,
    )


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())
