"""The event log's JSON text (what the API's pages and streams serve) is the event's record,
field by field, on memory, SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from watchkeeper.store import Asset
from watchkeeper.store.protocols import (
    BaseStateBackend,
    EventCommit,
    encode_json,
)


async def test_event_json_equals_the_event_record(backend: BaseStateBackend) -> None:
    """Every key and value of the raw listing's objects equals ``AssetEvent.to_record()``,
    ``created_at`` included, whether the commit time has microseconds, trailing zeros or none."""
    assert backend.services.controls is not None
    await backend.events.aregister_assets([Asset("a"), Asset("b")])
    times = [
        datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0, 1, 120000, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0, 2, tzinfo=UTC),
    ]
    for n, at in enumerate(times):
        backend.clock = lambda at=at: at  # type: ignore[misc]
        payload = encode_json({"n": n, "x": [1.5, "é", None]}, what="payload")
        dedup = f"k{n}" if n != 1 else None
        await backend.events.acommit(EventCommit("w", ("a", "b"), payload, dedup_key=dedup))
    records = [e.to_record() for e in await backend.events.alist_events()]
    assert [r["created_at"] for r in records[::2]] == [
        t.isoformat(timespec="microseconds") for t in times
    ]
    raw = await backend.events.alist_events(raw=True)
    assert [i for i, _ in raw] == [r["id"] for r in records]
    assert [json.loads(text) for _, text in raw] == records
    newest = await backend.events.alist_events(newest_first=True, limit=2, raw=True)
    assert [json.loads(text) for _, text in newest] == records[::-1][:2]


def test_an_event_keeps_its_payload_text_until_read() -> None:
    """An event built from its payload's JSON text equals the one built from the payload;
    the text is decoded on the first read, once; the event is immutable and pickles whole."""
    import pickle

    import pytest
    from watchkeeper.store.protocols import AssetEvent

    at = datetime(2030, 1, 1, tzinfo=UTC)
    text = '{"n":1,"x":[1.5,"é",null]}'
    lazy = AssetEvent.from_json(7, "a", "w", text, "k", at)
    eager = AssetEvent(7, "a", "w", {"n": 1, "x": [1.5, "é", None]}, "k", at)
    assert lazy == eager and repr(lazy) == repr(eager)
    assert hash(AssetEvent.from_json(1, "a", "w", "2", None, at)) == hash(
        AssetEvent(1, "a", "w", 2, None, at)
    )
    assert lazy.payload is lazy.payload
    assert lazy != AssetEvent(8, "a", "w", {"n": 1, "x": [1.5, "é", None]}, "k", at)
    assert pickle.loads(pickle.dumps(AssetEvent.from_json(7, "a", "w", text, "k", at))) == eager
    with pytest.raises(AttributeError, match="immutable"):
        lazy.id = 8
