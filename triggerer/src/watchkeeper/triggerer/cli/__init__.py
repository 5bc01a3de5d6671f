"""The ``watchkeeper`` command: global options, settings, logging, and dispatch.

``main`` parses the command line, builds :class:`~watchkeeper.triggerer.settings.Settings`
once (``--config`` and ``--database-url`` beat the environment and the file), configures
structlog, and calls the subcommand's handler (see :mod:`._common` for the contract).
Subcommands live in ``_store`` (db, assets, events; ``state-store`` in ``_state``),
``_runtime`` (triggerer, status, demo; the demo itself in ``_demo``), ``_tasks`` (worker, up,
tasks, runs), ``_watchers`` (watchers), ``_api`` (api, tokens) and ``_config`` (config). Every failure the user can fix is one ``watchkeeper: error: ...``
line on stderr: exit 2 for usage and configuration mistakes, 1 when the command itself fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import cast

from pydantic import ValidationError
from watchkeeper.store import StateStoreError
from watchkeeper.store.settings import (
    ConfigFileNotFoundError,
    InvalidConfigFileError,
    UnknownSettingError,
)

from .._logging import configure_logging
from ..settings import LOG_LEVELS, Settings, load_settings
from . import _api, _config, _runtime, _store, _tasks, _watchers
from ._common import (
    PROG,
    CommandError,
    OneLineArgumentParser,
    describe_validation_error,
    error_line,
    settings_overrides,
)

__all__ = ["build_parser", "main"]


def _version() -> str:
    try:
        return version("watchkeeper-triggerer")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The full parser: global options and every subcommand."""
    parser = OneLineArgumentParser(
        prog=PROG,
        description="Run event watchers and inspect the state store they write.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
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
    return parser


def _settings_from(args: argparse.Namespace) -> Settings:
    return load_settings(args.config, **settings_overrides(args))


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status (``main`` exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = _settings_from(args)
    except (ConfigFileNotFoundError, InvalidConfigFileError, UnknownSettingError) as exc:
        sys.stderr.write(error_line(str(exc)))
        return 2
    except ValidationError as exc:
        sys.stderr.write(error_line(describe_validation_error(exc)))
        return 2
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
    """Entry point of the ``watchkeeper`` script."""
    sys.exit(run(argv))
