"""Subcommands of the runtime: ``triggerer``, ``status``, ``demo``.

INTERFACE STUB — the daemon helper fills this in.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the runtime subcommands to the ``watchkeeper`` parser."""
