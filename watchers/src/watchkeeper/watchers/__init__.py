"""watchkeeper.watchers: ready-made watermark watchers."""

from __future__ import annotations

__all__: list[str] = []
