"""Constants of the settings that the command line shows before any settings are read.

They live apart from :mod:`..settings` (which builds pydantic models) so that ``watchkeeper
--help`` can name them without loading pydantic.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_RELOAD_INTERVAL", "EVENT_LOOPS", "LOG_LEVELS"]

LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
"""The ``[logging] level`` values, quietest last."""

DEFAULT_RELOAD_INTERVAL: Final = 2.0
"""Seconds between two scans of the watchers path (``[triggerer] reload_interval``)."""

EVENT_LOOPS: Final = ("auto", "asyncio", "uvloop")
"""The ``[triggerer] event_loop`` values: ``auto`` is uvloop when it is installed."""
