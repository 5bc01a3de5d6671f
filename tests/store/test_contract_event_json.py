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
    """Every key and value of ``alist_event_json``'s objects equals ``AssetEvent.to_record()``,
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
    served = [json.loads(text) for _, text in await backend.events.alist_event_json(
        asset=None, since_id=0, limit=100
    )]  # fmt: skip
    assert served == records
