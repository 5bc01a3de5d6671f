"""The PostgreSQL backend: an asyncpg pool, one group-commit writer, set-based batches.

Its public name is :class:`PostgresStateBackend`; the modules inside are its parts:
``backend`` (the class), ``writer`` (group commit), ``ops`` (the queued writes and how a
batch is applied), ``sql`` (the statements, error mapping), ``schema`` (migrations), ``gc``
(a GC pass), ``tasks`` (task cursors and runs), ``consumers`` (event consumers, the events
lock, wake-ups), ``tasks_schema``.
"""

from __future__ import annotations

from .backend import PostgresStateBackend

__all__ = ["PostgresStateBackend"]
