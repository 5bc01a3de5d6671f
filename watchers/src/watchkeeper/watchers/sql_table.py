"""``SqlTableWatcher``: one event per new row of a SQLite, PostgreSQL or MySQL/MariaDB table,
exactly once.

Rows are read in ``(cursor_column, key_column)`` order past a watermark, ``batch_size`` at a
time (keyset pagination, so rows that share a cursor value are neither skipped nor repeated
across batches), and each batch is committed as one
:class:`~watchkeeper.triggerer.TriggerEventBatch`: one event per row and the state after the
last, in one transaction. A watermark on a serial id or a timestamp alone would skip rows that commit out
of order (a transaction that took its id earlier commits later), so each poll also re-reads a
*lag window* behind the watermark and emits the rows there whose primary key it has not emitted
yet (see :mod:`._window`):

- ``lag_window`` is in cursor units: ids for an integer cursor (rounded up), seconds for a
  timestamp cursor, the same number for a real cursor. A text cursor supports only
  ``lag_window=0``, which still catches rows that share the watermark's cursor value;
- a row whose cursor is further behind than that when it commits is never emitted;
- the keys emitted inside the window travel in the state (``<watcher name>.recent``), at most
  :attr:`SqlTableWatcher.recent_limit` keys and about 32 KiB; past that the window shrinks;
- a row whose cursor is moved forward (an ``updated_at`` cursor) is emitted again, as a new
  version; its key is what identifies it inside the window.

Rows with a NULL cursor are never emitted. Keys must be integers, text or UUIDs; cursors
integers, reals, timestamps or text. The database is reached through a driver of
:mod:`._sql` (SQLite, PostgreSQL, MySQL/MariaDB), which spells the queries written here in
its own SQL. On MySQL an AUTO_INCREMENT id, like a PostgreSQL serial, becomes visible at
commit, possibly after a higher one: the lag window is what catches it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic import ValidationInfo, field_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import Retries
from ._common import close_bounded, sleep_jittered, sleep_spread
from ._params import (
    Count,
    ReadyMadeWatcher,
    Seconds,
    SecondsOrZero,
    Text,
    WatcherParams,
    owner,
)
from ._sql import (
    Query,
    Source,
    SqlSourceError,
    check_identifier,
    check_table,
    driver_for,
    json_row,
    redact_dsn,
)
from ._window import LagWindow
from ._window_state import WindowState

__all__ = ["SqlTableParams", "SqlTableWatcher"]

log = get_logger(__name__)

Cursor = int | float | dt.datetime | str
Key = int | str

_RECONNECT_MAX = 30.0
"""The longest wait between two attempts to reach a database that does not answer."""


class SqlTableParams(WatcherParams):
    """The parameters of :class:`SqlTableWatcher`."""

    dsn: Text
    """``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``postgresql://…`` or
    ``mysql://user:password@host:3306/database`` (``mariadb://`` too; the ``mysql`` extra).
    It is part of ``serialize()``: prefer a password from ``PGPASSWORD`` or ``.pgpass`` on
    PostgreSQL; ``repr()`` and errors never show it."""
    table: Text
    """The table, optionally ``schema.table``: plain identifiers, quoted, so they match
    exactly."""
    cursor_column: Text
    """The column the watermark follows (integer, real, timestamp or text)."""
    key_column: Text
    """The primary key (integer, text or UUID): what identifies a row inside the lag window."""
    batch_size: Count = 500
    """At most this many rows per poll, committed in one transaction."""
    poll_interval: Seconds = 1.0
    """Seconds between two polls once caught up, with jitter."""
    lag_window: SecondsOrZero = 100
    """How far behind the watermark late rows are caught, in cursor units: ids for an integer
    cursor (rounded up), seconds for a timestamp, the same number for a real; a text cursor
    supports only 0."""
    columns: list[str] | None = None
    """The columns of the payload (the cursor and key columns are always included); ``None``:
    every column."""
    timeout: Seconds = 10.0
    """Seconds that connecting and each query may take before the connection counts as lost
    (and is replaced, with backoff)."""

    @field_validator("dsn")
    @classmethod
    def _dsn_has_a_driver(cls, value: str, info: ValidationInfo) -> str:
        driver_for(owner(info), value)
        return value

    @field_validator("table")
    @classmethod
    def _table_is_plain(cls, value: str, info: ValidationInfo) -> str:
        check_table(owner(info), value)
        return value

    @field_validator("cursor_column", "key_column")
    @classmethod
    def _column_is_plain(cls, value: str, info: ValidationInfo) -> str:
        return check_identifier(owner(info), str(info.field_name), value)

    @field_validator("columns", mode="before")
    @classmethod
    def _columns_list(cls, value: object, info: ValidationInfo) -> object:
        if value is None:
            return None
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise TypeError(
                f"{owner(info)}: columns must be a list of column names or None, "
                f"got {type(value).__name__}"
            )
        if not value:
            raise ValueError("columns must not be empty (use None for every column)")
        for name in value:
            check_identifier(owner(info), "a name in columns", name)
        duplicates = sorted({name for name in value if value.count(name) > 1})
        if duplicates:
            raise ValueError(f"columns lists {', '.join(duplicates)} more than once")
        return list(value)


class SqlTableWatcher(ReadyMadeWatcher[SqlTableParams]):
    """Yields one event per new row of a database table; the payload is the row as JSON.

    ``dsn`` is ``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``postgresql://…`` or
    ``mysql://user:password@host:3306/database`` (``mariadb://`` too; the ``mysql`` extra).
    The DSN is part of ``serialize()``: prefer a password from ``PGPASSWORD`` or ``.pgpass``
    on PostgreSQL; ``repr()`` and errors never show it.
    ``table`` (optionally ``schema.table``) and the column names must be plain identifiers; they
    are quoted, so they match exactly. ``columns`` limits the payload (the cursor and key
    columns are always included). Each poll reads at most ``batch_size`` rows and commits their
    events with the watcher's state in one transaction (a
    :class:`~watchkeeper.triggerer.TriggerEventBatch`), so a backfill costs one commit per
    ``batch_size`` rows, not one per row.

    Connecting and each query must answer within ``timeout`` seconds. A database that cannot
    be reached, a lost connection and one that stops answering (a network path that drops
    every packet leaves the connection open and silent) make the watcher reconnect by itself,
    with exponential backoff up to 30 s, for as long as it takes: its status is
    ``backing_off`` meanwhile, with the :class:`~watchkeeper.watchers.SqlSourceError` naming
    the table and the server as reason (logged as ``sql_source_reconnecting``), and it reads
    on from the committed watermark. A refusal (a missing table, bad credentials) fails the
    run instead. Raise ``timeout`` for a table whose queries take longer (one without an index
    on the cursor column).

    State keys (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name; the layout
    is the one of every lag-window watcher, see :mod:`._window_state`):

    - ``<name>.watermark``: ``{"kind", "cursor", "key"}``, the last row emitted: its cursor
      value (``kind`` is ``int``, ``float``, ``str`` or ``datetime``, the latter as ISO 8601
      text) and its key;
    - ``<name>.recent``: ``{"floor", "cursors", "keys"}``, the rows emitted inside the lag
      window.

    How to rewind it: stop the watcher, set ``<name>.watermark`` to
    ``{"kind": "int", "cursor": C, "key": K}`` (the cursor's kind) and ``<name>.recent`` to
    ``{"floor": C, "cursors": [], "keys": []}``, start it again: it emits the rows after
    ``(C, K)`` in (cursor, key) order. Delete both keys to read the table from its first row.
    The keys ``watermark``/``recent`` of earlier versions are adopted once, when the watcher
    has none of its own.

    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, a DSN no driver takes or a name that is
        not a plain identifier, naming it.
    """

    params_model = SqlTableParams

    recent_limit: int = 1000
    """At most this many recently emitted keys are kept in the state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p, who = self.params, type(self).__name__
        self._driver, self._target = driver_for(who, p.dsn)
        quote = self._driver.quote
        self._table_sql = ".".join(quote(part) for part in check_table(who, p.table))
        self._cursor_sql = quote(p.cursor_column)
        self._key_sql = quote(p.key_column)
        if p.columns is None:
            self._select_sql = "*"
        else:
            wanted = [*p.columns]
            wanted += [name for name in (p.cursor_column, p.key_column) if name not in wanted]
            self._select_sql = ", ".join(quote(name) for name in wanted)
        self._source: Source | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} dsn={redact_dsn(self.params.dsn)!r} table={self.params.table!r} "
            f"cursor={self.params.cursor_column!r} key={self.params.key_column!r} "
            f"connected={self._source is not None}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        state: WindowState[Cursor, Key] = WindowState(
            f"{type(self).__name__}({self.params.table!r})",
            type(self).__name__,
            self.watcher_name,
            lower=self._lower,
            size_of=lambda cursor, key: _json_size(cursor) + _json_size(key) + 4,
            max_keys=self.recent_limit,
            kinds=("int", "float", "str", "datetime"),
            key_types=(int, str),
        )
        window = await state.aload(self.asset_state_store)
        await sleep_spread(self.params.poll_interval)
        retries = Retries(
            self, log, "sql_source_reconnecting", cap=_RECONNECT_MAX, table=self.params.table
        )
        while True:
            try:
                async with contextlib.aclosing(self._connected(window, state)) as batches:
                    async for batch in batches:
                        retries.answered()
                        if batch is not None:
                            yield batch
            except SqlSourceError as exc:
                if not exc.transient:
                    raise
                await retries.failed(str(exc))

    async def _connected(
        self, window: LagWindow[Cursor, Key], state: WindowState[Cursor, Key]
    ) -> AsyncGenerator[TriggerEventBatch | None, None]:
        """One connection's life: a batch per poll that found rows, ``None`` per poll that
        found none (so the caller knows the source answers)."""
        async with self._driver.open(
            self._target, self.params.table, self.params.timeout
        ) as source:
            self._source = source
            try:
                while True:
                    late, new = await self._poll(source, window)
                    events: list[TriggerEvent] = []
                    for rows, is_new in ((late, False), (new, True)):
                        identities = [self._identity(row) for row in rows]
                        if not is_new:
                            for _, key in identities:
                                log.info("late_row", table=self.params.table, key=key)
                        window.record_many(identities, new=is_new)
                        events += [TriggerEvent(json_row(row)) for row in rows]
                    if events:
                        # The state after the last row: what its single event would carry.
                        yield TriggerEventBatch(events, state=state.state(window))
                    else:
                        yield None
                    if len(late) + len(new) < self.params.batch_size:
                        await sleep_jittered(self.params.poll_interval)
            finally:
                self._source = None

    async def cleanup(self) -> None:
        """Close the connection if ``run()`` was abandoned without being finalized."""
        source, self._source = self._source, None
        if source is not None:
            await close_bounded(source.aclose)

    async def _poll(
        self, source: Source, window: LagWindow[Cursor, Key]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Read the unseen rows of the lag window, then the rows past the watermark."""
        c, k = self._cursor_sql, self._key_sql
        head = f"SELECT {self._select_sql} FROM {self._table_sql} WHERE "
        tail = f" ORDER BY {c}, {k} LIMIT "
        late: list[dict[str, Any]] = []
        if window.watermark is not None:
            q = Query(self._driver)
            cursor, key = window.watermark
            where = f"{c} >= {q.param(window.low)} AND ({c}, {k}) <= ({q.param(cursor)}, "
            where += f"{q.param(key)})"
            if window.floor is not None:
                where += f" AND {c} > {q.param(window.floor)}"
            keys = window.keys()
            if keys:
                where += " AND " + q.not_among(k, keys)
            late = await source.fetch(
                head + where + tail + q.param(self.params.batch_size), q.params
            )
        room = self.params.batch_size - len(late)
        if room <= 0:
            return late, []
        q = Query(self._driver)
        if window.watermark is None:
            return late, await source.fetch(f"{head}{c} IS NOT NULL{tail}{q.param(room)}", q.params)
        cursor, key = window.watermark
        where = f"({c}, {k}) > ({q.param(cursor)}, {q.param(key)})"
        return late, await source.fetch(head + where + tail + q.param(room), q.params)

    def _identity(self, row: dict[str, Any]) -> tuple[Cursor, Key]:
        return (
            _cursor(self.params.cursor_column, _column(row, self.params.cursor_column)),
            _key(self.params.key_column, _column(row, self.params.key_column)),
        )

    # -- state ---------------------------------------------------------------------------------

    def _lower(self, cursor: Cursor) -> Cursor:
        lag = self.params.lag_window
        if isinstance(cursor, dt.datetime):
            return cursor - dt.timedelta(seconds=lag)
        if isinstance(cursor, int):
            return cursor - math.ceil(lag)
        if isinstance(cursor, float):
            return cursor - lag
        if lag:
            raise ValueError(
                f"{type(self).__name__}({self.params.table!r}): cursor column {self.params.cursor_column!r} "
                f"holds text, and a lag window needs an integer, real or timestamp cursor "
                f"(lag_window={lag!r}; set lag_window=0 to watch a text cursor)"
            )
        return cursor


def _column(row: dict[str, Any], name: str) -> Any:
    """The value of column ``name``; SQLite reports ``SELECT *`` names as declared, in any case."""
    if name in row:
        return row[name]
    folded = name.casefold()
    for column, value in row.items():
        if column.casefold() == folded:
            return value
    raise KeyError(f"the rows of the watched table have no column {name!r}")


def _cursor(column: str, value: object) -> Cursor:
    if type(value) is int or type(value) is str:  # once per row: the common ones first
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"cursor column {column!r} holds {value!r}, which cannot be a watermark")
    if isinstance(value, int | float | dt.datetime | str) and not isinstance(value, bool):
        return value
    raise TypeError(
        f"cursor column {column!r} holds {type(value).__name__} values; SqlTableWatcher "
        "supports integer, real, timestamp and text cursors"
    )


def _key(column: str, value: object) -> Key:
    if type(value) is int or type(value) is str:  # once per row: the common ones first
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, int | str) and not isinstance(value, bool):
        return value
    raise TypeError(
        f"key column {column!r} holds {type(value).__name__} values; SqlTableWatcher supports "
        "integer, text and uuid keys"
    )


def _json_size(value: Cursor) -> int:
    if isinstance(value, str):
        return len(value.encode()) + 2
    if isinstance(value, dt.datetime):
        return 34
    return len(repr(value))
