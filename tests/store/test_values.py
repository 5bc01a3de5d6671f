"""Property tests of values and keys, against every backend.

Any JSON value round-trips exactly (same types all the way down); every invalid value or key
raises its documented error and leaves the store unchanged. Names (dedup keys, asset names,
task scope ids) drawn from every code point, controls and lone surrogates included, are either
refused before any I/O or round-trip, the same on every backend. Example counts are modest so
the three backends together stay within a few seconds.
"""

from __future__ import annotations

import enum
import json
import math
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from watchkeeper.store import (
    MAX_KEY_LENGTH,
    MAX_NAME_BYTES,
    MAX_SCOPE_ID_BYTES,
    MAX_VALUE_DEPTH,
    Asset,
    AssetScope,
    InvalidNameError,
    InvalidValueError,
    StateScope,
    TaskScope,
    ValueTypeError,
)
from watchkeeper.store.protocols import BaseStateBackend, EventCommit

from tests.support.values import same

TASK = TaskScope("dag", "run_1", "task")
ORDERS_SCOPE = AssetScope(name="orders")
SCOPES: tuple[StateScope, ...] = (TASK, ORDERS_SCOPE)

backend_settings = settings(
    max_examples=60,
    deadline=None,
    # The backend is opened once per test, not per example: examples share it on purpose.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

leaves = st.one_of(
    st.text(max_size=20),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
json_any = st.recursive(
    st.none() | leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
json_values = json_any.filter(lambda v: v is not None)
# Key characters: any but C0/C1 controls and lone surrogates (the naming rule refuses those).
key_chars = st.characters(blacklist_categories=("Cc", "Cs"))
keys = st.text(key_chars, min_size=1, max_size=MAX_KEY_LENGTH)
scopes = st.sampled_from(SCOPES)

not_json_leaves = st.one_of(
    st.datetimes().map(lambda d: d.replace(tzinfo=UTC)),
    st.dates(),
    st.sets(st.integers(), max_size=2),
    st.frozensets(st.integers(), max_size=2),
    st.tuples(st.integers()),
    st.binary(max_size=4),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.builds(object),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
    st.dictionaries(
        st.one_of(st.integers(), st.booleans(), st.none(), st.tuples(st.integers())),
        leaves,
        min_size=1,
        max_size=2,
    ),
)
non_finite = st.sampled_from([math.nan, -math.nan, math.inf, -math.inf])
surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
# A str holding at least one lone surrogate (two in a row stay two: Python never pairs them).
with_surrogate = st.tuples(st.text(max_size=4), surrogates, st.text(max_size=4)).map("".join)
# Ints past Python's int-to-text limit (4,300 digits by default), either sign.
too_long_ints = st.tuples(st.integers(4300, 6000), st.sampled_from([1, -1])).map(
    lambda pair: pair[1] * 10 ** pair[0]
)


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep around a 1."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# Beyond MAX_VALUE_DEPTH, up to far past what Python's recursion limit allows.
too_deep = st.sampled_from([MAX_VALUE_DEPTH + 1, MAX_VALUE_DEPTH + 7, 5_000, 100_000]).map(nested)


def embedded(bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``bad`` itself, or ``bad`` placed somewhere inside otherwise valid JSON containers."""

    def wrap(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        in_list = st.tuples(st.lists(json_values, max_size=2), inner).map(
            lambda pair: [*pair[0], pair[1]]
        )
        in_dict = st.tuples(
            st.dictionaries(st.text(max_size=4), json_values, max_size=2),
            st.text(max_size=4),
            inner,
        ).map(lambda triple: {**triple[0], triple[1]: triple[2]})
        return in_list | in_dict

    return st.recursive(bad, wrap, max_leaves=4)


invalid_values = st.one_of(
    st.just(None).map(lambda v: (v, ValueError)),
    embedded(non_finite).map(lambda v: (v, ValueError)),
    embedded(not_json_leaves).map(lambda v: (v, TypeError)),
    embedded(with_surrogate).map(lambda v: (v, InvalidValueError)),
    embedded(st.dictionaries(with_surrogate, leaves, min_size=1, max_size=2)).map(
        lambda v: (v, InvalidValueError)
    ),
    embedded(too_long_ints).map(lambda v: (v, InvalidValueError)),
    embedded(too_deep).map(lambda v: (v, InvalidValueError)),
)
invalid_keys = st.one_of(
    st.one_of(st.integers(), st.none(), st.binary(), st.floats(), st.tuples(st.text())).map(
        lambda k: (k, TypeError)
    ),
    st.just("").map(lambda k: (k, ValueError)),
    st.text(min_size=MAX_KEY_LENGTH + 1, max_size=MAX_KEY_LENGTH + 40).map(
        lambda k: (k, ValueError)
    ),
    # a C0 control character or DEL anywhere, or a lone surrogate (not UTF-8)
    st.tuples(
        st.text(key_chars, max_size=8),
        st.sampled_from(["\x00", "\n", "\x1b", "\x7f", "\ud800", "\udfff"]),
        st.text(key_chars, max_size=8),
    ).map(lambda parts: ("".join(parts), ValueError)),
    st.tuples(st.text(key_chars, max_size=8), surrogates).map(
        lambda parts: ("".join(parts), ValueError)
    ),
    # within 512 characters but over 1,024 bytes of UTF-8
    st.text(st.characters(min_codepoint=0x10000), min_size=257, max_size=MAX_KEY_LENGTH).map(
        lambda k: (k, ValueError)
    ),
)

# Any code point at all: C0 controls, DEL, C1 controls, lone surrogates, astral characters;
# sometimes long enough to pass a byte limit.
any_char = st.characters(blacklist_categories=())
any_name = st.one_of(
    st.text(any_char, max_size=12),
    st.text(st.characters(min_codepoint=0x80, blacklist_categories=()), min_size=120, max_size=300),
)


def is_valid_name(name: str, max_bytes: int) -> bool:
    """The naming rule, restated: non-empty UTF-8, no C0 control or DEL, within the bytes."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return False
    return 0 < size <= max_bytes and not any(c < " " or c == "\x7f" for c in name)


@pytest.fixture
async def store(backend: BaseStateBackend) -> BaseStateBackend:
    """The backend with the asset ``orders`` registered and one key in each scope."""
    await backend.events.aregister_assets([Asset("orders")])
    for scope in SCOPES:
        await backend.aset(scope, "seed", {"keep": [1, "me"]})
    return backend


async def snapshot(store: BaseStateBackend) -> list[object]:
    return [await store.alist(scope) for scope in SCOPES]


class TestValueProperties:
    @backend_settings
    @given(scope=scopes, key=keys, value=json_values)
    async def test_any_json_value_round_trips(
        self, store: BaseStateBackend, scope: StateScope, key: str, value: Any
    ) -> None:
        """Whatever JSON value is written under whatever valid key is read back exactly."""
        await store.aset(scope, key, value)
        assert same(await store.aget(scope, key), value)

    @backend_settings
    @given(scope=scopes, case=invalid_values)
    async def test_invalid_value_raises_and_changes_nothing(
        self, store: BaseStateBackend, scope: StateScope, case: tuple[Any, type[Exception]]
    ) -> None:
        """None, a non-finite float or a non-JSON object anywhere raises its error, writing nothing."""
        value, error = case
        before = await snapshot(store)
        with pytest.raises(error):
            await store.aset(scope, "seed", value)
        assert await snapshot(store) == before

    @backend_settings
    @given(scope=scopes, case=invalid_keys, method=st.sampled_from(["aget", "aset", "adelete"]))
    async def test_invalid_key_raises_and_changes_nothing(
        self,
        store: BaseStateBackend,
        scope: StateScope,
        case: tuple[Any, type[Exception]],
        method: str,
    ) -> None:
        """A non-str, empty or over-long key raises its error from every method, writing nothing."""
        key, error = case
        args = (scope, key, 1) if method == "aset" else (scope, key)
        before = await snapshot(store)
        with pytest.raises(error):
            await getattr(store, method)(*args)
        assert await snapshot(store) == before

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        writes=st.lists(
            st.tuples(st.text(key_chars, min_size=1, max_size=12), json_values), max_size=8
        )
    )
    async def test_list_matches_a_dict_model(
        self, backend: BaseStateBackend, writes: list[tuple[str, Any]]
    ) -> None:
        """After any sequence of writes the scope lists the last value of each key, by key."""
        scope = TaskScope("dag", "run_1", "model")
        await backend.aclear(scope)
        model: dict[str, Any] = {}
        for key, value in writes:
            await backend.aset(scope, key, value)
            model[key] = value
        listed = await backend.alist(scope)
        assert [e.key for e in listed] == sorted(model)
        assert all(same(e.value, model[e.key]) for e in listed)


class TestNameProperties:
    @backend_settings
    @given(name=any_name)
    async def test_any_dedup_key_is_refused_or_deduplicates(
        self, store: BaseStateBackend, name: str
    ) -> None:
        """A dedup key breaking the naming rule is refused before any I/O; any other commits
        once, reads back exactly, and suppresses its redelivery, on every backend."""
        before = await store.events.alist_events()
        if not is_valid_name(name, MAX_NAME_BYTES):
            with pytest.raises(InvalidNameError):
                EventCommit("w", ("orders",), "1", dedup_key=name)
            assert await store.events.alist_events() == before
            return
        commit = EventCommit("w", ("orders",), "1", dedup_key=name)
        first = await store.events.acommit(commit)
        again = await store.events.acommit(commit)
        assert [e.dedup_key for e in first] == ([name] if not any_seen(before, name) else [])
        assert again == []
        since = before[-1].id if before else 0
        assert [e.dedup_key for e in await store.events.alist_events(since_id=since)] == [
            e.dedup_key for e in first
        ]

    @backend_settings
    @given(name=any_name)
    async def test_any_asset_name_is_refused_or_round_trips(
        self, store: BaseStateBackend, name: str
    ) -> None:
        """An asset name breaking the rule is refused by Asset() and AssetScope(); any other
        registers, lists and addresses its state exactly, on every backend."""
        if not is_valid_name(name, MAX_NAME_BYTES):
            with pytest.raises(InvalidNameError):
                Asset(name or "\x00")
            with pytest.raises(InvalidNameError):
                AssetScope(name=name)
            return
        await store.events.aregister_assets([Asset(name)])
        assert name in {info.name for info in await store.events.alist_assets()}
        await store.aset(AssetScope(name=name), "k", name)
        assert await store.aget(AssetScope(name=name), "k") == name

    @backend_settings
    @given(ids=st.tuples(any_name, any_name, any_name))
    async def test_any_task_scope_is_refused_or_round_trips(
        self, store: BaseStateBackend, ids: tuple[str, str, str]
    ) -> None:
        """Task scope ids breaking the rule (with the 512-byte limit) are refused by
        TaskScope(); any others address their own state exactly, on every backend."""
        if not all(is_valid_name(part, MAX_SCOPE_ID_BYTES) for part in ids):
            with pytest.raises(InvalidNameError):
                TaskScope(*ids)
            return
        scope = TaskScope(*ids)
        await store.aset(scope, "k", list(ids))
        assert await store.aget(scope, "k") == list(ids)
        assert [e.key for e in await store.alist(scope)] == ["k"]


def any_seen(events: list[Any], dedup_key: str) -> bool:
    return any(e.dedup_key == dedup_key for e in events)


class TestStrategiesAreSound:
    def test_invalid_leaves_are_really_invalid(self) -> None:
        """The kinds of leaf the invalid strategies draw from are ones the store refuses."""
        from watchkeeper.store.protocols import encode_value

        for leaf in (date(2024, 1, 1), datetime(2024, 1, 1), Decimal(1), 1j, {1: 1}, (1,)):
            with pytest.raises(TypeError):
                encode_value("k", [leaf])
        for number in (math.nan, math.inf):
            with pytest.raises(ValueError):
                encode_value("k", {"a": number})


PAYLOAD_LIMIT = 1000


class TestEncodePayload:
    """encode_payload: an event payload's JSON text, within [events] max_payload_bytes."""

    def test_exactly_at_the_limit_is_accepted(self) -> None:
        """A payload whose JSON text is exactly the limit in bytes is returned as is."""
        from watchkeeper.store.protocols import encode_payload

        text = encode_payload("x" * (PAYLOAD_LIMIT - 2), max_payload_bytes=PAYLOAD_LIMIT)
        assert len(text.encode()) == PAYLOAD_LIMIT

    def test_one_byte_over_names_size_and_limit(self) -> None:
        """One byte over is a PayloadTooLargeError (a ValueError) naming size, limit and key."""
        from watchkeeper.store import PayloadTooLargeError
        from watchkeeper.store.protocols import encode_payload

        with pytest.raises(ValueError, match=r"1001 bytes.*limit of 1000 bytes") as caught:
            encode_payload({"a": "x" * (PAYLOAD_LIMIT - 7)}, max_payload_bytes=PAYLOAD_LIMIT)
        assert isinstance(caught.value, PayloadTooLargeError)
        assert "[events] max_payload_bytes" in str(caught.value)
        assert (caught.value.size, caught.value.limit) == (1001, PAYLOAD_LIMIT)

    def test_the_limit_counts_utf8_bytes(self) -> None:
        """502 characters of 'é' (1,006 bytes with the quotes) are over a 1,000-byte limit."""
        from watchkeeper.store import PayloadTooLargeError
        from watchkeeper.store.protocols import encode_payload

        encode_payload("é" * 499, max_payload_bytes=PAYLOAD_LIMIT)
        with pytest.raises(PayloadTooLargeError, match="1006 bytes"):
            encode_payload("é" * 502, max_payload_bytes=PAYLOAD_LIMIT)

    def test_none_payloads_and_no_limit(self) -> None:
        """A None payload is JSON null; max_payload_bytes=None disables the limit."""
        from watchkeeper.store.protocols import encode_payload

        assert encode_payload(None, max_payload_bytes=4) == "null"
        assert len(encode_payload("x" * 5000, max_payload_bytes=None)) == 5002

    def test_a_payload_that_is_not_json_is_still_refused(self) -> None:
        """The size check comes after the JSON check: a datetime is a TypeError."""
        from watchkeeper.store.protocols import encode_payload

        with pytest.raises(TypeError, match="payload"):
            encode_payload({"at": datetime(2024, 1, 1)}, max_payload_bytes=PAYLOAD_LIMIT)

    @settings(max_examples=50, deadline=None)
    @given(bad=st.one_of(with_surrogate, too_long_ints, too_deep))
    def test_the_new_invalid_leaves_are_really_invalid(self, bad: Any) -> None:
        """Lone surrogates, ints past the text limit and deep nesting are InvalidValueError."""
        from watchkeeper.store.protocols import encode_value

        with pytest.raises(InvalidValueError):
            encode_value("k", bad)

    @settings(max_examples=200, deadline=None)
    @given(name=any_name)
    def test_the_name_oracle_matches_the_store(self, name: str) -> None:
        """The restated naming rule agrees with the store's check on any text."""
        from watchkeeper.store._values import check_name

        try:
            check_name(name, what="name")
        except InvalidNameError:
            assert not is_valid_name(name, MAX_NAME_BYTES)
        else:
            assert is_valid_name(name, MAX_NAME_BYTES)


class _Level(enum.IntEnum):
    HIGH = 3


class _Text(str):
    __slots__ = ()


class TestEncodePayloadShortcuts:
    """encode_payload's shortcuts (a flat object not decoded back, the C scanner) give the
    text and the errors of the full check (encode_json's)."""

    @settings(max_examples=300, deadline=None)
    @given(value=json_any)
    def test_same_text_as_the_full_check(self, value: Any) -> None:
        """Any JSON payload gives the full check's text, which decodes to a value equal to
        it, typed the same all the way down."""
        from watchkeeper.store._payloads import _encode_checked
        from watchkeeper.store.protocols import encode_payload

        text = encode_payload(value, max_payload_bytes=None)
        assert text == _encode_checked(value, None)
        assert same(json.loads(text), value)

    @settings(max_examples=200, deadline=None)
    @given(case=invalid_values.filter(lambda case: case[0] is not None))
    def test_refuses_what_encode_payload_refuses(self, case: tuple[Any, type[Exception]]) -> None:
        """A value that is not plain JSON raises the same error as the full check."""
        from watchkeeper.store._payloads import _encode_checked
        from watchkeeper.store.protocols import encode_payload

        value, error = case
        with pytest.raises(error) as expected:
            _encode_checked(value, None)
        with pytest.raises(error) as got:
            encode_payload(value, max_payload_bytes=None)
        assert str(got.value) == str(expected.value)

    def test_a_cycle_and_the_size_limit(self) -> None:
        """A self-containing list is refused as too deep (InvalidValueError, as encode_payload
        says); a payload over the limit names its size."""
        from watchkeeper.store import PayloadTooLargeError
        from watchkeeper.store.protocols import encode_payload

        cycle: list[Any] = []
        cycle.append(cycle)
        with pytest.raises(InvalidValueError, match="nested more than"):
            encode_payload(cycle, max_payload_bytes=None)
        with pytest.raises(PayloadTooLargeError, match="1001 bytes"):
            encode_payload({"a": "x" * (PAYLOAD_LIMIT - 7)}, max_payload_bytes=1000)

    @pytest.mark.parametrize(
        "value",
        [
            {"id": 1, "body": "order 1", "amount": 0.25, "ok": True, "gone": None, "big": 2**70},
            {"id": 1, "amount": -0.0, "é": "naïve ✓"},
            {"x": float("nan")},
            {"x": float("inf")},
            {"x": -float("inf")},
            {1: "int key"},
            {"x": _Level.HIGH},
            {"x": _Text("a str subclass")},
            {"x": "\ud800"},
            {"x": b"bytes"},
            {"x": [1, 2]},
            {},
        ],
        ids=lambda value: repr(value)[:40],
    )
    def test_a_flat_object_takes_the_same_rules(self, value: dict[Any, Any]) -> None:
        """A flat object (one level of scalars) skips the decode-and-compare check only when
        every key is a str and every value a plain None, str, int, bool or finite float: any
        other gives the full check's error, and one that passes gives its text."""
        from watchkeeper.store._payloads import _encode_checked
        from watchkeeper.store.protocols import encode_payload

        try:
            expected = _encode_checked(value, None)
        except (InvalidValueError, ValueTypeError) as exc:
            with pytest.raises(type(exc)) as got:
                encode_payload(value, max_payload_bytes=None)
            assert str(got.value) == str(exc)
            return
        assert encode_payload(value, max_payload_bytes=None) == expected

    def test_a_flat_object_over_the_limit_names_its_size(self) -> None:
        from watchkeeper.store import PayloadTooLargeError
        from watchkeeper.store.protocols import encode_payload

        with pytest.raises(PayloadTooLargeError, match="1001 bytes"):
            encode_payload({"a": "x" * 993}, max_payload_bytes=1000)
        with pytest.raises(PayloadTooLargeError, match="1001 bytes"):
            encode_payload({"a": "é" * 496 + "x"}, max_payload_bytes=1000)
