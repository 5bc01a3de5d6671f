"""watchkeeper.triggerer.testing: the test kit for trigger authors."""

from __future__ import annotations

__all__: list[str] = []
