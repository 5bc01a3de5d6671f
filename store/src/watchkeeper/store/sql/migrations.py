"""One migration runner for both SQL databases: numbered migrations per dialect (the lists are
the databases' own: :mod:`watchkeeper.store.sqlite.schema`, :mod:`watchkeeper.store.postgres.schema`),
applied in order in one transaction, each recorded in ``schema_migrations``.

Two processes that open the same new database at once serialise (SQLite: the writer's
``BEGIN IMMEDIATE``; PostgreSQL: a transaction-scoped advisory lock, the database's
``prelude``): the first creates the tables, the second finds them recorded and applies
nothing. A database with a version newer than the code knows is refused, changing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BackendUnavailableError
from .engine import BEGIN, Dialect, Job, Stmt, rows, run

__all__ = ["Migration", "Migrations", "migrate", "raw"]

Migration = tuple[int, str, tuple[str, ...]]
"""``(version, name, statements)``; ``{p}`` in a statement is the tables' prefix."""


def raw(sql: str) -> Stmt:
    """A statement without parameters, as it is (schema DDL)."""
    return Stmt(sql, (), ())


@dataclass(frozen=True, slots=True)
class Migrations:
    """A dialect's numbered migrations, and the DDL of the table that records them."""

    dialect: Dialect
    table: str
    steps: tuple[Migration, ...]

    @property
    def version(self) -> int:
        """The newest version these migrations reach (versions may have gaps, and need not
        be listed in order: each missing one is applied)."""
        return max(version for version, _, _ in self.steps)


def migrate(m: Migrations, prefix: str, prelude: Job[None] | None = None) -> Job[list[int]]:
    """Apply the pending migrations (after ``prelude``, in the same transaction); return the
    versions applied."""
    sql = m.dialect.compile
    yield BEGIN
    if prelude is not None:
        yield from prelude
    yield run(raw(m.table.replace("{p}", prefix)))
    applied = {r[0] for r in (yield rows(sql("SELECT version FROM {p}schema_migrations", prefix)))}
    newer = sorted(v for v in applied if v > m.version)
    if newer:
        raise BackendUnavailableError(
            f"the database has schema version {newer[-1]}, newer than {m.version}, "
            "the latest this watchkeeper knows; upgrade watchkeeper"
        )
    record = sql(
        "INSERT INTO {p}schema_migrations (version, name, applied_at) VALUES (:version, :name, {now})",
        prefix,
    )
    done: list[int] = []
    for version, name, statements in m.steps:
        if version in applied:
            continue
        for statement in statements:
            yield run(raw(statement.replace("{p}", prefix)))
        yield run(record, version=version, name=name)
        done.append(version)
    return done
