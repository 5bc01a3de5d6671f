"""The SQLite backend: one database file, one group-commit writer, readers on their own connections.

Its public name is :class:`SqliteStateBackend`; the modules inside are its parts:
``backend`` (the class), ``writer`` (group commit), ``ops`` (key/value SQL), ``events``
(event commits), ``meta`` (assets, GC, status SQL), ``controls`` (event JSON, the poll),
``leases`` (the fence's view, the keep-alive), ``executor`` (how a job of
:mod:`watchkeeper.store.sql`, where leases, watcher controls and tokens are written once for
both SQL backends, runs here), ``schema`` (connections, migrations), ``tasks`` (runs),
``tasks_schema``.

The PostgreSQL backend (:mod:`watchkeeper.store.postgres`) has the same rules and the same
group-commit core (:mod:`watchkeeper.store._commit_queue`); ``backend``, ``writer``,
``schema``, ``controls``, ``tasks`` and ``tasks_schema`` do the same job in
both. How a write is *expressed* differs, because the drivers do:

- ``sqlite3`` is synchronous and in-process: the writer is one thread that owns the write
  connection, and a statement costs no round trip. So a write is a plain function
  ``op(tx, ...)`` (``ops.put``, ``meta.register_assets``...) that the writer runs inside the
  batch's transaction, each in its own savepoint so a failure stays its caller's; plain
  upserts of distinct keys are coalesced into one multi-row statement, events into
  ``events.EventCommits``.
- Reads run on aiosqlite reader connections, so each is a pair: ``*_query`` builds the SQL and
  its parameters, ``*_result`` turns the rows into the store's records (``ops.get_query`` /
  ``ops.get_result``, ``meta.events_query`` / ``meta.events_result``...).

PostgreSQL pays a network round trip per statement, so there a write is data (an ``Op``) that
its writer can group by kind into a few set-based statements; see that package.
"""

from __future__ import annotations

from .backend import SqliteStateBackend

__all__ = ["SqliteStateBackend"]
