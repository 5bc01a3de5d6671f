"""The messages of PostgreSQL's ``pgoutput`` plugin (protocol version 1), decoded.

:class:`PgOutputDecoder` reads the binary messages that
``pg_logical_slot_peek_binary_changes(..., 'proto_version', '1', 'publication_names', ...)``
returns, one ``bytes`` per row, and turns them into plain values: a :class:`Begin` and a
:class:`Commit` around each transaction, and one :class:`Change` per row inserted, updated
or deleted (or per table truncated). ``Relation`` messages describe a table (its columns, their
types, which belong to the replica identity) before its first change in each decoding session;
the decoder keeps them and names the columns of each row by them. ``Type`` and ``Origin``
messages carry nothing a change needs and are skipped, as is any message of a later protocol.

Column values arrive as text (the type's output function). A few are decoded where that is
exact and cheap: booleans, integers, finite reals, JSON; the rest (numeric, timestamps, arrays,
...) stay the server's text, so nothing is rounded and no time zone is guessed.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "Begin",
    "Change",
    "Commit",
    "PgOutputDecoder",
    "PgOutputError",
    "Relation",
    "format_lsn",
    "parse_lsn",
]

_EPOCH: Final = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
"""PostgreSQL's timestamps count microseconds from here."""

_BEGIN = struct.Struct("!qqI")
_COMMIT = struct.Struct("!bqqq")
_U32 = struct.Struct("!I")
_U16 = struct.Struct("!H")
_COLUMN = struct.Struct("!Ii")

_BOOL, _INT2, _INT4, _INT8, _OID = 16, 21, 23, 20, 26
_FLOAT4, _FLOAT8 = 700, 701
_JSON, _JSONB = 114, 3802
_INTEGERS: Final = frozenset({_INT2, _INT4, _INT8, _OID})
_REALS: Final = frozenset({_FLOAT4, _FLOAT8})
_JSONS: Final = frozenset({_JSON, _JSONB})


class PgOutputError(ValueError):
    """Raised when a ``pgoutput`` message cannot be read (a change of a table never described,
    a message cut short): the server speaks something this decoder does not know."""


def format_lsn(lsn: int) -> str:
    """``lsn`` as PostgreSQL writes it: ``"16/B374D848"`` (two hex halves)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """The number of an LSN written ``"16/B374D848"``; ``ValueError`` for anything else."""
    high, slash, low = text.partition("/")
    if not slash or not (1 <= len(high) <= 8 and 1 <= len(low) <= 8):
        raise ValueError(f"{text!r} is not an LSN (like '16/B374D848')")
    return (int(high, 16) << 32) | int(low, 16)


def _timestamp(micros: int) -> str:
    return (_EPOCH + dt.timedelta(microseconds=micros)).isoformat()


@dataclass(frozen=True, slots=True)
class Relation:
    """A table as the server described it: its columns, their type OIDs, its replica
    identity (``d`` default, ``f`` full, ``i`` an index, ``n`` nothing)."""

    oid: int
    schema: str
    table: str
    identity: str
    columns: tuple[str, ...]
    types: tuple[int, ...]
    key: tuple[bool, ...]
    """For each column, whether it is part of the replica identity."""


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts: its commit LSN (known ahead), commit time, transaction id."""

    final_lsn: int
    commit_time: str
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """A transaction ends: its commit LSN and the LSN just past its commit record."""

    commit_lsn: int
    end_lsn: int
    commit_time: str


@dataclass(slots=True)
class Change:
    """One row change: ``op`` is ``insert``, ``update``, ``delete`` or ``truncate``.

    ``new`` is the row after an insert or an update. ``old`` is the row before an update or a
    delete as far as the table's replica identity gives it: every column with ``REPLICA
    IDENTITY FULL``, the key columns otherwise (for an update, only when it changed the key;
    null when nothing was sent). ``unchanged`` names the columns of ``new`` left out because
    their TOASTed value did not change and was not sent.
    """

    op: str
    relation: Relation
    new: dict[str, Any] | None = None
    old: dict[str, Any] | None = None
    unchanged: list[str] | None = None


class PgOutputDecoder:
    """Decodes one decoding session's messages; keeps the relations it was told about."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}

    def decode(self, data: bytes) -> Begin | Commit | Change | list[Change] | None:
        """One message: a :class:`Begin`, :class:`Commit`, :class:`Change`, a list of changes
        (a ``TRUNCATE`` of several tables), or ``None`` for what carries no change."""
        try:
            kind = data[0:1]
            if kind == b"I":
                relation = self._relation(data, 1)
                new, unchanged, _ = self._tuple(data, 6, relation)  # after 'N'
                return Change("insert", relation, new=new, unchanged=unchanged)
            if kind == b"U":
                relation = self._relation(data, 1)
                old = None
                at = 5
                if data[at : at + 1] in (b"K", b"O"):
                    old, _, at = self._tuple(data, at + 1, relation, key_only=data[at] == 75)
                new, unchanged, _ = self._tuple(data, at + 1, relation)
                return Change("update", relation, new=new, old=old, unchanged=unchanged)
            if kind == b"D":
                relation = self._relation(data, 1)
                key_only = data[5] == 75  # 'K'
                old, _, _ = self._tuple(data, 6, relation, key_only=key_only)
                return Change("delete", relation, old=old)
            if kind == b"B":
                final_lsn, micros, xid = _BEGIN.unpack_from(data, 1)
                return Begin(final_lsn, _timestamp(micros), xid)
            if kind == b"C":
                _, commit_lsn, end_lsn, micros = _COMMIT.unpack_from(data, 1)
                return Commit(commit_lsn, end_lsn, _timestamp(micros))
            if kind == b"R":
                self._read_relation(data)
                return None
            if kind == b"T":
                (count,) = _U32.unpack_from(data, 1)
                oids = struct.unpack_from(f"!{count}I", data, 6)
                return [Change("truncate", self._known(oid)) for oid in oids]
            return None  # Type, Origin, logical messages: nothing to emit
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise PgOutputError(
                f"a pgoutput {data[0:1]!r} message of {len(data)} bytes cannot be read: {exc}"
            ) from exc

    def _known(self, oid: int) -> Relation:
        relation = self.relations.get(oid)
        if relation is None:
            raise PgOutputError(f"a change of relation {oid} came before its description")
        return relation

    def _relation(self, data: bytes, at: int) -> Relation:
        (oid,) = _U32.unpack_from(data, at)
        return self._known(oid)

    def _read_relation(self, data: bytes) -> None:
        (oid,) = _U32.unpack_from(data, 1)
        at = 5
        end = data.index(b"\0", at)
        schema = data[at:end].decode()
        at = end + 1
        end = data.index(b"\0", at)
        table = data[at:end].decode()
        at = end + 1
        identity = chr(data[at])
        (count,) = _U16.unpack_from(data, at + 1)
        at += 3
        names: list[str] = []
        types: list[int] = []
        key: list[bool] = []
        for _ in range(count):
            flags = data[at]
            end = data.index(b"\0", at + 1)
            names.append(data[at + 1 : end].decode())
            type_oid, _typmod = _COLUMN.unpack_from(data, end + 1)
            types.append(type_oid)
            key.append(bool(flags & 1))
            at = end + 9
        self.relations[oid] = Relation(
            oid, schema, table, identity, tuple(names), tuple(types), tuple(key)
        )

    def _tuple(
        self, data: bytes, at: int, relation: Relation, *, key_only: bool = False
    ) -> tuple[dict[str, Any], list[str] | None, int]:
        """``(row, unchanged TOAST columns or None, offset after it)`` of the TupleData at
        ``at``; ``key_only`` keeps the replica identity's columns only (a 'K' tuple sends the
        others as nulls)."""
        (count,) = _U16.unpack_from(data, at)
        at += 2
        names, types, key = relation.columns, relation.types, relation.key
        if count > len(names):
            raise PgOutputError(
                f"a row of {relation.schema}.{relation.table} has {count} columns, "
                f"its description {len(names)}"
            )
        row: dict[str, Any] = {}
        unchanged: list[str] | None = None
        for index in range(count):
            kind = data[at]
            at += 1
            if kind == 116:  # 't': text
                (size,) = _U32.unpack_from(data, at)
                at += 4
                text = data[at : at + size].decode()
                at += size
                if key_only and not key[index]:
                    continue
                row[names[index]] = _value(types[index], text)
            elif kind == 110:  # 'n': null
                if not key_only or key[index]:
                    row[names[index]] = None
            elif kind == 117:  # 'u': an unchanged TOASTed value, not sent
                if unchanged is None:
                    unchanged = []
                unchanged.append(names[index])
            elif kind == 98:  # 'b': binary (not asked for; kept as its text of hex)
                (size,) = _U32.unpack_from(data, at)
                at += 4
                value = "\\x" + data[at : at + size].hex()
                at += size
                if not key_only or key[index]:
                    row[names[index]] = value
            else:
                raise PgOutputError(f"unknown column kind {chr(kind)!r} in a row")
        return row, unchanged, at


def _value(type_oid: int, text: str) -> Any:
    """A column's text as JSON: booleans, integers, finite reals and JSON decoded; the rest
    as the server wrote it."""
    if type_oid in _INTEGERS:
        return int(text)
    if type_oid == _BOOL:
        return text == "t"
    if type_oid in _REALS:
        number = float(text)
        return number if number - number == 0.0 else text  # NaN, Infinity stay text
    if type_oid in _JSONS:
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text
