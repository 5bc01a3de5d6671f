"""Bad input at every edge of the store, refused the same way by every backend.

Names (asset names and URIs, dedup keys, watcher names, the ids of a task scope), numbers
(map index, asset id, expected version, retention, event ids) and values (lone surrogates,
ints too long for text, nesting) each get the store's documented error, the same type and
message on memory, SQLite and PostgreSQL, and the store is unchanged afterwards. The limits
themselves are accepted: the largest valid input round-trips on every backend.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from watchkeeper.store import (
    MAX_BIGINT,
    MAX_MAP_INDEX,
    MAX_NAME_BYTES,
    MAX_SCOPE_ID_BYTES,
    MAX_VALUE_DEPTH,
    ArgumentTypeError,
    Asset,
    AssetScope,
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
    KeyTypeError,
    TaskScope,
    VersionConflictError,
)
from watchkeeper.store.protocols import BaseStateBackend, EventCommit, encode_json

from tests.store._contract import ORDERS_SCOPE, SCOPES, TASK, assert_rejected, snapshot

# Names that break the rule, with what the message says about each.
BAD_NAMES: dict[str, tuple[str, str]] = {
    "empty": ("", "must not be empty"),
    "NUL": ("a\x00b", "control character '\\x00'"),
    "newline": ("a\nb", "control character '\\n'"),
    "ESC": ("\x1b[31mred", "control character '\\x1b'"),
    "DEL": ("a\x7f", "control character '\\x7f'"),
    "lone surrogate": ("x\ud800", "not valid UTF-8"),
    "too long": ("🙂" * 257, "1028 bytes in UTF-8, over the limit of"),
}


def incompressible(n_bytes: int, seed: int) -> str:
    """``n_bytes`` of UTF-8 in random 4-byte characters: nothing for PostgreSQL to compress."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x20000, 0x2A6DF)) for _ in range(n_bytes // 4))


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep around a 1."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


class TestNames:
    @pytest.mark.parametrize("case", list(BAD_NAMES), ids=list(BAD_NAMES))
    def test_a_bad_name_is_refused_where_the_store_takes_it(self, case: str) -> None:
        """Asset, AssetScope, EventCommit (watcher, assets, dedup key) and TaskScope refuse a
        name breaking the rule with InvalidNameError (a ValueError) naming the field."""
        name, says = BAD_NAMES[case]
        makers: list[tuple[str, Callable[[], object]]] = [
            ("asset URI", lambda: Asset("a", uri=name)),
            ("asset name", lambda: AssetScope(name=name)),
            ("watcher name", lambda: EventCommit(name, ("orders",), "1")),
            ("asset name", lambda: EventCommit("w", ("orders", name), "1")),
            ("dedup key", lambda: EventCommit("w", ("orders",), "1", dedup_key=name)),
            ("key", lambda: EventCommit("w", ("orders",), "1", state={name: "1"})),
            ("run_id", lambda: TaskScope("dag", name, "task")),
        ]
        if name:  # Asset("") takes its URI as its name: see the next test
            makers.append(("asset name", lambda: Asset(name)))
        for what, make in makers:
            with pytest.raises(InvalidNameError) as caught:
                make()
            assert isinstance(caught.value, ValueError)
            message = str(caught.value)
            assert message.startswith(f"invalid {what} "), message
            assert says in message and message.isprintable(), message

    def test_a_name_that_is_not_a_str_is_a_type_error(self) -> None:
        """A non-str name is KeyTypeError (a TypeError) naming the field."""
        for make in (
            lambda: Asset(5),  # type: ignore[arg-type]
            lambda: AssetScope(name=b"orders"),  # type: ignore[arg-type]
            lambda: EventCommit("w", ("orders",), "1", dedup_key=7),  # type: ignore[arg-type]
            lambda: TaskScope("dag", "run", None),  # type: ignore[arg-type]
        ):
            with pytest.raises(KeyTypeError, match="must be a str"):
                make()
        with pytest.raises(InvalidArgumentError, match="needs a name or a uri"):
            Asset("")

    async def test_names_at_the_limits_round_trip(self, store: BaseStateBackend) -> None:
        """Names of exactly 1,024 UTF-8 bytes, and non-ASCII ones (C1 NEL, emoji), register,
        commit and deduplicate on every backend."""
        long_name = incompressible(MAX_NAME_BYTES, seed=1)
        long_uri = incompressible(MAX_NAME_BYTES, seed=3)
        assets = [Asset(long_name), Asset("é\u0085", uri="s3://é\u0085"), Asset("🙂", uri=long_uri)]
        names = [asset.name for asset in assets]
        await store.events.aregister_assets(assets)
        listed = {info.name: info.uri for info in await store.events.alist_assets()}
        assert [listed[n] for n in names] == [None, "s3://é\u0085", long_uri]
        dedup = incompressible(MAX_NAME_BYTES, seed=2)
        first = await store.events.acommit(
            EventCommit(long_name, tuple(names), "1", dedup_key=dedup, state={"é\u0085": "1"})
        )
        again = await store.events.acommit(EventCommit(long_name, tuple(names), "2", dedup))
        assert sorted(e.asset for e in first) == sorted(names) and again == []
        events = await store.events.alist_events(asset=long_name)
        assert [(e.watcher, e.dedup_key) for e in events] == [(long_name, dedup)]
        assert await store.aget(AssetScope(name=long_name), "é\u0085") == 1

    async def test_the_largest_task_scope_fits_every_index(self, store: BaseStateBackend) -> None:
        """dag_id, run_id and task_id of MAX_SCOPE_ID_BYTES each (incompressible) with a key of
        1,024 bytes are stored, read and listed on every backend: the primary key stays under
        PostgreSQL's btree row limit."""
        dag_id, run_id, task_id = (incompressible(MAX_SCOPE_ID_BYTES, seed=n) for n in range(3))
        scope = TaskScope(dag_id, run_id, task_id, MAX_MAP_INDEX)
        key = incompressible(MAX_NAME_BYTES, seed=9)
        assert await store.aset(scope, key, "v") == 1
        assert await store.aget(scope, key) == "v"
        assert [e.key for e in await store.alist(scope)] == [key]
        await store.adelete(scope, key)
        assert await store.alist(scope) == []

    def test_a_scope_id_over_its_byte_limit_is_refused(self) -> None:
        """Each task scope id is limited to MAX_SCOPE_ID_BYTES, not the general 1,024."""
        TaskScope("d" * MAX_SCOPE_ID_BYTES, "r", "t")
        for args in (("d" * 513, "r", "t"), ("d", "r" * 513, "t"), ("d", "r", "é" * 257)):
            with pytest.raises(InvalidNameError, match="over the limit of 512"):
                TaskScope(*args)

    async def test_deactivate_and_event_filter_refuse_bad_names(
        self, seeded: BaseStateBackend
    ) -> None:
        """adeactivate_asset() and alist_events(asset=...) refuse a bad name the same way on
        every backend, and change nothing."""
        for name, _ in BAD_NAMES.values():
            await assert_rejected(seeded, InvalidNameError, seeded.events.adeactivate_asset, name)
            await assert_rejected(seeded, InvalidNameError, seeded.events.alist_events, asset=name)
        assert [info.name for info in await seeded.events.alist_assets(active_only=True)] == [
            "invoices",
            "orders",
        ]


class TestNumbers:
    def test_map_index_and_asset_id_are_bounded_by_the_database_integers(self) -> None:
        """A map index outside -1..2**31-1 or an asset id outside 1..2**63-1 is
        InvalidArgumentError (a ValueError); one that is not an int, ArgumentTypeError."""
        for map_index in (MAX_MAP_INDEX + 1, 10**20, -2):
            with pytest.raises(InvalidArgumentError, match="invalid map_index"):
                TaskScope("d", "r", "t", map_index)
        for asset_id in (MAX_BIGINT + 1, 0):
            with pytest.raises(InvalidArgumentError, match="invalid asset_id"):
                AssetScope(asset_id=asset_id)
        for bad in (True, 1.0, "1"):
            with pytest.raises(ArgumentTypeError, match="map_index must be an int"):
                TaskScope("d", "r", "t", bad)  # type: ignore[arg-type]
            with pytest.raises(ArgumentTypeError, match="asset_id must be an int"):
                AssetScope(asset_id=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="needs at least one of"):
            AssetScope()

    async def test_the_largest_ids_are_valid_everywhere(self, store: BaseStateBackend) -> None:
        """The largest map index, asset id, expected version and event id are valid input on
        every backend: no overflow inside a driver."""
        scope = TaskScope("d", "r", "t", MAX_MAP_INDEX)
        await store.aset(scope, "k", 1)
        assert await store.aget(scope, "k") == 1
        await assert_rejected(
            store,
            VersionConflictError,
            store.aset,
            scope,
            "k",
            2,
            expected_version=MAX_BIGINT,
            says=(f"expected {MAX_BIGINT}",),
        )
        assert await store.events.alist_events(since_id=MAX_BIGINT, limit=MAX_BIGINT) == []
        with pytest.raises(KeyError):
            await store.aget(AssetScope(asset_id=MAX_BIGINT), "k")

    async def test_out_of_range_numbers_are_refused_alike(self, seeded: BaseStateBackend) -> None:
        """An expected version, event id or limit beyond 2**63-1 and a retention whose expiry
        falls after year 9999 are InvalidArgumentError on every backend, changing nothing."""
        calls: list[tuple[Callable[..., Awaitable[object]], tuple[Any, ...], dict[str, Any]]] = [
            (seeded.aset, (TASK, "a", 1), {"expected_version": MAX_BIGINT + 1}),
            (seeded.aset, (TASK, "a", 1), {"expected_version": -1}),
            (seeded.aset, (TASK, "a", 1), {"retention": timedelta(days=999_999_999)}),
            (seeded.events.alist_events, (), {"since_id": MAX_BIGINT + 1}),
            (seeded.events.alist_events, (), {"limit": 10**20}),
        ]
        for method, args, kwargs in calls:
            error = await assert_rejected(seeded, InvalidArgumentError, method, *args, **kwargs)
            assert str(error).startswith("invalid ") and str(error).isprintable()
        message = str(
            await assert_rejected(
                seeded,
                InvalidArgumentError,
                seeded.aset,
                TASK,
                "a",
                1,
                retention=timedelta(days=999_999_999),
            )
        )
        assert "after the year 9999" in message


class TestValues:
    async def test_deep_nesting_is_refused_at_the_limit(self, seeded: BaseStateBackend) -> None:
        """A value nested MAX_VALUE_DEPTH levels round-trips; one level more, or 100,000 (which
        overflows Python's recursion), is InvalidValueError naming the limit, on every backend."""
        for scope in SCOPES:
            await seeded.aset(scope, "deep", nested(MAX_VALUE_DEPTH))
            assert await seeded.aget(scope, "deep") == nested(MAX_VALUE_DEPTH)
            for depth in (MAX_VALUE_DEPTH + 1, 100_000):
                await assert_rejected(
                    seeded,
                    InvalidValueError,
                    seeded.aset,
                    scope,
                    "deep",
                    nested(depth),
                    says=(f"nested more than {MAX_VALUE_DEPTH} levels deep",),
                )
        deep_dict: Any = 1
        for _ in range(MAX_VALUE_DEPTH + 1):
            deep_dict = {"k": deep_dict}
        await assert_rejected(seeded, InvalidValueError, seeded.aset, TASK, "d", deep_dict)
        with pytest.raises(InvalidValueError, match="nested more than"):
            encode_json(nested(100_000), what="payload")

    async def test_lone_surrogates_are_refused_alike(self, seeded: BaseStateBackend) -> None:
        """A lone surrogate in a string value, inside a container or in a dict key is
        InvalidValueError on every backend (SQLite raised UnicodeEncodeError, PostgreSQL a
        driver error, memory stored it), and nothing is written."""
        for scope in SCOPES:
            for value in ("a\ud800", ["ok", {"k": "\udfff"}], {"\ud83d": 1}):
                error = await assert_rejected(
                    seeded, InvalidValueError, seeded.aset, scope, "a", value, says=("surrogate",)
                )
                assert str(error).isprintable()
        with pytest.raises(InvalidValueError, match="surrogate"):
            encode_json({"text": "\ud800"}, what="payload")

    async def test_ints_too_long_for_text_are_refused(self, seeded: BaseStateBackend) -> None:
        """10**5000 (past Python's int-to-text limit) is InvalidValueError, not a bare
        ValueError, at the top or nested; the longest int that converts round-trips."""
        longest = 10**4299
        for scope in SCOPES:
            for value in (10**5000, [1, {"n": -(10**5000)}]):
                await assert_rejected(
                    seeded, InvalidValueError, seeded.aset, scope, "a", value, says=("bits",)
                )
            await seeded.aset(scope, "long", [longest])
            assert await seeded.aget(scope, "long") == [longest]
        with pytest.raises(InvalidValueError, match="bits"):
            encode_json(10**5000, what="payload")

    async def test_a_bad_event_writes_nothing(self, seeded: BaseStateBackend) -> None:
        """An event whose dedup key or state key breaks the rule is refused before any I/O:
        the event log and the state are as before on every backend."""
        before = await snapshot(seeded)
        for name, _ in BAD_NAMES.values():
            with pytest.raises(InvalidNameError):
                await seeded.events.acommit(
                    EventCommit("w", ("orders",), "1", dedup_key=name, state={"a": "1"})
                )
        assert await snapshot(seeded) == before
        assert await seeded.aget(ORDERS_SCOPE, "a") == {"n": 1}
