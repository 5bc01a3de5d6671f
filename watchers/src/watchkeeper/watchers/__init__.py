"""watchkeeper.watchers: ready-made watermark watchers, each a ``BaseEventTrigger``.

- :class:`DirectoryWatcher`: one event per new file in a directory.
- :class:`SqlTableWatcher`: one event per new row of a SQLite, PostgreSQL or MySQL/MariaDB
  table.
- :class:`HttpPollWatcher`: one event per new item of a JSON endpoint (cursor pagination,
  conditional requests, backoff); the ``http`` extra.

Each commits its position with its events, a batch at a time (``TriggerEventBatch``), so a
restarted watcher neither loses nor repeats an item; the directory and table watchers also
catch items that arrive late (behind the watermark) inside a bounded lag window. Their state
keys are prefixed with the watcher's name (``<name>.watermark``, ``<name>.cursor``, ...), so
several watchers share an asset. Each class's docstring lists its keys and how to rewind it.
"""

from __future__ import annotations

from ._sql import SqlSourceError
from .directory import DirectoryWatcher
from .http_poll import HttpPollWatcher, HttpSourceError
from .sql_table import SqlTableWatcher

__all__ = [
    "DirectoryWatcher",
    "HttpPollWatcher",
    "HttpSourceError",
    "SqlSourceError",
    "SqlTableWatcher",
]
