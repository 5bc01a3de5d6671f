"""State written as JSON text already (a consumer's acknowledgement, an event commit's state)
follows the rules of ``aset``: the same key and value checks, the same errors, on memory,
SQLite and PostgreSQL, and a refused write changes nothing (the consumer's cursor neither)."""

from __future__ import annotations

from typing import Any

import pytest
from watchkeeper.store import (
    InvalidKeyError,
    InvalidValueError,
    KeyTypeError,
    StateStoreError,
    ValueTooLargeError,
    ValueTypeError,
)
from watchkeeper.store.protocols import BaseStateBackend, EventBatchCommit, EventCommit, StateWrite

from tests.store._contract import ORDERS_SCOPE, SCOPES, assert_rejected

BIG = '"' + "x" * (70 * 1024) + '"'  # 70 KB of JSON text: over the 64 KiB default limit

# Keys aset refuses, with the error it raises.
BAD_KEYS: dict[str, tuple[object, type[StateStoreError]]] = {
    "NUL": ("a\x00b", InvalidKeyError),
    "newline": ("a\nb", InvalidKeyError),
    "empty": ("", InvalidKeyError),
    "too long": ("k" * 1000, InvalidKeyError),
    "not a str": (7, KeyTypeError),
}

# Values as JSON text that aset could never write, with the error and a word of its message.
BAD_TEXTS: dict[str, tuple[object, type[StateStoreError], str]] = {
    "70 KB": (BIG, ValueTooLargeError, "over the limit"),
    "not JSON": ("{", InvalidValueError, "not JSON text"),
    "two values": ("1 2", InvalidValueError, "not JSON text"),
    "NaN": ("NaN", InvalidValueError, "cannot represent"),
    "null": ("null", InvalidValueError, "None"),
    "too deep": ("[" * 300 + "]" * 300, InvalidValueError, "nested more than"),
    "far too deep": ("[" * 100_000 + "]" * 100_000, InvalidValueError, "nested more than"),
    "lone surrogate": ('"\\ud800"', InvalidValueError, "surrogate"),
    "bytes": (b"1", InvalidValueError, "a str"),
}


async def cursor(store: Any) -> int:
    return int(await store.tasks.aconsumer_position("c"))


@pytest.mark.parametrize("case", sorted(BAD_KEYS))
async def test_ack_refuses_a_bad_key_as_aset_does(seeded: BaseStateBackend, case: str) -> None:
    """A key aset refuses is refused by an acknowledgement's state write, with the same error,
    before anything is written."""
    key, error = BAD_KEYS[case]
    store: Any = seeded
    with pytest.raises(error):
        await store.aset(ORDERS_SCOPE, key, 1)
    for scope in SCOPES:
        write = StateWrite(scope, key, "1")  # type: ignore[arg-type]
        await assert_rejected(store, error, store.tasks.aconsumer_ack, "c", 1, state=[write])
    assert await cursor(store) == 0


@pytest.mark.parametrize("case", sorted(BAD_TEXTS))
async def test_ack_refuses_a_bad_value_text(seeded: BaseStateBackend, case: str) -> None:
    """A value text that is not JSON, or whose value aset refuses (too large, NaN, None, too
    deep, a lone surrogate), is refused by an acknowledgement with the store's error."""
    text, error, says = BAD_TEXTS[case]
    store: Any = seeded
    for scope in SCOPES:
        good = StateWrite(scope, "ok", "1")
        await assert_rejected(
            store, error, store.tasks.aconsumer_ack, "c", 1,
            state=[good, StateWrite(scope, "k", text)], says=(says,),  # type: ignore[arg-type]
        )  # fmt: skip
    assert await cursor(store) == 0


@pytest.mark.parametrize("case", sorted(BAD_TEXTS))
async def test_commit_refuses_a_bad_state_text(seeded: BaseStateBackend, case: str) -> None:
    """An event commit (single or batch) whose state value text breaks a value rule is
    refused before any I/O: no event, no state."""
    text, error, says = BAD_TEXTS[case]
    store: Any = seeded
    commit = EventCommit("w", ("orders",), "1", state={"k": text})  # type: ignore[dict-item]
    await assert_rejected(store, error, store.events.acommit, commit, says=(says,))
    batch = EventBatchCommit("w", ("orders",), (("1", None),), state={"k": text})  # type: ignore[dict-item]
    await assert_rejected(store, error, store.events.acommit_batch, batch, says=(says,))


async def test_accepted_text_is_stored_compact(seeded: BaseStateBackend) -> None:
    """Valid JSON text is stored as aset would store its value, at the limits too."""
    store: Any = seeded
    limit = store.max_value_bytes
    largest = '"' + "x" * (limit - 2) + '"'
    writes = [
        StateWrite(ORDERS_SCOPE, "a", ' { "n" : [1, 2] } '),
        StateWrite(ORDERS_SCOPE, "b", largest),
    ]
    assert await store.tasks.aconsumer_ack("c", 1, state=writes) == 1
    assert await store.aget(ORDERS_SCOPE, "a") == {"n": [1, 2]}
    raw = await store.aget_raw(ORDERS_SCOPE, "a")
    assert raw.value_json == '{"n":[1,2]}'
    assert len(await store.aget(ORDERS_SCOPE, "b")) == limit - 2


async def test_value_type_error_is_kept_for_aset(seeded: BaseStateBackend) -> None:
    """aset's own type check is unchanged: a set is a ValueTypeError there."""
    with pytest.raises(ValueTypeError):
        await seeded.aset(ORDERS_SCOPE, "k", {1, 2})
