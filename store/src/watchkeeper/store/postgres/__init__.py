"""The PostgreSQL backend: an asyncpg pool, one group-commit writer, set-based batches.

Its public name is :class:`PostgresStateBackend`; the modules inside are its parts:
``backend`` (the class, the pool, the metastore hooks), ``writer`` (group commit), ``ops``
(the queued writes), ``batch`` (how a batch of them is applied), ``commits`` (the one
statement of a round of event commits), ``puts`` (a batch of plain upserts as one
statement), ``steps`` (a worker's grouped steps, run by the writer), ``sql`` (the statements,
error mapping), ``gc`` (a GC pass), ``controls`` (watcher controls, tokens, event JSON),
``schema`` (migrations), ``tasks`` and ``runs`` (runs), ``consumers`` (the events lock, the
commits' NOTIFY), ``tasks_schema``.

The SQLite backend (:mod:`watchkeeper.store.sqlite`) has the same rules and the same
group-commit core (:mod:`watchkeeper.store._commit_queue`); ``backend``, ``writer``,
``schema``, ``controls``, ``tasks`` and ``tasks_schema`` do the same job in
both. How a write is *expressed* differs, because the drivers do:

- asyncpg pays a network round trip per statement, and a batch of a thousand writes must not
  cost a thousand of them. So a write is data, not code: an ``Op`` (``ops.PutOp``,
  ``ops.EventsOp``...) that ``batch.apply_batch`` groups by kind and turns into a few
  set-based statements per batch, with one query resolving every asset of the batch. Event
  commits, a single one being a batch of one event, travel in one form: a JSON document per
  op, one statement per round. A write that has no set-based form yet is a ``CallOp`` (a
  coroutine ``fn(conn)``, the SQLite shape).
- The statements are built once per schema prefix (``sql.Statements``, ``sql.GcStatements``),
  since the schema is a setting; reads are plain ``await`` on the pool.

SQLite's driver is synchronous and in-process, a statement costs no round trip, so there a
write is a plain function run in the writer's thread; see that package.
"""

from __future__ import annotations

from .backend import PostgresStateBackend

__all__ = ["PostgresStateBackend"]
