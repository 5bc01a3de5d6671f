"""The ``watchkeeper`` command: global options, settings, logging, and dispatch.

``main`` parses the command line, builds :class:`~watchkeeper.triggerer.settings.Settings`
once (``--config`` and ``--database-url`` beat the environment and the file), configures
structlog, and calls the subcommand's handler (see :mod:`._common` for the contract).
Subcommands live in ``_store`` (db, assets, events; ``state-store`` in ``_state``),
``_runtime`` (triggerer, status, demo; the demo itself is :mod:`watchkeeper.triggerer.demo`), ``_tasks`` (worker, up,
tasks, runs), ``_watchers`` (watchers), ``_api`` (api, tokens) and ``_config`` (config). Every failure the user can fix is one ``watchkeeper: error: ...``
line on stderr: exit 2 for usage and configuration mistakes, 1 when the command itself fails.

Building the parser loads nothing heavy: the subcommand modules import what a command needs
(pydantic, rich, anyio, the store's drivers, the daemon, the HTTP API) inside its handler, and
the settings are loaded once the command line parsed, so ``--help`` and a usage error answer
at once and ``status`` loads no HTTP server or PostgreSQL driver. structlog is configured for
the commands that run something, or when logs are asked for (see :func:`_wants_logging`).

It may import the store, the authoring API and the public names (``__all__``) of every other
wing: :mod:`.._core`, the runtime, the daemon, the worker and the API.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from watchkeeper.store.errors import StateStoreError

from .._core import LOG_LEVELS
from . import _api, _config, _runtime, _store, _tasks, _watchers
from ._common import (
    PROG,
    CommandError,
    OneLineArgumentParser,
    describe_validation_error,
    error_line,
    settings_overrides,
)

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["build_parser", "main"]


class _VersionAction(argparse.Action):
    """``--version``: the installed distribution's version, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("watchkeeper-triggerer")
        except PackageNotFoundError:  # running from a source tree that was never installed
            number = "unknown"
        sys.stdout.write(f"{PROG} {number}\n")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The full parser: global options and every subcommand."""
    parser = OneLineArgumentParser(
        prog=PROG,
        description="Run event watchers and inspect the state store they write.",
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="TOML settings file (default: ./watchkeeper.toml when it exists)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="overrides [database] url, e.g. sqlite:///watchkeeper.db or postgresql://host/db",
    )
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        help="overrides [logging] level",
    )
    subparsers = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", required=True),
    )
    _store.register(subparsers)
    _runtime.register(subparsers)
    _tasks.register(subparsers)
    _config.register(subparsers)
    _watchers.register(subparsers)
    _api.register(subparsers)
    for entry in entry_points(group="watchkeeper.commands"):
        # installed distributions add their subcommands (watchkeeper-airflow: ``airflow``)
        entry.load()(subparsers)
    return parser


def _settings_from(args: argparse.Namespace) -> Settings:
    from ..settings import load_settings  # pydantic-settings: only once a command runs

    return load_settings(args.config, **settings_overrides(args))


def _wants_logging(args: argparse.Namespace, settings: Settings) -> bool:
    """Whether to configure structlog: for the commands that run watchers, tasks or the API
    (``set_defaults(long_running=True)``), and for any command when logs are asked for
    (``--log-level``, or level ``debug``). A one-shot command logs nothing at the other
    levels, and importing structlog is the largest part of its start-up; the library's
    loggers then stay on the standard library's ``logging``, which still prints warnings."""
    return (
        bool(getattr(args, "long_running", False))
        or args.log_level is not None
        or settings.logging.level == "debug"
    )


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status (``main`` exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from pydantic import ValidationError
    from watchkeeper.store.settings import (
        ConfigFileNotFoundError,
        InvalidConfigFileError,
        UnknownSettingError,
    )

    try:
        settings = _settings_from(args)
    except (ConfigFileNotFoundError, InvalidConfigFileError, UnknownSettingError) as exc:
        sys.stderr.write(error_line(str(exc)))
        return 2
    except ValidationError as exc:
        sys.stderr.write(error_line(describe_validation_error(exc)))
        return 2
    if _wants_logging(args, settings):
        from .._core import configure_logging

        configure_logging(settings.logging.level, settings.logging.format)
    handler = getattr(args, "handler", None)
    if handler is None:  # a subcommand module forgot set_defaults(handler=...)
        parser.error(f"{args.command!r} has no handler")
    try:
        status: int = handler(args, settings)
    except CommandError as exc:
        sys.stderr.write(error_line(str(exc)))
        return exc.exit_code
    except StateStoreError as exc:
        sys.stderr.write(error_line(str(exc)))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``watchkeeper events --json | head``): stop quietly, and keep
        # the interpreter from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``watchkeeper`` command and exit with its status.

    :param argv: the arguments (default: ``sys.argv[1:]``).
    """
    sys.exit(run(argv))
