"""The SQLite backend: one database file, one group-commit writer, readers on their own connections.

Its public name is :class:`SqliteStateBackend`; the modules inside are its parts:
``backend`` (the class), ``writer`` (group commit), ``ops`` (key/value writes), ``events``
(event commits), ``meta`` (assets, GC, status, leases), ``schema`` (connections, migrations),
``tasks`` (task cursors and runs), ``consumers`` (event consumers, wake-ups), ``tasks_schema``.
"""

from __future__ import annotations

from .backend import SqliteStateBackend

__all__ = ["SqliteStateBackend"]
