"""A fetched row becomes an event payload: json_row keeps plain values as they are and turns
every other through to_json_value, the same as converting each value."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import math
import uuid
from typing import Any

import pytest
from watchkeeper.watchers._sql import json_row, to_json_value


class _Level(enum.IntEnum):
    HIGH = 3


ROW: dict[str, Any] = {
    "id": 7,
    "body": "order 7",
    "gone": None,
    "ok": True,
    "amount": 0.25,
    "nan": math.nan,
    "inf": math.inf,
    "ninf": -math.inf,
    "at": dt.datetime(2024, 1, 1, 12, 30, tzinfo=dt.UTC),
    "day": dt.date(2024, 1, 1),
    "price": decimal.Decimal("1.10"),
    "blob": b"\x00\x01",
    "ref": uuid.UUID(int=1),
    "level": _Level.HIGH,
    "tags": ["a", 1],
    "doc": {"k": dt.time(1, 2)},
}


def test_json_row_equals_converting_each_value() -> None:
    assert json_row(ROW) == {name: to_json_value(value) for name, value in ROW.items()}
    converted = json_row(ROW)
    assert (converted["nan"], converted["inf"], converted["ninf"]) == (
        "NaN",
        "Infinity",
        "-Infinity",
    )
    assert converted["at"] == "2024-01-01T12:30:00+00:00"
    assert converted["price"] == "1.10"


@pytest.mark.parametrize("name", list(ROW))
def test_each_value_keeps_its_converted_type(name: str) -> None:
    """Not only equal: a bool stays a bool, an IntEnum becomes what to_json_value makes of it."""
    got = json_row({name: ROW[name]})[name]
    expected = to_json_value(ROW[name])
    assert type(got) is type(expected)
    assert got == expected or (isinstance(got, float) and math.isnan(got))
