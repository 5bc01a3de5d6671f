"""watchkeeper.watchers: ready-made watermark watchers, each a ``BaseEventTrigger``.

- :class:`DirectoryWatcher`: one event per new file in a directory.
- :class:`SqlTableWatcher`: one event per new row of a SQLite, PostgreSQL or MySQL/MariaDB
  table.

Both commit their watermark with their events, a batch at a time (``TriggerEventBatch``), so a
restarted watcher neither loses nor repeats an item, and both catch items that arrive late
(behind the watermark) inside a bounded lag window. Their state keys are prefixed with the
watcher's name (``<name>.watermark``, ``<name>.recent``), so several watchers share an asset.
"""

from __future__ import annotations

from ._sql import SqlSourceError
from .directory import DirectoryWatcher
from .sql_table import SqlTableWatcher

__all__ = [
    "DirectoryWatcher",
    "SqlSourceError",
    "SqlTableWatcher",
]
