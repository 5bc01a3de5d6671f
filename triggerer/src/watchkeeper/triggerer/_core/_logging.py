"""structlog configuration, applied once by the entry point (never at import time).

Modules log through :func:`watchkeeper.store.protocols.get_logger`, which follows this configuration
whenever it is applied (and stays on stdlib logging, quiet, in a program that applies none).
Logs go to ``stream`` (stderr), so a command's stdout stays clean for the data it prints.

What a line may contain is limited on purpose: tracebacks never show local variables (a
frame's locals hold connection parameters and DSNs), and every rendered line goes through
:func:`~watchkeeper.store.protocols.redact_secrets`, so a URL's password never reaches the log, however
it got into an event. Records of the standard library's :mod:`logging` (asyncpg's, asyncio's)
are rendered by the same chain: one JSON object per record, like structlog's own events.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import sys
import threading
from collections.abc import Iterator
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, ExceptionRenderer, Processor, WrappedLogger
from watchkeeper.store.protocols import redact_secrets

__all__ = ["HANDLER_NAME", "configure_logging", "kept_logging", "wants_json"]

HANDLER_NAME = "watchkeeper"
"""The name of the root logger's handler that :func:`configure_logging` installs."""

LogFormat = Literal["auto", "json", "console"]

_WRITE_LOCK = threading.RLock()
"""Held while a whole line is written: structlog's events and stdlib records (which other
threads emit, e.g. aiosqlite's) share the stream, and a line must never be cut by another."""


class _LineWriter:
    """structlog's output: each rendered event written as one whole line under
    :data:`_WRITE_LOCK`, the lock the root logger's handler takes too."""

    __slots__ = ("_out",)

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def msg(self, message: str) -> None:
        with _WRITE_LOCK:
            self._out.write(message + "\n")
            self._out.flush()

    log = debug = info = warn = warning = error = err = critical = exception = fatal = msg


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
    """Configure structlog and the stdlib root logger: events below ``level`` are dropped.

    The chain merges context variables (``trigger_id``, ``asset``), adds the level and an
    ISO UTC timestamp, then renders JSON (tracebacks as dicts) or console lines (pretty
    tracebacks) to ``stream`` (default: stderr); neither kind of traceback shows local
    variables, and passwords in URLs are masked in the rendered line. The root logger gets
    one handler that renders stdlib records the same way (calling this again replaces it).
    Logger caching stays off unless asked for, so tests that reconfigure structlog see their
    configuration.

    :param level: the lowest level logged: a name (``"debug"``, ``"info"``, ...) or a number.
    :param fmt: ``"json"``, ``"console"``, or ``"auto"`` (JSON unless ``stream`` is a terminal).
    :param stream: where the lines go (default: stderr).
    :param cache_logger_on_first_use: structlog's logger caching (faster; later
        reconfiguration no longer reaches loggers already used).
    :raises ValueError: an unknown level.
    """
    out = sys.stderr if stream is None else stream
    number = _level_number(level)
    renderer: Processor
    exceptions: list[Processor]
    if wants_json(fmt, out):
        exceptions = [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
        ]
        renderer = _Redacting(structlog.processors.JSONRenderer())
    else:
        # ConsoleRenderer formats exceptions itself; format_exc_info would spoil them.
        colors = _isatty(out)
        exceptions = [structlog.dev.set_exc_info]
        renderer = _Redacting(
            structlog.dev.ConsoleRenderer(
                colors=colors, exception_formatter=_console_traceback(colors)
            )
        )
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            stamp,
            *exceptions,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        context_class=dict,
        logger_factory=lambda *_: _LineWriter(out),
        cache_logger_on_first_use=cache_logger_on_first_use,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.stdlib.add_logger_name,
            stamp,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *exceptions,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.lock = _WRITE_LOCK  # one lock for both writers: lines never interleave
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(number)
    # aiosqlite logs every statement at DEBUG: that is the driver's, not ours, to debug.
    logging.getLogger("aiosqlite").setLevel(max(number, logging.INFO))


def _not_now(*args: object, **kwargs: object) -> None:
    """What :func:`kept_logging` puts in place of the functions that configure logging."""


@contextlib.contextmanager
def kept_logging() -> Iterator[None]:
    """Keep the process's logging configuration as it is while the code inside runs.

    For imports of frameworks that configure logging as a side effect (Apache Airflow's
    ``import airflow`` configures structlog and adds a root handler printing to stdout), run
    in a thread while the event loop goes on logging: ``structlog.configure`` does nothing
    meanwhile, and ``logging.config.dictConfig`` puts the root logger's handlers back as soon
    as it has run (so the loop's lines are not rendered another way, nor twice); on exit structlog's configuration, the root logger's handlers and level,
    and each existing logger's ``disabled`` flag, level, ``propagate`` and handlers are put
    back as they were; loggers the code created propagate to the root and have no handlers of
    their own, so their records are rendered once, by ours. Not for two threads at once.
    """
    config: dict[str, Any] = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    manager = logging.Logger.manager
    before = {
        name: (logger.disabled, logger.level, logger.propagate, list(logger.handlers))
        for name, logger in manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    configure, dict_config = structlog.configure, logging.config.dictConfig

    def root_kept(config: dict[str, Any]) -> None:
        # Applied (the framework may check what it configured), the root logger's handlers
        # put back at once: the loop's records keep their one handler, ours.
        dict_config(config)
        root.handlers[:] = handlers
        root.setLevel(level)

    setattr(structlog, "configure", _not_now)  # noqa: B010 - a module's function, swapped
    setattr(logging.config, "dictConfig", root_kept)  # noqa: B010
    try:
        yield
    finally:
        setattr(structlog, "configure", configure)  # noqa: B010
        setattr(logging.config, "dictConfig", dict_config)  # noqa: B010
        structlog.configure(**config)
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, logger in list(manager.loggerDict.items()):
            if not isinstance(logger, logging.Logger):
                continue
            kept = before.get(name)
            if kept is None:
                logger.propagate, logger.disabled = True, False
                logger.handlers[:] = []
                continue
            logger.disabled, logger.level, logger.propagate = kept[:3]
            logger.handlers[:] = kept[3]


class _Redacting:
    """Wraps the final renderer: the rendered line with every URL's password masked."""

    __slots__ = ("_render",)

    def __init__(self, render: Processor) -> None:
        self._render = render

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
        return redact_secrets(str(self._render(logger, method_name, event_dict)))


def _console_traceback(colors: bool) -> ExceptionRenderer:
    """rich's pretty tracebacks (rich is a dependency of the CLI), without local variables."""
    return structlog.dev.RichTracebackFormatter(
        color_system="truecolor" if colors else None, show_locals=False
    )


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())
