"""The key/value contract every state backend honours (DESIGN.md, "Semantics the store must honour").

One module for all backends: the ``backend`` fixture runs each test against memory, SQLite and
PostgreSQL. A rejected call must leave the store exactly as it was, which ``assert_rejected``
checks by comparing every scope's entries and the event log before and after. Versions,
compare-and-set, asset scopes and the sync twins are in ``test_contract_versions.py``; the
metastore features (events, garbage collection, trigger status) in ``test_contract_metastore.py``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from watchkeeper.store import NEVER_EXPIRE, Asset, StateScope
from watchkeeper.store.protocols import BaseStateBackend, encode_value

from tests.store._contract import (
    ALL_SCOPES,
    INVOICES_SCOPE,
    ORDERS_SCOPE,
    OTHER_RUN,
    OTHER_TASK,
    SCOPES,
    TASK,
    TASK_MAP_0,
    TASK_MAP_1,
    assert_rejected,
    snapshot,
)
from tests.support.values import same

LIMIT = 65536


class TestGetAndSet:
    async def test_missing_key_reads_default(self, store: BaseStateBackend) -> None:
        """get() of a missing key returns None, or the default given, and writes nothing."""
        for scope in SCOPES:
            assert await store.aget(scope, "missing") is None
            assert await store.aget(scope, "missing", "fallback") == "fallback"
            assert await store.aget(scope, "missing", {"d": 1}) == {"d": 1}
            assert await store.alist(scope) == []

    async def test_set_then_get(self, store: BaseStateBackend) -> None:
        """A value written with set() is what get() returns, not the default."""
        for scope in SCOPES:
            await store.aset(scope, "job_id", f"spark-{scope}")
            assert await store.aget(scope, "job_id", "fallback") == f"spark-{scope}"

    async def test_set_upserts(self, store: BaseStateBackend) -> None:
        """A second set() of a key replaces the value; the key is listed once."""
        for scope in SCOPES:
            await store.aset(scope, "k", 1)
            await store.aset(scope, "k", {"two": 2})
            assert await store.aget(scope, "k") == {"two": 2}
            assert [(e.key, e.value) for e in await store.alist(scope)] == [("k", {"two": 2})]

    async def test_scopes_are_isolated(self, store: BaseStateBackend) -> None:
        """The same key in two task instances, runs, map indices or assets is two keys."""
        for number, scope in enumerate(ALL_SCOPES):
            await store.aset(scope, "k", number)
        for number, scope in enumerate(ALL_SCOPES):
            assert await store.aget(scope, "k") == number

    async def test_list_is_ordered_by_key(self, store: BaseStateBackend) -> None:
        """alist() returns every entry of the scope ordered by key, in code point order."""
        keys = ["b", "a", "c", "B", "ä", "_", "%", "a b", "Z", "ab", "a"]
        for scope in SCOPES:
            for key in keys:
                await store.aset(scope, key, key)
            assert [e.key for e in await store.alist(scope)] == sorted(set(keys))


ACCEPTED: list[Any] = [
    "text",
    "",
    'ünïcødé ✓ 🙂 \u0000 \n \\ "',
    0,
    -17,
    2**63 + 1,
    -(2**70),
    1.5,
    -0.25,
    -0.0,
    1e300,
    5e-324,
    1.0,
    True,
    False,
    [],
    {},
    [1, "a", None, 2.5, False],
    {"a": None, "b": [None]},
    {"nested": {"list": [{"deep": [1, {"deeper": ["x"]}]}]}, "n": 3},
    [[[[[[[[[[["ten deep"]]]]]]]]]]],
    {"": "empty key", "ключ": "значение", "with space": 1},
]
NOT_JSON: list[tuple[object, str]] = [
    (datetime(2024, 1, 1, tzinfo=UTC), "datetime"),
    ({1, 2}, "set"),
    (frozenset({1}), "frozenset"),
    ((1, 2), "tuple"),
    (object(), "object"),
    (b"bytes", "bytes"),
    (Decimal("1.5"), "Decimal"),
    ({1: "int key"}, "int"),
    ({("t",): 1}, "tuple"),
    ({"ok": {None: 1}}, "NoneType"),
    ([1, [2, datetime(2024, 1, 1)]], "datetime"),
    ({"a": {"b": (1,)}}, "tuple"),
]
NON_FINITE: list[object] = [
    math.nan,
    math.inf,
    -math.inf,
    [1.0, math.nan],
    {"a": {"b": [2.0, math.inf]}},
]


class TestValues:
    async def test_json_values_round_trip(
        self, store: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """Every JSON type, nested or not, reads back equal and of the same types."""
        for scope in SCOPES:
            for number, value in enumerate(ACCEPTED):
                with subtests.test(scope=str(scope), value=value):
                    await store.aset(scope, f"k{number}", value)
                    assert same(await store.aget(scope, f"k{number}"), value)
                    entry = await store.aget_entry(scope, f"k{number}")
                    assert entry is not None and same(entry.value, value)

    async def test_none_is_rejected(self, seeded: BaseStateBackend) -> None:
        """set(key, None) raises ValueError naming the key and changes nothing."""
        for scope in SCOPES:
            await assert_rejected(seeded, ValueError, seeded.aset, scope, "a", None, says=("'a'",))

    async def test_not_json_is_type_error(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """A value that is not JSON anywhere inside raises TypeError naming the type."""
        for scope in SCOPES:
            for value, type_name in NOT_JSON:
                with subtests.test(scope=str(scope), value=value):
                    await assert_rejected(
                        seeded, TypeError, seeded.aset, scope, "a", value, says=(type_name,)
                    )

    async def test_non_finite_float_is_value_error(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """NaN or an infinity anywhere in the value raises ValueError and changes nothing."""
        for scope in SCOPES:
            for value in NON_FINITE:
                with subtests.test(scope=str(scope), value=value):
                    await assert_rejected(
                        seeded, ValueError, seeded.aset, scope, "a", value, says=("JSON",)
                    )

    async def test_value_exactly_at_limit_is_accepted(self, store: BaseStateBackend) -> None:
        """A value whose JSON encoding is exactly max_value_bytes long is stored."""
        value = "x" * (LIMIT - 2)
        assert len(encode_value("k", value).encode()) == LIMIT
        for scope in SCOPES:
            await store.aset(scope, "k", value)
            assert await store.aget(scope, "k") == value

    async def test_value_over_limit_names_size_and_limit(self, seeded: BaseStateBackend) -> None:
        """One byte over max_value_bytes raises ValueError naming the key, size and limit."""
        for scope in SCOPES:
            value = "x" * (LIMIT - 1)
            await assert_rejected(
                seeded, ValueError, seeded.aset, scope, "a", value, says=("'a'", "65537", "65536")
            )

    async def test_limit_counts_utf8_bytes(self, seeded: BaseStateBackend) -> None:
        """The limit is on UTF-8 bytes: 32768 two-byte characters are over 64 KiB."""
        for scope in SCOPES:
            await seeded.aset(scope, "fits", "é" * ((LIMIT - 2) // 2))
            value = "é" * (LIMIT // 2)
            await assert_rejected(
                seeded, ValueError, seeded.aset, scope, "a", value, says=("65538",)
            )


KEY_METHODS = ("aget", "aset", "adelete", "aget_entry")


def key_call(
    store: BaseStateBackend, method: str, scope: StateScope, key: object
) -> tuple[Any, ...]:
    """The method and arguments of a call of ``method`` with ``key``."""
    if method == "aset":
        return (store.aset, scope, key, "v")
    return (getattr(store, method), scope, key)


class TestKeys:
    async def test_non_str_key_is_type_error(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """A key that is not a str raises TypeError from every method and changes nothing."""
        for scope in SCOPES:
            for key in (1, None, b"k", ("k",), 1.5, Asset("k")):
                for method in KEY_METHODS:
                    with subtests.test(scope=str(scope), key=key, method=method):
                        call = key_call(seeded, method, scope, key)
                        await assert_rejected(seeded, TypeError, *call, says=("str",))

    async def test_empty_or_long_key_is_value_error(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """An empty key, one over 512 characters or over 1,024 bytes raises ValueError."""
        for scope in SCOPES:
            for key in ("", "k" * 513, "é" * 513, "🙂" * 257):
                for method in KEY_METHODS:
                    with subtests.test(scope=str(scope), key=key[:3], method=method):
                        call = key_call(seeded, method, scope, key)
                        await assert_rejected(seeded, ValueError, *call)

    async def test_key_of_512_characters_is_accepted(self, store: BaseStateBackend) -> None:
        """A key of 512 characters within 1,024 UTF-8 bytes is stored and listed."""
        keys = ["k" * 512, "é" * 512, "🙂" * 256]
        for scope in SCOPES:
            for number, key in enumerate(keys):
                await store.aset(scope, key, number)
                assert await store.aget(scope, key) == number
            assert [e.key for e in await store.alist(scope)] == sorted(keys)

    async def test_special_characters_are_plain_keys(self, store: BaseStateBackend) -> None:
        """Wildcards, quotes, slashes and spaces in keys are matched literally."""
        keys = ["a_c", "abc", "%", "a%", "a\\c", "quote'\"", "a/b", " ", "é\u0085"]
        for scope in SCOPES:
            for number, key in enumerate(keys):
                await store.aset(scope, key, number)
            await store.adelete(scope, "a_c")
            await store.adelete(scope, "%")
            assert await store.aget(scope, "abc") == 1
            assert await store.aget(scope, "a%") == 3
            assert [e.key for e in await store.alist(scope)] == sorted(set(keys) - {"a_c", "%"})

    async def test_control_characters_and_lone_surrogates_are_refused(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """A key with NUL, a newline, ESC, DEL or a lone surrogate is a ValueError, same everywhere."""
        for scope in SCOPES:
            for key in ("a\x00b", "new\nline", "\x1b[31m", "del\x7f", "\ud800", "x\udfff"):
                for method in KEY_METHODS:
                    with subtests.test(scope=str(scope), key=repr(key), method=method):
                        call = key_call(seeded, method, scope, key)
                        await assert_rejected(seeded, ValueError, *call, says=("invalid key",))


class TestRetention:
    async def test_timedelta_sets_an_expiry(self, store: BaseStateBackend) -> None:
        """retention=timedelta stores an expiry about that long after the write."""
        await store.aset(TASK, "k", 1, retention=timedelta(hours=6))
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None and entry.expires_at is not None and not entry.never_expire
        assert timedelta(hours=5) < entry.expires_at - entry.updated_at < timedelta(hours=7)

    async def test_never_expire_is_flagged(self, store: BaseStateBackend) -> None:
        """retention=NEVER_EXPIRE stores no expiry and the never-expire flag."""
        await store.aset(TASK, "k", 1, retention=NEVER_EXPIRE)
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None and entry.never_expire and entry.expires_at is None

    async def test_none_defers_to_the_default(self, store: BaseStateBackend) -> None:
        """retention=None stores neither an expiry nor the flag."""
        await store.aset(TASK, "k", 1)
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None and not entry.never_expire and entry.expires_at is None

    async def test_rewrite_replaces_retention(self, store: BaseStateBackend) -> None:
        """Rewriting a key replaces its retention with the new call's."""
        await store.aset(TASK, "k", 1, retention=NEVER_EXPIRE)
        await store.aset(TASK, "k", 2, retention=timedelta(days=1))
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None and entry.expires_at is not None and not entry.never_expire
        await store.aset(TASK, "k", 3)
        entry = await store.aget_entry(TASK, "k")
        assert entry is not None and entry.expires_at is None and not entry.never_expire

    async def test_other_retention_is_type_error(
        self, seeded: BaseStateBackend, subtests: pytest.Subtests
    ) -> None:
        """retention that is not a timedelta, NEVER_EXPIRE or None raises TypeError."""
        for retention in (7, 7.0, True, "7d", "NEVER_EXPIRE", 604800):
            with subtests.test(retention=retention):
                await assert_rejected(
                    seeded, TypeError, seeded.aset, TASK, "a", 5, retention=retention
                )

    async def test_asset_state_has_no_retention(self, seeded: BaseStateBackend) -> None:
        """Asset state takes no retention: passing one raises TypeError and changes nothing."""
        for retention in (timedelta(days=1), NEVER_EXPIRE):
            await assert_rejected(
                seeded, TypeError, seeded.aset, ORDERS_SCOPE, "a", 5, retention=retention
            )


class TestDeleteAndClear:
    async def test_delete_removes_the_key(self, seeded: BaseStateBackend) -> None:
        """delete() removes one key; the others stay."""
        for scope in SCOPES:
            await seeded.adelete(scope, "a")
            assert await seeded.aget(scope, "a", "gone") == "gone"
            assert [e.key for e in await seeded.alist(scope)] == ["b"]

    async def test_delete_of_missing_key_is_a_no_op(self, seeded: BaseStateBackend) -> None:
        """Deleting a key that does not exist raises nothing and changes nothing."""
        before = await snapshot(seeded)
        for scope in SCOPES:
            await seeded.adelete(scope, "missing")
        assert await snapshot(seeded) == before

    async def test_task_clear_is_per_map_index(self, seeded: BaseStateBackend) -> None:
        """clear() on a task instance removes only its own map index's keys."""
        assert await seeded.aclear(TASK_MAP_0) == 2
        assert await seeded.alist(TASK_MAP_0) == []
        for scope in (TASK, TASK_MAP_1, OTHER_RUN, OTHER_TASK, ORDERS_SCOPE):
            assert len(await seeded.alist(scope)) == 2

    async def test_task_clear_all_map_indices(self, seeded: BaseStateBackend) -> None:
        """clear(all_map_indices=True) removes every map index of the task in this run only."""
        assert await seeded.aclear(TASK_MAP_1, all_map_indices=True) == 6
        for cleared in (TASK, TASK_MAP_0, TASK_MAP_1):
            assert await seeded.alist(cleared) == []
        for scope in (OTHER_RUN, OTHER_TASK, ORDERS_SCOPE, INVOICES_SCOPE):
            assert len(await seeded.alist(scope)) == 2

    async def test_asset_clear_removes_every_key_of_the_asset(
        self, seeded: BaseStateBackend
    ) -> None:
        """clear() on an asset removes all its keys and nothing of other assets or tasks."""
        assert await seeded.aclear(ORDERS_SCOPE) == 2
        assert await seeded.alist(ORDERS_SCOPE) == []
        for scope in (TASK, INVOICES_SCOPE, OTHER_TASK):
            assert len(await seeded.alist(scope)) == 2

    async def test_clear_of_empty_scope_returns_zero(self, store: BaseStateBackend) -> None:
        """Clearing a scope without keys deletes nothing and returns 0."""
        for scope in SCOPES:
            assert await store.aclear(scope) == 0
        assert await store.aclear(TASK, all_map_indices=True) == 0
