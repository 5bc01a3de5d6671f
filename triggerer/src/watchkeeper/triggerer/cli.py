"""The ``watchkeeper`` command.

INTERFACE STUB — the CLI helper builds the parser here. Each group of subcommands lives in its
own private module exposing ``register(subparsers) -> None``; ``cli.py`` imports
``_cli_store`` (db, state-store, assets, events) and ``_cli_runtime`` (triggerer, status, demo).
"""

from __future__ import annotations


def main() -> None:
    raise SystemExit("watchkeeper: not built yet")
