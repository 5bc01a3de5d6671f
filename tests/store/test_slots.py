"""Records filled through their slots' setters equal the ones ``__init__`` builds: the setters
follow the field order, for every record a hot path builds that way."""

from __future__ import annotations

import dataclasses

import pytest
from watchkeeper.store import AssetScope
from watchkeeper.store._slots import slot_setters
from watchkeeper.store._types import EventCommit, Put, Writer


@pytest.mark.parametrize("cls", [EventCommit, Put], ids=lambda c: c.__name__)
def test_setters_follow_the_fields(cls: type) -> None:
    """One setter per field, in field order: filling a record with its own field values
    through them gives an equal record."""
    names = [f.name for f in dataclasses.fields(cls)]
    assert len(slot_setters(cls)) == len(names)
    samples: dict[type, object] = {
        EventCommit: EventCommit("w", ("a",), "1", "k", {"s": "2"}, Writer("watcher", "w")),
        Put: Put(AssetScope(name="a"), "k", "3", None, False, 4, Writer("cli", "x")),
    }
    record = samples[cls]
    filled: object = object.__new__(cls)
    for setter, name in zip(slot_setters(cls), names, strict=True):
        setter(filled, getattr(record, name))
    assert filled == record
    assert [getattr(filled, name) for name in names] == [getattr(record, name) for name in names]
