"""``PostgresChangesWatcher``: one event per committed row change of PostgreSQL tables, exactly
once, through logical decoding.

The rule it follows: a logical replication slot (plugin ``pgoutput``) keeps every change the
watcher has not confirmed. The watcher *peeks* at the slot with plain SQL
(``pg_logical_slot_peek_binary_changes``, which leaves the slot where it is), decodes the
``pgoutput`` messages itself (:mod:`._pgoutput`), and commits the changes as batches of events
with its position, the LSN where the last source transaction it emitted ends, in the asset
state, in one transaction per batch. Only after that commit does it move the slot on
(``pg_replication_slot_advance``). A crash between the two leaves the slot behind: the next
peek returns those transactions again, and the position in the state skips them. Nothing is
lost (the slot keeps what is not confirmed) and nothing is emitted twice (the state, committed
with the events, says what was).

Why SQL and not the streaming replication protocol: asyncpg does not speak the replication
protocol, and the peek-then-advance cycle needs nothing else; it polls (``poll_interval``)
rather than being pushed to, which costs latency, not throughput.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationInfo, field_validator, model_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import Retries
from ._common import import_off_loop, sleep_jittered
from ._params import Count, OptionalText, ReadyMadeWatcher, Seconds, Text, WatcherParams, owner
from ._pg_slot import PostgresChangesError, SlotSession
from ._pgoutput import Begin, Change, Commit, PgOutputDecoder, format_lsn, parse_lsn
from ._sql import check_table, redact_dsn

__all__ = ["PostgresChangesError", "PostgresChangesParams", "PostgresChangesWatcher"]

log = get_logger(__name__)


_RECONNECT_MAX = 30.0
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""Slot and publication names: what the server takes unquoted (it folds the publication
names of a peek's options to lower case)."""

_PEEK = (
    "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes("
    "$1, $2, $3, 'proto_version', '1', 'publication_names', $4)"
)


def _name(value: object, what: str, info: ValidationInfo) -> object:
    if not isinstance(value, str):
        return value  # the model's own type error
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} must be lower-case letters, digits and underscores, not "
            "starting with a digit, at most 63 characters"
        )
    return value


class PostgresChangesParams(WatcherParams):
    """The parameters of :class:`PostgresChangesWatcher`."""

    dsn: Text
    """``postgresql://user@host:5432/database`` of the database whose changes are watched; the
    user needs the ``REPLICATION`` attribute (and to own the tables, to create a
    publication). Prefer a password from ``PGPASSWORD`` or ``.pgpass``: the DSN is part of
    ``serialize()``; ``repr()``, errors and the status never show it."""
    slot: Text
    """The logical replication slot (plugin ``pgoutput``), created on first start if missing.
    One slot per watcher: a slot read by two watchers loses changes for one of them."""
    publication: OptionalText = None
    """The publication naming the tables watched. Without ``tables`` it must exist; with
    ``tables`` it is created if missing (default name: the slot's)."""
    tables: list[str] | None = None
    """The tables to watch (``table`` or ``schema.table``); a publication of exactly these is
    created if missing, and an existing one that lists others is refused."""
    batch_size: Count = 500
    """At most this many changes per batch of events (one transaction of ours); source
    transactions are kept whole unless one alone is larger."""
    max_changes: Count = 10_000
    """At most about this many changes are read per peek at the slot (whole transactions),
    after which the slot is advanced."""
    poll_interval: Seconds = 1.0
    """Seconds between two peeks once caught up, with jitter."""
    timeout: Seconds = 30.0
    """Seconds that connecting and each statement may take before the connection counts as
    lost (and is replaced, with backoff)."""

    @field_validator("dsn")
    @classmethod
    def _dsn_is_postgres(cls, value: str, info: ValidationInfo) -> str:
        scheme = value.partition(":")[0].lower()
        if scheme not in {"postgresql", "postgres"} or not value[len(scheme) :].startswith("://"):
            raise ValueError(
                f"dsn must start with 'postgresql://' or 'postgres://', got {redact_dsn(value)!r}"
            )
        return value

    @field_validator("slot")
    @classmethod
    def _slot_name(cls, value: object, info: ValidationInfo) -> object:
        return _name(value, "slot", info)

    @field_validator("publication")
    @classmethod
    def _publication_name(cls, value: object, info: ValidationInfo) -> object:
        return None if value is None else _name(value, "publication", info)

    @field_validator("tables", mode="before")
    @classmethod
    def _table_list(cls, value: object, info: ValidationInfo) -> object:
        if value is None:
            return None
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise TypeError(
                f"{owner(info)}: tables must be a list of table names or None, "
                f"got {type(value).__name__}"
            )
        if not value:
            raise ValueError("tables must not be empty (use None to give a publication)")
        for table in value:
            check_table(owner(info), table)
        if len(set(value)) != len(value):
            raise ValueError("tables lists a table twice")
        return list(value)

    @model_validator(mode="after")
    def _publication_or_tables(self) -> PostgresChangesParams:
        if self.publication is None and self.tables is None:
            raise ValueError("give a publication, or tables to publish")
        return self


@dataclass(slots=True)
class _Position:
    """How far the committed events reach in the slot's stream.

    ``lsn``: where the last source transaction emitted in full ends (its commit record's end);
    a transaction that commits before it was emitted. ``partial``: a transaction larger than a
    batch, emitted in part: its commit LSN and how many of its changes were emitted.
    """

    lsn: int | None = None
    partial: tuple[int, int] | None = None

    def state(self) -> dict[str, Any]:
        partial = self.partial
        return {
            "lsn": None if self.lsn is None else format_lsn(self.lsn),
            "partial": None
            if partial is None
            else {"commit_lsn": format_lsn(partial[0]), "changes": partial[1]},
        }


class PostgresChangesWatcher(ReadyMadeWatcher[PostgresChangesParams]):
    """Yields one event per row inserted, updated or deleted in some PostgreSQL tables.

    The events come in batches of whole source transactions. The payload is ``{"schema", "table", "op", "new", "old", "unchanged", "xid",
    "commit_lsn", "commit_time", "lsn"}``: ``op`` is ``"insert"``, ``"update"``,
    ``"delete"`` or ``"truncate"`` (one event per table truncated, without rows); ``new``
    the row after an insert or update; ``old`` the row before an update or delete as far as
    the table's replica identity gives it (every column with ``REPLICA IDENTITY FULL``; the
    key columns with the default identity, for an update only when it changed the key; else
    null); ``unchanged`` the columns left out of ``new`` because their large (TOASTed) value
    did not change, or null. Values are JSON: booleans, integers, finite reals and JSON
    columns decoded, every other type as PostgreSQL's text (numeric and timestamps
    included, so nothing is rounded). ``xid``, ``commit_lsn`` and ``commit_time`` are the
    source transaction's, ``lsn`` the change's own. Events come in commit order; the changes
    of one transaction in their order, in one batch unless it has more than ``batch_size``.

    Exactly once: each batch commits with the watcher's position (the LSN where its last whole
    source transaction ends, and how far into a larger one it got); only then is the slot
    advanced to it. After a crash between the commit and the advance, the slot gives those
    transactions again and the position skips them; before the commit, nothing was
    confirmed and they are read again. The slot is created (``pgoutput``) on the first start
    if missing, and with ``tables`` the publication too (the publication before the slot:
    changes committed before the slot exists are not seen). Changes are read by peeking
    (``pg_logical_slot_peek_binary_changes``), at most about ``max_changes`` at a time, every
    ``poll_interval`` seconds once caught up. A source transaction is held in memory whole on
    the server side of a peek; on ours, ``batch_size`` rows at a time.

    The slot's lag, the WAL bytes the server keeps for it, is measured after each peek:
    ``watchkeeper_source_slot_lag_bytes`` on ``/metrics`` and ``slot_lag_bytes`` in the log
    (``postgres_changes_read``). A slot nobody reads keeps all WAL from its position on:
    set ``max_slot_wal_keep_size`` on the server, and drop the slot of a watcher you remove
    (``SELECT pg_drop_replication_slot('<slot>')``).

    Connection: connecting and each statement must answer within ``timeout`` seconds. A
    server that cannot be reached, a lost or silent connection, or a slot still held by a
    previous connection make the watcher retry by itself with exponential backoff (up to
    30 s), its status ``backing_off`` with the reason (logged as
    ``postgres_changes_reconnecting``); a refusal (``wal_level`` is not ``logical``, a missing
    publication, a slot of another plugin, no permission) raises
    :class:`PostgresChangesError`. The DSN's password never appears in a ``repr``, an error,
    a log line or the status.

    State key (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name):

    - ``<name>.position``: ``{"lsn": "<X/Y>", "partial": null or {"commit_lsn": "<X/Y>",
      "changes": <n>}}``.

    How to rewind it: a slot cannot go back past what it confirmed. To start over, stop the
    watcher, drop the slot (``SELECT pg_drop_replication_slot('<slot>')``) and delete
    ``<name>.position``: the next start creates the slot anew and sees changes from then on.
    To skip ahead, set ``lsn`` to a later LSN.

    :raises ImportError: asyncpg is missing (the ``postgres-cdc`` extra).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = PostgresChangesParams
    positional = 3
    client = ("asyncpg", "postgres-cdc")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p = self.params
        self._publication = p.publication if p.publication is not None else p.slot
        self._name = f"{type(self).__name__}({p.slot!r})"
        self._session = SlotSession(
            self._name, p.dsn, p.slot, self._publication, p.tables, p.timeout
        )
        self._advanced = 0  # where this instance last advanced the slot to
        self.slot_lag_bytes: int | None = None
        """The WAL bytes the server keeps for the slot, as last measured (None before)."""

    def __repr__(self) -> str:
        p = self.params
        return (
            f"<{type(self).__name__} dsn={redact_dsn(p.dsn)!r} slot={p.slot!r} "
            f"publication={self._publication!r} connected={self._session.connection is not None}>"
        )

    def source_gauges(self) -> Mapping[str, float]:
        """What ``/metrics`` shows of the source: ``slot_lag_bytes`` once measured."""
        lag = self.slot_lag_bytes
        return {} if lag is None else {"slot_lag_bytes": float(lag)}

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        await import_off_loop("asyncpg")
        key = f"{self.watcher_name}.position"
        position = _stored(await self.asset_state_store.aget(key), key, self._name)
        retries = Retries(
            self, log, "postgres_changes_reconnecting", cap=_RECONNECT_MAX, slot=self.params.slot
        )
        while True:
            try:
                async with self._session.connected() as connection:
                    await self._session.prepare()
                    while True:
                        read = 0
                        peek = self._peek(connection, position, key)
                        async with contextlib.aclosing(peek) as items:
                            async for item in items:
                                if isinstance(item, int):
                                    read = item
                                else:
                                    yield item
                        retries.answered()  # a whole read went through
                        if read < self.params.max_changes:
                            await sleep_jittered(self.params.poll_interval)
            except PostgresChangesError as exc:
                if not exc.transient:
                    raise
                await retries.failed(str(exc))

    async def cleanup(self) -> None:
        """Close the connection if ``run()`` was abandoned without being finalized."""
        await self._session.close()

    # -- reading -------------------------------------------------------------------------------

    async def _peek(
        self, connection: Any, position: _Position, key: str
    ) -> AsyncGenerator[TriggerEventBatch | int, None]:
        """One peek at the slot: a batch of events at a time, then, once the slot was advanced
        past them, how many messages were read."""
        p = self.params
        session = self._session
        flush = await session.call(
            "reading the WAL position", connection.fetchval("SELECT pg_current_wal_flush_lsn()")
        )
        decoder = PgOutputDecoder()
        start = _Position(position.lsn, position.partial)  # what decides the skips
        work = _Position(position.lsn, position.partial)  # where the events gathered reach
        batch: list[TriggerEvent] = []
        pending: list[TriggerEvent] = []
        begin: Begin | None = None
        skip_whole = False
        skip_first = 0
        changes = 0
        read = 0
        last_end = 0
        action = f"reading slot {p.slot!r}"

        def emit(events: list[TriggerEvent]) -> TriggerEventBatch:
            return TriggerEventBatch(events, state={key: work.state()})

        async with contextlib.AsyncExitStack() as stack:
            transaction = connection.transaction(readonly=True)
            await session.call(action, transaction.start())
            stack.push_async_callback(session.finish, transaction)
            cursor = await session.call(
                action, connection.cursor(_PEEK, p.slot, flush, p.max_changes, self._publication)
            )
            while True:
                records = await session.call(action, cursor.fetch(p.batch_size))
                if not records:
                    break
                read += len(records)
                for record in records:
                    message = decoder.decode(record[1])
                    if message is None:
                        continue
                    if isinstance(message, Begin):
                        begin, changes, pending = message, 0, []
                        skip_whole = start.lsn is not None and message.final_lsn < start.lsn
                        partial = start.partial
                        skip_first = (
                            partial[1]
                            if partial is not None and partial[0] == message.final_lsn
                            else 0
                        )
                        continue
                    if isinstance(message, Commit):
                        last_end = max(last_end, message.end_lsn)
                        if skip_whole or begin is None:
                            continue
                        if batch and len(batch) + len(pending) > p.batch_size:
                            yield emit(batch)
                            position.lsn, position.partial = work.lsn, work.partial
                            batch = []
                        batch += pending
                        pending = []
                        work.lsn, work.partial = message.end_lsn, None
                        begin = None
                        if len(batch) >= p.batch_size:
                            yield emit(batch)
                            position.lsn, position.partial = work.lsn, work.partial
                            batch = []
                        continue
                    if skip_whole or begin is None:
                        continue
                    found = message if isinstance(message, list) else [message]
                    for change in found:
                        changes += 1
                        if changes <= skip_first:
                            continue
                        pending.append(_event(change, begin, record[0]))
                    if len(pending) >= p.batch_size:
                        # A source transaction larger than a batch: emitted in parts.
                        if batch:
                            yield emit(batch)
                            position.lsn, position.partial = work.lsn, work.partial
                            batch = []
                        work.partial = (begin.final_lsn, changes)
                        yield emit(pending)
                        position.lsn, position.partial = work.lsn, work.partial
                        pending = []
            if batch:
                yield emit(batch)
                position.lsn, position.partial = work.lsn, work.partial
        # Everything read is committed: the slot may forget it. All of the WAL up to
        # ``flush`` was decoded unless the peek stopped at max_changes.
        target = max(last_end, flush if read < p.max_changes else 0)
        if target > self._advanced:  # (an idle server's WAL does not move: nothing to do)
            await session.call(
                f"advancing slot {p.slot!r}",
                connection.execute("SELECT pg_replication_slot_advance($1, $2)", p.slot, target),
            )
            self._advanced = target
        lag = await session.call(
            f"measuring slot {p.slot!r}",
            connection.fetchval(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = $1",
                p.slot,
            ),
        )
        self.slot_lag_bytes = None if lag is None else int(lag)
        if read:
            log.debug(
                "postgres_changes_read",
                slot=p.slot,
                messages=read,
                slot_lag_bytes=self.slot_lag_bytes,
            )
        yield read


def _event(change: Change, begin: Begin, lsn: int) -> TriggerEvent:
    relation = change.relation
    return TriggerEvent(
        {
            "schema": relation.schema,
            "table": relation.table,
            "op": change.op,
            "new": change.new,
            "old": change.old,
            "unchanged": change.unchanged,
            "xid": begin.xid,
            "commit_lsn": format_lsn(begin.final_lsn),
            "commit_time": begin.commit_time,
            "lsn": format_lsn(lsn),
        }
    )


def _stored(value: object, key: str, owner: str) -> _Position:
    """The position kept under ``key`` (a fresh one when there is none)."""
    if value is None:
        return _Position()
    try:
        if isinstance(value, dict) and set(value) == {"lsn", "partial"}:
            lsn = value["lsn"]
            partial = value["partial"]
            position = _Position(None if lsn is None else parse_lsn(lsn))
            if partial is not None:
                position.partial = (parse_lsn(partial["commit_lsn"]), int(partial["changes"]))
            return position
    except (TypeError, ValueError, KeyError):
        pass
    raise ValueError(
        f"{owner}: the asset state {key!r} is not a position "
        f'({{"lsn": "<X/Y>", "partial": null}}): {value!r}'
    )
