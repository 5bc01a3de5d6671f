"""The values side of the SQL watcher: identifiers checked before they are quoted, and
database values turned into JSON."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["check_identifier", "check_table", "json_row", "to_json_value"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_identifier(owner: str, name: str, value: object) -> str:
    """Return ``value`` if it matches ``[A-Za-z_][A-Za-z0-9_]*`` (63 at most).

    The drivers quote it, which keeps reserved words usable and makes the match exact:
    PostgreSQL folds unquoted names to lower case when a table is created, so ``Events`` must
    be given as ``events``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{owner}: {name} must be a str, got {type(value).__name__}")
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(
            f"{owner}: {name} {value!r} is not a plain SQL identifier (letters, digits and "
            "underscores, not starting with a digit, at most 63 characters)"
        )
    return value


def check_table(owner: str, value: object) -> list[str]:
    """The parts of a table name, optionally qualified by one schema: ``schema.table``."""
    if not isinstance(value, str):
        raise TypeError(f"{owner}: table must be a str, got {type(value).__name__}")
    parts = value.split(".")
    if len(parts) > 2:
        raise ValueError(f"{owner}: table {value!r} has more than one '.' (use schema.table)")
    return [check_identifier(owner, "table", part) for part in parts]


_PLAIN: Final = frozenset({str, int, type(None), bool})
"""Types a row's value keeps as it is in JSON (a finite float too)."""


def json_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as a JSON object: :func:`to_json_value` of each value, called only for those
    that are not JSON already (one comprehension per row, no call per plain value)."""
    return {
        name: value
        if type(value) in _PLAIN or (type(value) is float and value - value == 0.0)
        else to_json_value(value)
        for name, value in row.items()
    }


def to_json_value(value: Any) -> Any:
    """Turn one database value into JSON: timestamps as ISO 8601, bytes as base64, and so on.

    Decimals become strings (no precision is lost), non-finite floats become the strings
    ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, intervals become seconds.
    """
    kind = type(value)
    if kind is str or kind is int or value is None or kind is bool:  # the common ones, first
        return value
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(item) for item in value]
    return str(value)
