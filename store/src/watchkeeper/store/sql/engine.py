"""Statements written once, compiled per dialect, and the jobs that run them.

A statement is a template in one SQL that both databases read, with two kinds of holes:

- ``:name`` is a parameter, bound by name. ``:now`` is the clock (the batch's time on SQLite,
  ``coalesce(<the store's clock>, now())`` on PostgreSQL) and ``:expires`` the clock plus the
  parameter ``ttl`` seconds: the executor binds both, the job never does.
- ``{name}`` or ``{name:arg:arg}`` is a dialect fragment: ``{p}`` the table prefix,
  ``{now}``, ``{expires}``, ``{in:ids}`` (``= ANY`` of a list parameter, or ``IN`` over it),
  ``{each:ids:e}`` (a list parameter as a table ``e`` with one column ``value``),
  ``{for_update}``, ``{for_update_of:l}``, ``{skip_locked}``, ``{for_share}``,
  ``{for_share_of:l}`` (row locks: nothing on SQLite, whose writer holds the file's write
  lock), ``{ts:x}`` and ``{list:x}``
  (the parameter ``x`` is a timestamp, a list of str: bound the dialect's way).

:class:`Dialect` compiles a template once (cached per dialect and prefix) into a
:class:`Stmt`: the database's SQL with numbered parameters (``?1`` or ``$1``; a name used
twice is one parameter) and the order to bind them in.

A *job* is a generator: it yields :class:`Query` objects (made by :func:`rows`, :func:`count`,
:func:`run`; :func:`many` for one statement over many parameter sets), :data:`BEGIN` (the rest runs in one transaction: a no-op inside SQLite's batch)
or a :func:`notify`, and receives each query's result (its rows, or the number of rows it
changed). A job holds the rules of what is read and written, once; an executor runs it on
its database.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, TypeVar

__all__ = [
    "BEGIN",
    "Begin",
    "Dialect",
    "Job",
    "Many",
    "Notify",
    "Query",
    "Step",
    "Stmt",
    "count",
    "drive",
    "drive_sync",
    "many",
    "notify",
    "rows",
    "run",
]

T = TypeVar("T")
Row = tuple[Any, ...]
Fragment = str | Callable[..., str]

_FRAGMENT: Final = re.compile(r"\{(\w+)((?::\w+)*)\}")
_PARAM: Final = re.compile(r"(?<![:\w]):(\w+)")
_CLOCK: Final = frozenset({"now", "expires"})


@dataclass(frozen=True, slots=True)
class Stmt:
    """A compiled statement: ``sql`` in the dialect, ``names`` the parameters in bind order,
    ``encoders`` how the dialect stores each of them (``None``: as it is)."""

    sql: str
    names: tuple[str, ...]
    encoders: tuple[Callable[[Any], Any] | None, ...]

    def bind(self, params: Mapping[str, Any], now: Any, expires: Callable[[float], Any]) -> Row:
        """The arguments in order: ``params``, the clock ``now``, ``expires(params["ttl"])``."""
        out: list[Any] = []
        for name, encode in zip(self.names, self.encoders, strict=True):
            if name == "now":
                out.append(now)
            elif name == "expires":
                out.append(expires(params["ttl"]))
            elif encode is None:
                out.append(params[name])
            else:
                out.append(encode(params[name]))
        return tuple(out)


class Dialect:
    """What one database spells its own way; compiles templates into :class:`Stmt`."""

    def __init__(
        self,
        name: str,
        *,
        param: Callable[[int], str],
        fragments: Mapping[str, Fragment],
        encoders: Mapping[str, Callable[[Any], Any]],
        timestamp: Callable[[Any], datetime],
        json_list: Callable[[Any], list[Any]],
        row_locks: bool,
    ) -> None:
        self.name = name
        #: Whether writers lock rows (PostgreSQL), or one write holds the whole database (SQLite).
        self.row_locks = row_locks
        self._param = param
        self._fragments = dict(fragments)
        self._encoders = dict(encoders)
        #: A timestamp column as an aware datetime.
        self.timestamp = timestamp
        #: A list column (JSON text on SQLite, an array on PostgreSQL) as a list.
        self.json_list = json_list
        self._cache: dict[tuple[str, str], Stmt] = {}

    def __repr__(self) -> str:
        return f"<Dialect {self.name}>"

    def compile(self, template: str, prefix: str = "") -> Stmt:
        """``template`` in this dialect, for tables named ``{prefix}<table>`` (cached)."""
        key = (template, prefix)
        stmt = self._cache.get(key)
        if stmt is None:
            stmt = self._cache[key] = self._compile(template, prefix)
        return stmt

    def _compile(self, template: str, prefix: str) -> Stmt:
        encoders: dict[str, Callable[[Any], Any]] = {}

        def fragment(match: re.Match[str]) -> str:
            name, args = match[1], [a for a in match[2].split(":") if a]
            if name == "p":
                return prefix
            try:
                value = self._fragments[name]
            except KeyError:
                raise ValueError(f"no SQL fragment {name!r} in the {self.name} dialect") from None
            if name in self._encoders:  # the fragment's parameter is stored the dialect's way
                encoders[args[0]] = self._encoders[name]
            return value(*args) if callable(value) else value

        sql = _FRAGMENT.sub(fragment, template)
        names: list[str] = []

        def param(match: re.Match[str]) -> str:
            name = match[1]
            if name not in names:
                names.append(name)
            return self._param(names.index(name) + 1)

        sql = _PARAM.sub(param, sql)
        return Stmt(" ".join(sql.split()), tuple(names), tuple(encoders.get(n) for n in names))


Kind = Literal["rows", "count", "run"]


@dataclass(frozen=True, slots=True)
class Query:
    """One statement of a job, with its parameters; ``kind`` says what the job gets back:
    its rows, the number of rows it changed, or nothing."""

    stmt: Stmt
    params: Mapping[str, Any]
    kind: Kind


@dataclass(frozen=True, slots=True)
class Begin:
    """From here to its end the job runs in one transaction."""


@dataclass(frozen=True, slots=True)
class Many:
    """One statement run once per parameter set of ``params`` (``executemany``)."""

    stmt: Stmt
    params: Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Notify:
    """Wake the listeners of ``topic`` with ``payload`` (at commit; where the database can)."""

    topic: str
    payload: str


BEGIN: Final = Begin()

Job = Generator[Query | Many | Begin | Notify, Any, T]
"""A job: yields its statements, receives their results, returns its own."""


def rows(stmt: Stmt, **params: Any) -> Query:
    return Query(stmt, params, "rows")


def count(stmt: Stmt, **params: Any) -> Query:
    return Query(stmt, params, "count")


def run(stmt: Stmt, **params: Any) -> Query:
    return Query(stmt, params, "run")


def many(stmt: Stmt, params: Sequence[Mapping[str, Any]]) -> Many:
    return Many(stmt, params)


def notify(topic: str, payload: str) -> Notify:
    return Notify(topic, payload)


Step = Query | Many | Begin | Notify


def drive_sync(job: Job[T], step: Callable[[Step], Any]) -> T:
    """Run ``job`` to its end, each of its steps by ``step`` (which returns its result)."""
    result: Any = None
    try:
        while True:
            result = step(job.send(result))
    except StopIteration as stop:
        value: T = stop.value
        return value
    finally:
        job.close()


async def drive(job: Job[T], step: Callable[[Step], Awaitable[Any]]) -> T:
    """Run ``job`` to its end, each of its steps awaited by ``step``."""
    result: Any = None
    try:
        while True:
            result = await step(job.send(result))
    except StopIteration as stop:
        value: T = stop.value
        return value
    finally:
        job.close()
