"""What every ``watchkeeper`` subcommand shares: the handler contract, errors, and output.

A subcommand module exposes ``register(subparsers)``; each parser it adds sets
``handler=fn`` with ``parser.set_defaults(handler=fn)``, where ``fn(args, settings) -> int``
receives the parsed arguments and the :class:`~watchkeeper.triggerer.settings.Settings` the
entry point built once, and returns the exit status. A handler reports bad input by raising
:class:`UsageError` (exit 2) or :class:`CommandError` (exit 1); ``main`` prints it as one
``watchkeeper: error: ...`` line on stderr. Store errors (``StateStoreError``) exit 1 the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias, TypeVar

from watchkeeper.store.errors import MissingCapabilityError

if TYPE_CHECKING:
    from pydantic import ValidationError
    from rich.console import Console
    from watchkeeper.store import BaseStateBackend
    from watchkeeper.store.protocols import Writer

    from ..settings import Settings

__all__ = [
    "PROG",
    "CommandError",
    "Handler",
    "OneLineArgumentParser",
    "StoreCommand",
    "UsageError",
    "cli_writer",
    "compact_json",
    "console",
    "describe_validation_error",
    "emit",
    "emit_json",
    "emit_listing",
    "error_line",
    "int_at_least",
    "int_between",
    "json_default",
    "json_flag",
    "open_backend",
    "printable",
    "redacted",
    "run_async",
    "run_store_command",
    "settings_overrides",
    "store_handler",
]

PROG = "watchkeeper"

T = TypeVar("T")

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

StoreCommand: TypeAlias = (
    "Callable[[BaseStateBackend, argparse.Namespace, Settings], Awaitable[int]]"
)
"""A store subcommand: runs on the opened backend and returns the exit status."""


class Handler(Protocol):
    """The function a subcommand parser stores as ``handler``."""

    def __call__(self, args: argparse.Namespace, settings: Settings, /) -> int: ...


class CommandError(Exception):
    """Raised by a handler when the command fails; ``main`` prints one line and exits 1."""

    exit_code = 1


class UsageError(CommandError):
    """Raised by a handler for bad input the parser could not catch (exit 2)."""

    exit_code = 2


def error_line(message: str) -> str:
    """``watchkeeper: error: <message>`` squeezed onto one line, URL passwords masked."""
    from watchkeeper.store.protocols import redact_secrets

    flat = " ".join(str(message).split())
    return f"{PROG}: error: {redact_secrets(flat)}\n"


_SECRET_PARTS = ("url", "dsn", "password", "secret", "token")


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's errors as one line, each naming its key: ``state_store.max_value_bytes``.

    The offending value is quoted, except for an unknown key (its value may be anything) and
    for keys that may hold a secret (a URL, a DSN, a password or token).
    """
    parts = []
    for error in exc.errors(include_url=False):
        loc = [str(part) for part in error["loc"]]
        key = ".".join(loc) or "settings"
        if error["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key")
            continue
        secret = any(word in part.lower() for part in loc for word in _SECRET_PARTS)
        shown = "" if secret else f" (got {error.get('input')!r})"
        parts.append(f"{key}: {error['msg']}{shown}")
    return "invalid configuration: " + "; ".join(parts)


def redacted(value: Any) -> Any:
    """``value`` (JSON data) with every URL password masked: what ``status`` and ``events``
    print (see :func:`~watchkeeper.store.protocols.redact_data`)."""
    from watchkeeper.store.protocols import redact_data

    return redact_data(value)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``watchkeeper: error: ...`` line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        hint = f" (see '{self.prog} --help')"
        self.exit(2, error_line(message + hint))


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the global options set (``--database-url``, ``--log-level``), nested like
    the file: what ``load_settings`` takes as explicit arguments."""
    overrides: dict[str, Any] = {}
    if args.database_url is not None:
        overrides["database"] = {"url": args.database_url}
    if args.log_level is not None:
        overrides["logging"] = {"level": args.log_level}
    return overrides


def cli_writer() -> Writer:
    """``Writer("cli", <user>)``: who made a change from the command line."""
    from watchkeeper.store.protocols import Writer

    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return Writer("cli", user)


def open_backend(settings: Settings) -> BaseStateBackend:
    """The configured backend, unopened; a configuration mistake becomes a :class:`UsageError`."""
    from watchkeeper.store import open_state_backend

    try:
        return open_state_backend(settings)
    except (ImportError, TypeError, ValueError) as exc:
        raise UsageError(f"cannot build the configured state backend: {exc}") from exc


def json_default(value: object) -> Any:
    """Encode what ``json`` cannot: datetimes as ISO 8601 text, anything else by ``str``."""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def emit(line: str = "") -> None:
    """Write one line to stdout and flush it (a pipe reader sees it at once)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def emit_json(value: object, *, default: Callable[[object], Any] = json_default) -> None:
    """Write ``value`` as one compact JSON line."""
    emit(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=default))


def emit_listing(
    items: Sequence[T], as_json: bool, record: Callable[[T], object], empty: str
) -> bool:
    """How every listing command starts: with ``--json``, one :func:`record` a line; without,
    the line ``empty`` when there is nothing to list. True when that said it all (the command
    returns 0), False when the caller prints its table."""
    if as_json:
        for item in items:
            emit_json(record(item))
        return True
    if not items:
        emit(empty)
        return True
    return False


def compact_json(value: object) -> str:
    """``value`` as compact JSON text, for a table cell or a log line."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def printable(text: str) -> str:
    """``text`` with every character that is not printable (controls, line and paragraph
    separators, bidirectional overrides, lone surrogates) escaped as Python would show it, so
    a key or a payload cannot move the cursor, recolour the terminal or break a line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def console() -> Console:
    """A rich console on stdout for tables people read."""
    from rich.console import Console

    return Console(soft_wrap=False, highlight=False)


def json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--json`` (machine-readable output) to ``parser``."""
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type=`` for integers not below ``minimum``."""
    return int_between(minimum, None)


def int_between(minimum: int, maximum: int | None) -> Callable[[str], int]:
    """An argparse ``type=`` for integers from ``minimum`` to ``maximum`` (None: no bound).

    The bound is what the store can keep (a 32-bit map index, a 64-bit id), so a number past
    it is a one-line usage error rather than an overflow deep inside a driver.
    """

    def parse(text: str) -> int:
        shown = text if len(text) <= 30 else text[:27] + "..."
        try:
            number = int(text)
        except ValueError:
            if text.strip().lstrip("+-").isdigit():  # past Python's int-to-text digit limit
                raise argparse.ArgumentTypeError(f"{shown} has too many digits") from None
            raise argparse.ArgumentTypeError(f"{shown!r} is not an integer") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{shown} is less than {minimum}")
        if maximum is not None and number > maximum:
            raise argparse.ArgumentTypeError(f"{shown} is more than {maximum}")
        return number

    return parse


def run_store_command(
    command: StoreCommand,
    args: argparse.Namespace,
    settings: Settings,
    *,
    check: Callable[[argparse.Namespace], object] | None = None,
) -> int:
    """Run ``check(args)``, then open the backend, run ``command`` on it and close it, all
    inside one event loop. ``check`` raises :class:`UsageError` before anything is opened."""
    import anyio

    if check is not None:
        check(args)
    backend = open_backend(settings)

    async def main() -> int:
        async with backend:
            return await command(backend, args, settings)

    try:
        with unwrap_lone_exception():  # a failure inside a task group (events --follow)
            return anyio.run(main, backend="asyncio")
    except MissingCapabilityError as exc:  # a custom backend without this part of the metastore
        raise CommandError(str(exc)) from exc


def lone_exception(group: BaseExceptionGroup[BaseException]) -> Exception | None:
    """The only exception inside (possibly nested) groups, or None when there are several."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner if isinstance(inner, Exception) else None


@contextlib.contextmanager
def unwrap_lone_exception() -> Iterator[None]:
    """Re-raise a lone error out of the (possibly nested) exception groups around it, so the
    CLI reports it as itself; a group of several errors passes unchanged."""
    try:
        yield
    except BaseExceptionGroup as group:
        lone = lone_exception(group)
        if lone is not None:
            raise lone from None
        raise


def store_handler(
    command: StoreCommand, *, check: Callable[[argparse.Namespace], object] | None = None
) -> Handler:
    """The ``handler`` of a parser whose command runs on the opened backend; ``check``
    validates the arguments first (see :func:`run_store_command`)."""
    return partial(run_store_command, command, check=check)


def run_async(fn: Callable[..., Awaitable[T]], *args: Any, event_loop: str = "auto") -> T:
    """``anyio.run`` on asyncio, on the loop ``event_loop`` names (``[triggerer] event_loop``:
    ``auto`` is uvloop when it is installed); unwraps a lone error."""
    import anyio

    from .._core import EventLoopUnavailableError, anyio_backend_options

    try:
        options = anyio_backend_options(event_loop)
    except EventLoopUnavailableError as exc:
        raise UsageError(str(exc)) from None
    with unwrap_lone_exception():
        return anyio.run(fn, *args, backend="asyncio", backend_options=options)
