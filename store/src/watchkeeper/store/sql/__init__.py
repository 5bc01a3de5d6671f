"""One SQL engine for the SQL drivers: statements and their row mapping written once, with a
dialect for each database where the SQL must differ.

- :mod:`.engine`: :class:`~.engine.Dialect` (what a database spells its own way: parameters,
  the clock, list parameters, row locks), statements compiled once per dialect and table
  prefix (:class:`~.engine.Stmt`), and *jobs*: a job is a generator that yields the statements
  it runs (:func:`~.engine.rows`, :func:`~.engine.count`, :data:`~.engine.BEGIN`,
  :func:`~.engine.notify`) and receives their results, so one job serves a synchronous
  connection (SQLite, in the writer's thread) and an asynchronous one (PostgreSQL) alike.
- :mod:`.dialects`: the SQLite and the PostgreSQL dialect.
- :mod:`.runner`: what a driver needs of its database; :mod:`.migrations`: the one runner of
  each database's numbered migrations.
- The drivers, each with its statements and jobs: :mod:`.leases` (node and trigger leases),
  :mod:`.controls` (watcher controls, API tokens), :mod:`.status` (trigger and daemon status),
  :mod:`.gc` (garbage collection), :mod:`.tasks` (event consumers and task specs),
  :mod:`.logs` (the logs kept with each run), :mod:`.runs` and :mod:`.run_steps` (runs of tasks).

What stays with each database is how a job runs: SQLite's executor is the group-commit
writer's transaction (:func:`watchkeeper.store.sqlite.executor.run_job`); PostgreSQL's is a
connection of the pool or of a lease lane (:func:`watchkeeper.store.postgres.executor.run_job`).
"""

from .controls import SqlControls
from .gc import SqlGc
from .leases import SqlLeases
from .logs import SqlLogs
from .migrations import Migrations, migrate
from .runs import SqlRuns
from .status import SqlStatus
from .tasks import SqlTaskSpecs

__all__ = [
    "Migrations",
    "SqlControls",
    "SqlGc",
    "SqlLeases",
    "SqlLogs",
    "SqlRuns",
    "SqlStatus",
    "SqlTaskSpecs",
    "migrate",
]
