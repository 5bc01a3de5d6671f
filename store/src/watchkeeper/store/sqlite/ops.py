"""The key/value SQL of :class:`~watchkeeper.store.SqliteStateBackend` (metastore SQL is in
:mod:`watchkeeper.store.sqlite.meta`).

Write operations are plain functions ``op(tx, ...)`` that the group-commit writer runs in its
thread, inside the batch transaction (see :mod:`watchkeeper.store.sqlite.writer`); they raise the store's own
errors (:class:`VersionConflictError`, :class:`AssetNotFoundError`) and leave sqlite3 errors to
the writer, which translates them. Reads are split in two: ``*_query`` builds the SQL and its
parameters for the aiosqlite reader, ``*_result`` turns the rows into the store's types.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from .._leases import check_fence
from .._types import (
    Fence,
    Put,
    RawEntry,
    StateScope,
    TaskScope,
    Writer,
)
from ..errors import AssetNotFoundError, VersionConflictError
from .schema import asset_match, from_db, to_db
from .writer import Tx, Upsert

Row = tuple[Any, ...]
Query = tuple[str, Sequence[object]]

_TASK_COLS: Final = (
    "key, value, version, updated_at, writer_kind, writer_name, writer_try, expires_at, "
    "never_expire"
)
_ASSET_COLS: Final = (
    "s.key, s.value, s.version, s.updated_at, s.writer_kind, s.writer_name, s.writer_try"
)
_TASK_IN: Final = "dag_id = ? AND run_id = ? AND task_id = ? AND map_index = ?"
_TASK_KEY: Final = f"{_TASK_IN} AND key = ?"

_TASK_INSERT: Final = """
    INSERT INTO task_state (dag_id, run_id, task_id, map_index, key, value, version, updated_at,
                            writer_kind, writer_name, writer_try, expires_at, never_expire)
    VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?)
"""
_TASK_UPSERT: Final = (
    _TASK_INSERT
    + """
    ON CONFLICT (dag_id, run_id, task_id, map_index, key) DO UPDATE SET
        value = excluded.value, version = task_state.version + 1,
        updated_at = excluded.updated_at, writer_kind = excluded.writer_kind,
        writer_name = excluded.writer_name, writer_try = excluded.writer_try,
        expires_at = excluded.expires_at, never_expire = excluded.never_expire
    RETURNING version
"""
)
_TASK_CREATE: Final = _TASK_INSERT + " ON CONFLICT DO NOTHING RETURNING version"
_TASK_CAS: Final = f"""
    UPDATE task_state SET value = ?, version = version + 1, updated_at = ?, writer_kind = ?,
        writer_name = ?, writer_try = ?, expires_at = ?, never_expire = ?
    WHERE {_TASK_KEY} AND version = ?
    RETURNING version
"""

_ASSET_INSERT: Final = """
    INSERT INTO asset_state (asset_id, key, value, version, updated_at,
                             writer_kind, writer_name, writer_try)
    VALUES (?, ?, ?, 1, ?, ?, ?, ?)
"""
ASSET_UPSERT: Final = (
    _ASSET_INSERT
    + """
    ON CONFLICT (asset_id, key) DO UPDATE SET
        value = excluded.value, version = asset_state.version + 1,
        updated_at = excluded.updated_at, writer_kind = excluded.writer_kind,
        writer_name = excluded.writer_name, writer_try = excluded.writer_try
    RETURNING version
"""
)
_ASSET_CREATE: Final = _ASSET_INSERT + " ON CONFLICT DO NOTHING RETURNING version"
_ASSET_CAS: Final = """
    UPDATE asset_state SET value = ?, version = version + 1, updated_at = ?, writer_kind = ?,
        writer_name = ?, writer_try = ?
    WHERE asset_id = ? AND key = ? AND version = ?
    RETURNING version
"""

_TASK_PK_COLS: Final = "dag_id, run_id, task_id, map_index, key"
_new_upsert: Final = tuple.__new__
_TASK_ROW: Final = "(?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?)"
_ASSET_ROW: Final = "(?, ?, ?, 1, ?, ?, ?, ?)"


class UpsertGroup:
    """Plain upserts of one table as one multi-row ``INSERT ... ON CONFLICT DO UPDATE``.

    ``RETURNING`` gives each row's primary key with its new version, so the writer can hand
    every caller its own version. The writer never puts one key twice in a statement.
    """

    def __init__(self, insert: str, row: str, upsert: str, pk_cols: str) -> None:
        head, _, tail = insert.partition("VALUES")
        conflict = upsert.removeprefix(insert).replace(
            "RETURNING version", f"RETURNING {pk_cols}, version"
        )
        self._head = head + "VALUES "
        self._row = row
        self._tail = tail.replace(row, "") + conflict
        self._sql: dict[int, str] = {}

    def execute(self, conn: sqlite3.Connection, rows: Sequence[Row]) -> dict[Row, int]:
        n = len(rows)
        sql = self._sql.get(n)
        if sql is None:
            sql = self._sql[n] = self._head + ", ".join([self._row] * n) + self._tail
        params = [value for row in rows for value in row]
        return {tuple(r[:-1]): r[-1] for r in conn.execute(sql, params).fetchall()}


TASK_UPSERTS: Final = UpsertGroup(_TASK_INSERT, _TASK_ROW, _TASK_UPSERT, _TASK_PK_COLS)
ASSET_UPSERTS: Final = UpsertGroup(_ASSET_INSERT, _ASSET_ROW, ASSET_UPSERT, "asset_id, key")

# -- rows to types ---------------------------------------------------------------------------


def writer_cols(writer: Writer | None) -> tuple[str | None, str | None, int | None]:
    if writer is None:
        return None, None, None
    return writer.kind, writer.name, writer.try_number


def _writer(kind: Any, name: Any, try_number: Any) -> Writer | None:
    return None if kind is None else Writer(kind, name, try_number)


def _entry(row: Row, expires_at: datetime | None = None, never_expire: bool = False) -> RawEntry:
    """A row of ``key, value, version, updated_at, writer_kind, writer_name, writer_try``."""
    return RawEntry(
        key=row[0],
        value_json=row[1],
        version=row[2],
        updated_at=from_db(row[3]),
        writer=_writer(row[4], row[5], row[6]),
        expires_at=expires_at,
        never_expire=never_expire,
    )


def _task_entry(row: Row) -> RawEntry:
    """A task row: the asset row's columns, then ``expires_at, never_expire``."""
    return _entry(row, None if row[7] is None else from_db(row[7]), bool(row[8]))


_asset_entry = _entry


def _task_params(scope: TaskScope) -> tuple[str, str, str, int]:
    return scope.dag_id, scope.run_id, scope.task_id, scope.map_index


# -- key/value reads -------------------------------------------------------------------------


def get_query(scope: StateScope, key: str) -> Query:
    if isinstance(scope, TaskScope):
        return f"SELECT {_TASK_COLS} FROM task_state WHERE {_TASK_KEY}", (
            *_task_params(scope),
            key,
        )
    # One query both resolves the asset (no row: unknown) and finds the key (NULLs: missing).
    where, params = asset_match(scope, "a")
    sql = (
        f"SELECT a.id, {_ASSET_COLS} FROM assets a "
        f"LEFT JOIN asset_state s ON s.asset_id = a.id AND s.key = ? "
        f"WHERE {where} ORDER BY a.id LIMIT 1"
    )
    return sql, (key, *params)


def get_result(scope: StateScope, rows: list[Row]) -> RawEntry | None:
    if isinstance(scope, TaskScope):
        return _task_entry(rows[0]) if rows else None
    if not rows:
        raise AssetNotFoundError(str(scope))
    return None if rows[0][1] is None else _asset_entry(rows[0][1:])


def list_query(scope: StateScope) -> Query:
    if isinstance(scope, TaskScope):
        sql = f"SELECT {_TASK_COLS} FROM task_state WHERE {_TASK_IN} ORDER BY key"
        return sql, _task_params(scope)
    where, params = asset_match(scope)
    sql = (
        f"SELECT a.id, {_ASSET_COLS} "
        f"FROM (SELECT id FROM assets WHERE {where} ORDER BY id LIMIT 1) AS a "
        f"LEFT JOIN asset_state s ON s.asset_id = a.id ORDER BY s.key"
    )
    return sql, params


def list_result(scope: StateScope, rows: list[Row]) -> list[RawEntry]:
    if isinstance(scope, TaskScope):
        return [_task_entry(row) for row in rows]
    if not rows:
        raise AssetNotFoundError(str(scope))
    return [_asset_entry(row[1:]) for row in rows if row[1] is not None]


# -- key/value writes (run by the writer, in its thread) -------------------------------------


def check_fence_in(tx: Tx, fence: Fence | None) -> None:
    """Refuse a fenced write whose lease is not live (the batch's write lock is held)."""
    if fence is None:
        return
    row = tx.conn.execute(
        "SELECT l.owner, l.token, n.expires_at FROM trigger_leases AS l LEFT JOIN trigger_nodes "
        "AS n ON n.owner = l.owner AND n.alive = 1 WHERE l.trigger_id = ?",
        (fence.trigger_id,),
    ).fetchone()
    held = None if row is None else (row[0], row[1], None if row[2] is None else from_db(row[2]))
    check_fence(fence, held, tx.now()[0])


def upsert(tx: Tx, put: Put) -> Upsert:
    """The row of a plain upsert, for the writer to coalesce (resolves an asset scope).

    A writer with a fence is checked here, so a refused write never reaches a statement.
    """
    writer = put.writer
    if writer is None:
        who: tuple[str | None, str | None, int | None] = (None, None, None)
    else:
        if writer.fence is not None:
            check_fence_in(tx, writer.fence)
        who = (writer.kind, writer.name, writer.try_number)
    stamp = tx.now()[1]
    scope, key = put.scope, put.key
    if isinstance(scope, TaskScope):
        pk: Row = (scope.dag_id, scope.run_id, scope.task_id, scope.map_index, key)
        expires = None if put.expires_at is None else to_db(put.expires_at)
        row = (*pk, put.value_json, stamp, *who, expires, int(put.never_expire))
        return _new_upsert(Upsert, (TASK_UPSERTS, pk, row))
    pk = (tx.resolve(scope)[0], key)
    # Upsert(...) without its Python-level __new__: once per write.
    return _new_upsert(Upsert, (ASSET_UPSERTS, pk, (*pk, put.value_json, stamp, *who)))


def put(tx: Tx, put: Put) -> int:
    """Upsert one key; with ``expected_version`` a compare-and-set. Exactly one write statement."""
    conn = tx.conn
    up = upsert(tx, put)
    expected_version = put.expected_version
    if expected_version is None:
        return up.group.execute(conn, [up.row])[up.pk]
    task = up.group is TASK_UPSERTS
    if expected_version == 0:
        rows = conn.execute(_TASK_CREATE if task else _ASSET_CREATE, up.row).fetchall()
    else:
        # The CAS sets every column but the key and the version, then matches key and version.
        width = len(up.pk)
        values = up.row[width:]
        cas = _TASK_CAS if task else _ASSET_CAS
        rows = conn.execute(cas, (*values, *up.pk, expected_version)).fetchall()
    if rows:
        return int(rows[0][0])
    table, where = (
        ("task_state", _TASK_KEY) if task else ("asset_state", "asset_id = ? AND key = ?")
    )
    current = conn.execute(f"SELECT version FROM {table} WHERE {where}", up.pk).fetchone()
    raise VersionConflictError(put.key, expected_version, 0 if current is None else current[0])


def _check_writer_in(tx: Tx, writer: Writer | None) -> None:
    if writer is not None and writer.fence is not None:
        check_fence_in(tx, writer.fence)


def delete(tx: Tx, scope: StateScope, key: str, writer: Writer | None) -> bool:
    """Delete one key; a writer with a stale fence is refused before the statement."""
    _check_writer_in(tx, writer)
    if isinstance(scope, TaskScope):
        cursor = tx.conn.execute(
            f"DELETE FROM task_state WHERE {_TASK_KEY}", (*_task_params(scope), key)
        )
    else:
        asset_id = tx.resolve(scope)[0]
        cursor = tx.conn.execute(
            "DELETE FROM asset_state WHERE asset_id = ? AND key = ?", (asset_id, key)
        )
    return cursor.rowcount > 0


def clear(tx: Tx, scope: StateScope, all_map_indices: bool, writer: Writer | None) -> int:
    """Delete every key of the scope; a writer with a stale fence is refused first."""
    _check_writer_in(tx, writer)
    if isinstance(scope, TaskScope):
        if all_map_indices:
            cursor = tx.conn.execute(
                "DELETE FROM task_state WHERE dag_id = ? AND run_id = ? AND task_id = ?",
                (scope.dag_id, scope.run_id, scope.task_id),
            )
        else:
            cursor = tx.conn.execute(
                f"DELETE FROM task_state WHERE {_TASK_IN}", _task_params(scope)
            )
    else:
        asset_id = tx.resolve(scope)[0]
        cursor = tx.conn.execute("DELETE FROM asset_state WHERE asset_id = ?", (asset_id,))
    return cursor.rowcount
