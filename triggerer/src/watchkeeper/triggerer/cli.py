"""The ``watchkeeper`` command."""

from __future__ import annotations


def main() -> None:
    raise SystemExit("watchkeeper: not built yet")
