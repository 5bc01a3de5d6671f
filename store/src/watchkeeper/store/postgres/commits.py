"""Event commits on PostgreSQL: the one statement that writes a round of event commits with
their state, and how its rows become each op's events.

Every event commit, a single event or a trigger's batch, is an :class:`~.ops.EventsOp` and
travels in one form: the round is **one statement** whose ``$1`` is a JSON array of the ops'
documents (:attr:`~.ops.EventsOp.doc`, each with its time). The statement resolves the
asset names, locks the leases the commits are fenced by (``FOR SHARE``, in ``trigger_id``
order, held until the transaction ends), refuses whole commits whose asset is unknown or whose
lease is not live, inserts the others' events (each event on each of its assets, in op,
event, asset order, so the ids follow it) and upserts each op's state once per asset where at
least one of its events was inserted. A dedup key already recorded on an asset, or taken by an
earlier event of the round, suppresses that event there (``ON CONFLICT DO NOTHING`` covers a
key another transaction inserted and has not committed yet). A round holds each asset at most
once, so no two ops of it write the same state row.

Why JSON and not parallel arrays: asyncpg checks every element of an array it encodes against
three abstract classes, which costs more than the statement's own work on the client (see
BENCHMARKS.md), and each op encodes its document before it is queued, so the writer only joins
texts (its time too: no array of timestamps). A one-key state (the usual watermark) travels as
two fields, so the server reads it as columns instead of taking a JSON object apart per op. A
payload is JSON text already: it goes into the document as it is, and the server takes it back
as ``json``, whose text is kept byte for byte (a JSON ``null`` payload comes back as SQL NULL,
hence the ``coalesce``); a payload with the escape ``\u0000``, which the server will not take
out of an object as ``json``, travels as a JSON string (``q``, or flagged in ``eq`` in a
batch). The other texts (names, keys, state values) travel as JSON strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .._leases import check_fence
from .._types import AssetEvent
from ..errors import AssetNotFoundError, LeaseLostError, StateStoreError
from .ops import EventsOp, at_sql

if TYPE_CHECKING:
    import asyncpg

__all__ = ["EventStatements", "commit_round"]


class EventStatements:
    """The statements of one round of event commits for a schema prefix ``p``: with dedup keys
    and without (which needs neither the lookup nor the speculative insert); with ``prelude``
    (the events lock and NOTIFY) each is a whole transaction on its own."""

    __slots__ = ("keyed", "plain")

    def __init__(self, p: str, prelude: str | None = None) -> None:
        self.keyed = _round_sql(p, prelude, dedup=True)
        self.plain = _round_sql(p, prelude, dedup=False)


def _round_sql(p: str, prelude: str | None, *, dedup: bool) -> str:
    """One round of event commits (see the module).

    With ``prelude`` (a ``SELECT`` of two calls) every row the statement reads or writes comes
    through ``o``, which joins the prelude's one row, so the lock is taken before any event id
    is drawn. ``$2`` is true to check leases against ``now()`` (false: against each op's time,
    a backend with a clock of its own).

    Rows: each event inserted (``id``, ``asset_name``, ``dedup_key``, ``created_at``), in id
    order; then each op refused (``op``: its 1-based index) with the first unknown asset it
    names, or else the lease it found (``owner``, ``token``, ``expires_at``; NULL when there is
    no lease row) and the database's time.
    """
    lock = "" if prelude is None else f"({prelude}) AS lock(held, sent) CROSS JOIN "
    skip = conflict = ""
    if dedup:
        skip = f"""
              AND (x.d IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {p}asset_events e
                    WHERE e.asset_id = r.asset_id AND e.dedup_key = x.d))"""
        conflict = """
            ON CONFLICT (asset_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING"""
    return f"""
        WITH o AS MATERIALIZED (
            SELECT o.ord, o.w, coalesce(o.q, o.p::text, 'null') AS p, o.d, o.e, o.ek, o.eq, o.a,
                   o.n, o.k, o.v, o.s, o.ft, o.fo, o.fk, o.wk, o.wn, o.wt, {at_sql("o.t")} AS at
            FROM {lock}ROWS FROM (json_to_recordset($1::json) AS (
                     w text, p json, q text, d text, e json, ek json, eq json, a text, n json,
                     k text, v text, s json, ft text, fo text, fk int8, wk text, wn text,
                     wt int4, t int8)) WITH ORDINALITY
                 AS o(w, p, q, d, e, ek, eq, a, n, k, v, s, ft, fo, fk, wk, wn, wt, t, ord)
        ), r AS MATERIALIZED (
            SELECT x.op, x.pos, x.name,
                   (SELECT a.id FROM {p}assets a WHERE a.active AND a.name = x.name) AS asset_id
            FROM (SELECT o.ord AS op, 1::int8 AS pos, o.a AS name FROM o WHERE o.n IS NULL
                  UNION ALL
                  SELECT o.ord, x.pos, x.name
                  FROM o CROSS JOIN LATERAL json_array_elements_text(o.n) WITH ORDINALITY
                       AS x(name, pos)
                  WHERE o.n IS NOT NULL) x
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
                       AND l.expires_at > CASE WHEN $2::bool THEN now() ELSE o.at END,
                       false))
        ), ev AS (
            INSERT INTO {p}asset_events
                (asset_id, asset_name, watcher, payload, dedup_key, created_at)
            SELECT r.asset_id, r.name, x.w, x.p, x.d, x.at
            FROM (SELECT o.ord, 1::int8 AS pos, o.w, o.p, o.d, o.at FROM o WHERE o.e IS NULL
                  UNION ALL
                  SELECT o.ord, v.pos, o.w,
                         CASE WHEN v.f = '1' THEN v.p #>> '{{}}' ELSE v.p::text END, v.d, o.at
                  FROM o CROSS JOIN LATERAL ROWS FROM (
                           json_array_elements(o.e), json_array_elements_text(o.ek),
                           json_array_elements_text(o.eq))
                       WITH ORDINALITY AS v(p, d, f, pos)
                  WHERE o.e IS NOT NULL) x
            JOIN r ON r.op = x.ord
            WHERE x.ord NOT IN (SELECT ord FROM refused){skip}
            ORDER BY x.ord, x.pos, r.pos{conflict}
            RETURNING id, asset_id, asset_name, dedup_key, created_at
        ), st AS (
            INSERT INTO {p}asset_state AS t
                (asset_id, key, value, version, updated_at,
                 writer_kind, writer_name, writer_try)
            SELECT r.asset_id, j.key, j.value, 1, j.at, j.wk, j.wn, j.wt
            FROM (SELECT o.ord, o.k AS key, o.v AS value, o.at, o.wk, o.wn, o.wt
                  FROM o WHERE o.k IS NOT NULL
                  UNION ALL
                  SELECT o.ord, j.key, j.value, o.at, o.wk, o.wn, o.wt
                  FROM o CROSS JOIN LATERAL json_each_text(o.s) AS j(key, value)
                  WHERE o.s IS NOT NULL) j
            JOIN r ON r.op = j.ord
            WHERE r.asset_id IN (SELECT asset_id FROM ev)
            ON CONFLICT (asset_id, key) DO UPDATE SET
                value = EXCLUDED.value, version = t.version + 1,
                updated_at = EXCLUDED.updated_at, writer_kind = EXCLUDED.writer_kind,
                writer_name = EXCLUDED.writer_name, writer_try = EXCLUDED.writer_try
        )
        SELECT id, asset_name, dedup_key, created_at, NULL::int8 AS op, NULL::text AS owner,
               NULL::int8 AS token, NULL::timestamptz AS expires_at, NULL::text AS missing
        FROM ev
        UNION ALL
        SELECT NULL, NULL, NULL, now(), ord, owner, token, expires_at, missing FROM refused
        ORDER BY 1, 5
    """


_EVENT: Final = AssetEvent.from_json


async def commit_round(
    conn: asyncpg.Connection, statements: EventStatements, ops: Sequence[EventsOp], db_clock: bool
) -> None:
    """Apply one round of event commits (no two share an asset) with one statement, setting
    each op's result (its events, in id order) or error (nothing of it written)."""
    keyed = False
    by_name: dict[str, EventsOp] = {}
    for op in ops:
        for name in op.names:
            by_name[name] = op
        keyed = keyed or op.keyed
        op.result = []
    rows = await conn.fetch(
        statements.keyed if keyed else statements.plain,
        "[" + ",".join([op.doc for op in ops]) + "]",
        db_clock,
    )
    several: list[EventsOp] = []
    for event_id, name, dedup_key, created_at, index, owner, token, expires_at, missing in rows:
        if event_id is None:
            _refuse(ops[index - 1], owner, token, expires_at, missing, created_at, db_clock)
            continue
        op = by_name[name]
        if len(op.events) > 1:  # paired with its events below, once all its rows are in
            if not op.result:
                several.append(op)
            op.result.append((event_id, name, dedup_key, created_at))
            continue
        # The payload stays the op's text: the event decodes it if it is read.
        op.result.append(_EVENT(event_id, name, op.watcher, op.events[0][0], dedup_key, created_at))
    for op in several:
        op.result = _batch_events(op, op.result)


def _batch_events(op: EventsOp, rows: list[tuple[int, str, str | None, Any]]) -> list[AssetEvent]:
    """Pair an op's returned ``(id, asset, dedup_key, created_at)`` rows, in id order, with its
    events.

    An event without a dedup key is always inserted; one with a key is inserted on an asset
    when that pair came back (its first event in the op). The ids follow the insert's
    ``ORDER BY``; a mismatch (which would be a bug) fails the op rather than mislabel events.
    """
    names, events = op.names, op.events
    if not op.keyed and len(names) == 1:  # a backfill's batch: every event, in order
        if len(rows) != len(events):
            raise StateStoreError(f"{len(rows)} events came back for {len(events)} inserted")
        w = op.watcher
        return [
            _EVENT(event_id, name, w, payload_json, None, created_at)
            for (event_id, name, _, created_at), (payload_json, _) in zip(rows, events, strict=True)
        ]
    returned = {(name, key) for _, name, key, _ in rows if key is not None}
    expected: list[tuple[int, str]] = []  # (event index, asset name)
    for index, (_, dedup_key) in enumerate(events):
        for name in names:
            if dedup_key is not None:
                if (name, dedup_key) not in returned:
                    continue
                returned.discard((name, dedup_key))  # a later repeat was suppressed
            expected.append((index, name))
    if len(expected) != len(rows):
        raise StateStoreError(f"{len(rows)} events came back for {len(expected)} inserted")
    out: list[AssetEvent] = []
    for (index, name), (event_id, got_name, got_key, created_at) in zip(
        expected, rows, strict=True
    ):
        payload_json, dedup_key = events[index]
        if got_name != name or got_key != dedup_key:
            raise StateStoreError("the ids of a batch's events do not follow its order")
        out.append(_EVENT(event_id, name, op.watcher, payload_json, dedup_key, created_at))
    return out


def _refuse(
    op: EventsOp, owner: Any, token: Any, expires_at: Any, missing: Any, now: Any, db_clock: bool
) -> None:
    """Record why the statement refused ``op`` (it wrote nothing of it): the first unknown
    asset it names, or else the lease it found (no row when ``token`` is NULL)."""
    op.result = None
    if missing is not None:
        op.error = AssetNotFoundError(missing)
        return
    fence = op.fence
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
