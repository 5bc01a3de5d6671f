"""Event commits on PostgreSQL: the statements that write events with their state, and how a
round of :class:`~.ops.CommitOp` and each :class:`~.ops.BatchCommitOp` are applied.

A round of single event commits is **one statement**: it resolves the asset names, locks the
leases the commits are fenced by (``FOR SHARE``, in ``trigger_id`` order, held until the
transaction ends), refuses whole commits whose asset is unknown or whose lease is not live,
inserts the others' events and upserts their state. So the batch's transaction is three round
trips (``BEGIN`` with the events lock, this statement, ``COMMIT``) whatever the fences.

The commits travel as one JSON document and one array of timestamps, not as a dozen arrays:
asyncpg checks every element of an array it encodes against three abstract classes, which cost
more than the statement's own work on the client (see BENCHMARKS.md). JSON strings carry every
text exactly (``payload`` and state values are JSON text themselves, so they travel as
strings, not as nested JSON that the server might reformat).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._leases import check_fence
from .._types import AssetEvent
from .._values import decode_value
from ..errors import AssetNotFoundError, LeaseLostError, StateStoreError

if TYPE_CHECKING:
    import asyncpg

    from .ops import BatchCommitOp, CommitOp

__all__ = ["commit_batch_sql", "commit_batches", "commit_events", "event_commits_sql"]

_encode = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":")).encode


def event_commits_sql(p: str, prelude: str | None = None) -> tuple[str, str]:
    """The statements of one round of event commits: with dedup keys, and without (which needs
    neither the lookup nor the speculative insert); see :func:`_event_commits_sql`."""
    return _event_commits_sql(p, prelude, dedup=True), _event_commits_sql(p, prelude, dedup=False)


def _event_commits_sql(p: str, prelude: str | None, *, dedup: bool) -> str:
    """One round of event commits (each asset at most once in it; see the module).

    With ``prelude`` (the events lock and NOTIFY, a ``SELECT`` of two calls) the statement is
    a whole transaction on its own: every row it reads or writes comes through ``o``, which
    joins the prelude's one row, so the lock is taken before any event id is drawn.

    ``$1`` is a JSON array with one object per commit: ``w`` watcher, ``p`` payload, and when
    set ``d`` dedup key, ``ft`` / ``fo`` / ``fk`` the fence's trigger,
    owner and token, ``wk`` / ``wn`` / ``wt`` the writer. ``$2`` holds each commit's time,
    ``$3`` is true to check leases against ``now()`` (false: against each commit's time, a
    backend with a clock of its own). ``$4`` is a JSON array of the commits' state items:
    ``o`` the commit's 1-based index, ``k`` the key, ``v`` the value (JSON text). ``$5`` is a
    JSON array of the commits' assets, in order: ``o`` the commit's index, ``n`` the name.

    Rows: each event inserted (``id``, ``asset_name``, ``created_at``), in id order; then each
    commit refused (``op``: its 1-based index) with the first unknown asset it names, or else
    the lease it found (``owner``, ``token``, ``expires_at``; NULL when there is no lease row)
    and the database's time.
    """
    lock = "" if prelude is None else f"({prelude}) AS lock(held, sent) CROSS JOIN "
    skip = conflict = ""
    if dedup:
        skip = f"""
              AND (o.d IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {p}asset_events e
                    WHERE e.asset_id = r.asset_id AND e.dedup_key = o.d))"""
        conflict = """
            ON CONFLICT (asset_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING"""
    return f"""
        WITH o AS MATERIALIZED (
            SELECT o.ord, o.w, o.p, o.d, o.ft, o.fo, o.fk, o.wk, o.wn, o.wt,
                   ($2::timestamptz[])[o.ord::int4] AS at
            FROM {lock}ROWS FROM (json_to_recordset($1::json) AS (
                     w text, p text, d text, ft text, fo text, fk int8,
                     wk text, wn text, wt int4)) WITH ORDINALITY
                 AS o(w, p, d, ft, fo, fk, wk, wn, wt, ord)
        ), r AS MATERIALIZED (
            SELECT x.o AS op, x.pos, x.n AS name,
                   (SELECT a.id FROM {p}assets a WHERE a.active AND a.name = x.n) AS asset_id
            FROM ROWS FROM (json_to_recordset($5::json) AS (o int8, n text)) WITH ORDINALITY
                 AS x(o, n, pos)
        ), l AS MATERIALIZED (
            SELECT l.trigger_id, l.owner, l.token, n.expires_at
            FROM {p}trigger_leases l LEFT JOIN {p}trigger_nodes n
                 ON n.owner = l.owner AND n.alive
            WHERE l.trigger_id IN (SELECT o.ft FROM o WHERE o.ft IS NOT NULL)
            ORDER BY l.trigger_id FOR SHARE OF l
        ), refused AS MATERIALIZED (
            SELECT o.ord, l.owner, l.token, l.expires_at,
                   (SELECT r.name FROM r WHERE r.op = o.ord AND r.asset_id IS NULL
                    ORDER BY r.pos LIMIT 1) AS missing
            FROM o LEFT JOIN l ON l.trigger_id = o.ft
            WHERE EXISTS (SELECT 1 FROM r WHERE r.op = o.ord AND r.asset_id IS NULL)
               OR (o.ft IS NOT NULL AND NOT coalesce(
                       l.owner = o.fo AND l.token = o.fk
                       AND l.expires_at > CASE WHEN $3::bool THEN now() ELSE o.at END,
                       false))
        ), ev AS (
            INSERT INTO {p}asset_events
                (asset_id, asset_name, watcher, payload, dedup_key, created_at)
            SELECT r.asset_id, r.name, o.w, o.p, o.d, o.at
            FROM r JOIN o ON o.ord = r.op
            WHERE r.op NOT IN (SELECT ord FROM refused){skip}
            ORDER BY r.op, r.pos{conflict}
            RETURNING id, asset_id, asset_name, created_at
        ), st AS (
            INSERT INTO {p}asset_state AS t
                (asset_id, key, value, version, updated_at,
                 writer_kind, writer_name, writer_try)
            SELECT r.asset_id, j.k, j.v, 1, o.at, o.wk, o.wn, o.wt
            FROM json_to_recordset($4::json) AS j(o int8, k text, v text)
            JOIN o ON o.ord = j.o JOIN r ON r.op = j.o
            WHERE r.asset_id IN (SELECT asset_id FROM ev)
            ON CONFLICT (asset_id, key) DO UPDATE SET
                value = EXCLUDED.value, version = t.version + 1,
                updated_at = EXCLUDED.updated_at, writer_kind = EXCLUDED.writer_kind,
                writer_name = EXCLUDED.writer_name, writer_try = EXCLUDED.writer_try
        )
        SELECT id, asset_name, created_at, NULL::int8 AS op, NULL::text AS owner,
               NULL::int8 AS token, NULL::timestamptz AS expires_at, NULL::text AS missing
        FROM ev
        UNION ALL
        SELECT NULL, NULL, now(), ord, owner, token, expires_at, missing FROM refused
        ORDER BY 1, 4
    """


async def commit_events(
    conn: asyncpg.Connection,
    statements: tuple[str, str],
    ops: Sequence[CommitOp],
    db_clock: bool,
) -> None:
    """Apply one round of event commits (no two share an asset) with one statement (of
    ``statements``: the one with dedup keys, the one without), setting each op's result (its
    events, in id order) or error (nothing of it written)."""
    keyed = False
    docs: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    assets: list[dict[str, Any]] = []
    stamps = []
    by_name: dict[str, CommitOp] = {}
    for index, op in enumerate(ops, 1):
        c = op.commit
        doc: dict[str, Any] = {"w": c.watcher, "p": c.payload_json}
        for name in op.names:
            assets.append({"o": index, "n": name})
            by_name[name] = op
        items.extend({"o": index, "k": key, "v": value} for key, value in c.state.items())
        if c.dedup_key is not None:
            doc["d"] = c.dedup_key
            keyed = True
        fence = c.fence
        if fence is not None:
            doc["ft"], doc["fo"], doc["fk"] = fence.trigger_id, fence.owner, fence.token
        writer = c.writer
        if writer is not None:
            doc["wk"], doc["wn"], doc["wt"] = writer.kind, writer.name, writer.try_number
        docs.append(doc)
        stamps.append(op.created_at)
        op.result = []
    rows = await conn.fetch(
        statements[0] if keyed else statements[1],
        _encode(docs),
        stamps,
        db_clock,
        _encode(items),
        _encode(assets),
    )
    payloads: dict[int, Any] = {}
    for event_id, name, created_at, index, owner, token, expires_at, missing in rows:
        if event_id is None:
            _refuse(ops[index - 1], owner, token, expires_at, missing, created_at, db_clock)
            continue
        op = by_name[name]
        c = op.commit
        payload = payloads.get(id(op), payloads)
        if payload is payloads:
            payload = payloads[id(op)] = (
                decode_value(c.payload_json) if c.decoded is None else c.decoded[0]
            )
        op.result.append(AssetEvent(event_id, name, c.watcher, payload, c.dedup_key, created_at))


def _refuse(
    op: CommitOp, owner: Any, token: Any, expires_at: Any, missing: Any, now: Any, db_clock: bool
) -> None:
    """Record why the statement refused ``op`` (it wrote nothing of it): the first unknown
    asset it names, or else the lease it found (no row when ``token`` is NULL)."""
    op.result = None
    if missing is not None:
        op.error = AssetNotFoundError(missing)
        return
    fence = op.commit.fence
    if fence is None:  # pragma: no cover - the statement refuses only these two cases
        raise StateStoreError("an event commit was refused for no reason the store knows")
    held = None if token is None else (owner, token, expires_at)
    try:
        check_fence(fence, held, now if db_clock else op.created_at)
    except LeaseLostError as exc:
        op.error = exc
        return
    raise StateStoreError(  # pragma: no cover - the statement and check_fence disagree
        f"the lease check refused a commit of {fence.trigger_id!r} that {held!r} allows"
    )


async def commit_batches(
    conn: asyncpg.Connection, statements: tuple[str, str], ops: Sequence[BatchCommitOp]
) -> None:
    """Apply each event batch with one statement of its own (``statements``: the one with
    dedup keys, the one without)."""
    keyed_sql, plain_sql = statements
    for op in ops:
        b = op.batch
        w = b.writer
        who = (None, None, None) if w is None else (w.kind, w.name, w.try_number)
        keys = list(b.state)
        dedup_keys = [dedup_key for _, dedup_key in b.events]
        keyed = any(key is not None for key in dedup_keys)
        rows = await conn.fetch(
            keyed_sql if keyed else plain_sql,
            [payload for payload, _ in b.events],
            dedup_keys if keyed else [],  # unnest pads the shorter array with NULLs
            [asset_id for asset_id, _ in op.targets],
            [name for _, name in op.targets],
            b.watcher,
            op.created_at,
            keys,
            [b.state[k] for k in keys],
            *who,
        )
        op.result = _batch_events(op, rows)


def _batch_events(op: BatchCommitOp, rows: Sequence[Any]) -> list[AssetEvent]:
    """Pair the returned ``(id, asset_id, dedup_key)`` rows, in id order, with the events.

    An event without a dedup key is always inserted; one with a key is inserted on an asset
    when that pair came back (its first event in the batch). The ids follow the insert's
    ``ORDER BY``; a mismatch (which would be a bug) fails the op rather than mislabel events.
    """
    b = op.batch
    targets = op.targets
    returned = {(asset_id, dedup_key) for _, asset_id, dedup_key in rows if dedup_key is not None}
    expected: list[tuple[int, int, str]]  # (event index, asset_id, asset name)
    if not returned and len(rows) == len(b.events) * len(targets):
        # Nothing suppressed (the usual batch, without dedup keys): every event on every asset.
        expected = [(i, asset_id, name) for i in range(len(b.events)) for asset_id, name in targets]
    else:
        expected = []
        for index, (_, dedup_key) in enumerate(b.events):
            for asset_id, name in targets:
                if dedup_key is not None:
                    if (asset_id, dedup_key) not in returned:
                        continue
                    returned.discard((asset_id, dedup_key))  # a later repeat was suppressed
                expected.append((index, asset_id, name))
    if len(expected) != len(rows):
        raise StateStoreError(f"{len(rows)} events came back for {len(expected)} inserted")
    decoded = b.decoded
    if decoded is None:  # decoded once per event, for all its assets
        decoded = tuple(decode_value(payload_json) for payload_json, _ in b.events)
    watcher, events, created_at = b.watcher, b.events, op.created_at
    out: list[AssetEvent] = []
    for (index, asset_id, name), (event_id, got_asset, got_key) in zip(expected, rows, strict=True):
        dedup_key = events[index][1]
        if got_asset != asset_id or got_key != dedup_key:
            raise StateStoreError("the ids of a batch's events do not follow its order")
        out.append(AssetEvent(event_id, name, watcher, decoded[index], dedup_key, created_at))
    return out


def commit_batch_sql(p: str, *, dedup: bool) -> str:
    """The statement of one event batch of one trigger: each event on each asset, in (event,
    asset) order so the ids follow it; its state once per asset where at least one event was
    inserted. A batch without dedup keys needs neither the lookup nor the speculative insert."""
    skip = (
        f"""WHERE e.dedup_key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {p}asset_events x
                    WHERE x.asset_id = a.asset_id AND x.dedup_key = e.dedup_key)"""
        if dedup
        else ""
    )
    conflict = (
        "ON CONFLICT (asset_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING" if dedup else ""
    )
    return f"""
        WITH ev AS (
            INSERT INTO {p}asset_events
                (asset_id, asset_name, watcher, payload, dedup_key, created_at)
            SELECT a.asset_id, a.asset_name, $5, e.payload, e.dedup_key, $6
            FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS e(payload, dedup_key, ord)
            CROSS JOIN unnest($3::int8[], $4::text[]) WITH ORDINALITY
                 AS a(asset_id, asset_name, ord)
            {skip}
            ORDER BY e.ord, a.ord
            {conflict}
            RETURNING id, asset_id, dedup_key
        ), st AS (
            INSERT INTO {p}asset_state AS t
                (asset_id, key, value, version, updated_at,
                 writer_kind, writer_name, writer_try)
            SELECT w.asset_id, j.key, j.value, 1, $6, $9, $10, $11
            FROM (SELECT DISTINCT asset_id FROM ev) w
            CROSS JOIN unnest($7::text[], $8::text[]) AS j(key, value)
            ON CONFLICT (asset_id, key) DO UPDATE SET
                value = EXCLUDED.value, version = t.version + 1,
                updated_at = EXCLUDED.updated_at, writer_kind = EXCLUDED.writer_kind,
                writer_name = EXCLUDED.writer_name, writer_try = EXCLUDED.writer_try
        )
        SELECT id, asset_id, dedup_key FROM ev ORDER BY id
    """
