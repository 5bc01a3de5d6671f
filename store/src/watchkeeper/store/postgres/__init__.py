"""The PostgreSQL backend: an asyncpg pool, one group-commit writer, set-based batches.

Its public name is :class:`PostgresStateBackend`; the modules inside are its parts:
``backend`` (the class), ``writer`` (group commit), ``ops`` (the queued writes and how a
batch is applied), ``sql`` (the statements, error mapping), ``schema`` (migrations).
"""

from __future__ import annotations

from .backend import PostgresStateBackend

__all__ = ["PostgresStateBackend"]
