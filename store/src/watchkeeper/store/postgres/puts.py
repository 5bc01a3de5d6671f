"""A batch of plain asset-state upserts on PostgreSQL as one statement, in the event commits'
wire form.

The usual batch of ``aset`` calls (many writers, each its own key of an asset's state, none
fenced) needs no transaction around it: one statement resolves the batch's scopes, upserts
every row and returns each version, so it commits on its own in one round trip, where the
general path (:func:`~.batch.apply_batch`) takes four (``BEGIN``, the scopes, the upsert,
``COMMIT``). The rows travel as JSON, like event commits (:mod:`.commits`): ``$1`` the scopes
``[asset_id, name, uri]``, ``$2`` one ``[scope index, key, value, time, writer kind, name,
try]`` per put (trailing NULLs left off; the time as :func:`~.ops.epoch_us`).

A put whose scope names no active asset writes nothing and gets :class:`AssetNotFoundError`.
Two puts of one key go the general way (in successive statements); two puts of the batch on
one row through two scopes naming the same asset make the statement fail, and the writer then
replays the batch one op per transaction, as for any failed statement.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from json.encoder import encode_basestring as _quote
from typing import TYPE_CHECKING, Final, TypeGuard

from .._types import AssetScope
from ..errors import AssetNotFoundError
from .ops import PUT, Op, PutOp, at_sql, epoch_us
from .sql import resolve_sql

if TYPE_CHECKING:
    import asyncpg

__all__ = ["alone", "put_alone_sql", "upsert_alone"]

_encode: Final = json.JSONEncoder(
    ensure_ascii=False, check_circular=False, separators=(",", ":")
).encode


def put_alone_sql(p: str) -> str:
    """The statement of a batch of plain asset-state upserts (see the module)."""
    scope = resolve_sql("(s.j->>0)::int8", "s.j->>1", "s.j->>2", p)
    return f"""
        WITH s AS MATERIALIZED (
            SELECT s.ord, {scope} AS asset_id
            FROM json_array_elements($1::json) WITH ORDINALITY AS s(j, ord)
        ), i AS MATERIALIZED (
            SELECT i.ord, s.asset_id, i.j->>1 AS key, i.j->>2 AS value,
                   {at_sql("(i.j->>3)::int8")} AS at,
                   i.j->>4 AS wk, i.j->>5 AS wn, (i.j->>6)::int4 AS wt
            FROM json_array_elements($2::json) WITH ORDINALITY AS i(j, ord)
            JOIN s ON s.ord = (i.j->>0)::int8
        ), up AS (
            INSERT INTO {p}asset_state AS t
                (asset_id, key, value, version, updated_at, writer_kind, writer_name, writer_try)
            SELECT asset_id, key, value, 1, at, wk, wn, wt FROM i
            WHERE asset_id IS NOT NULL ORDER BY ord
            ON CONFLICT (asset_id, key) DO UPDATE SET
                value = EXCLUDED.value, version = t.version + 1,
                updated_at = EXCLUDED.updated_at, writer_kind = EXCLUDED.writer_kind,
                writer_name = EXCLUDED.writer_name, writer_try = EXCLUDED.writer_try
            RETURNING t.asset_id, t.key, t.version
        )
        SELECT i.asset_id, up.version FROM i
        LEFT JOIN up ON up.asset_id = i.asset_id AND up.key = i.key ORDER BY i.ord
    """


def alone(batch: Sequence[Op]) -> TypeGuard[Sequence[PutOp]]:
    """Whether ``batch`` is only plain, unfenced upserts of asset state, each of its own key
    (one statement)."""
    keys: set[tuple[object, str]] = set()
    for op in batch:
        if (
            type(op) is not PutOp
            or op.phase != PUT
            or type(op.scope) is not AssetScope
            or (op.writer is not None and op.writer.fence is not None)
        ):
            return False
        keys.add((op.scope, op.key))
    return len(keys) == len(batch)


async def upsert_alone(conn: asyncpg.Connection, sql: str, ops: Sequence[PutOp]) -> None:
    """Run the statement of ``ops`` (see :func:`alone`), setting each op's version or error."""
    scopes: dict[AssetScope, int] = {}
    docs: list[str] = []
    q = _quote
    for op in ops:
        s: AssetScope = op.scope  # type: ignore[assignment]  # alone() checked it
        index = scopes.get(s)
        if index is None:
            index = scopes[s] = len(scopes) + 1
        w = op.writer
        if w is None:
            docs.append(f"[{index},{q(op.key)},{q(op.value_json)},{epoch_us(op.at)}]")
        else:
            at = epoch_us(op.at)
            docs.append(_encode([index, op.key, op.value_json, at, w.kind, w.name, w.try_number]))
    rows = await conn.fetch(
        sql,
        _encode([[s.asset_id, s.name, s.uri] for s in scopes]),
        "[" + ",".join(docs) + "]",
    )
    for op, (asset_id, version) in zip(ops, rows, strict=True):
        if asset_id is None:
            op.error = AssetNotFoundError(str(op.scope))
        else:
            op.asset_id, op.result = asset_id, version
