"""The accessors tasks and triggers hold, and worker-side offload of values.

Runs against the memory and SQLite backends (sync accessor calls go through the bridge with
SQLite). The worker-side backend is a small file store written here: values live in files under
``tmp_path`` and the state store keeps the file's name.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import pytest
from watchkeeper.store import (
    NEVER_EXPIRE,
    Asset,
    AssetScope,
    AssetStateStoreAccessor,
    AssetStateStoreAccessors,
    BaseStateBackend,
    MemoryStateBackend,
    TaskScope,
    TaskStateStoreAccessor,
    ValueTooLargeError,
)
from watchkeeper.store.protocols import Writer

T = TypeVar("T")

TASK = TaskScope("dag", "run_1", "task")
ORDERS = Asset("orders", uri="s3://data/orders")
INVOICES = Asset("invoices")
TASK_WRITER = Writer("task", str(TASK), 1)
BIG = {"rows": ["x" * 1000] * 100}  # about 100 KB encoded: over the 64 KiB limit


@pytest.fixture
async def store(local_backend: BaseStateBackend) -> BaseStateBackend:
    """An open backend (memory, SQLite) with ``orders`` and ``invoices`` registered."""
    await local_backend.events.aregister_assets([ORDERS, INVOICES])
    return local_backend


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a sync accessor call in a worker thread, as task code does."""
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))


class FileWorkerBackend(BaseStateBackend):
    """A worker-side backend keeping each value in a file; the reference is the file's name."""

    def __init__(self, root: Path, *, make_ref: Callable[[str], object] | None = None) -> None:
        super().__init__()
        self.root = root
        self.root.mkdir(exist_ok=True)
        self.threads: list[int] = []
        self.calls: list[tuple[str, object, str]] = []
        self._make_ref = make_ref or (lambda name: f"file:{name}")

    def _write(self, kind: str, scope: object, key: str, value: Any) -> str:
        self.threads.append(threading.get_ident())
        self.calls.append((f"serialize_{kind}", scope, key))
        name = hashlib.sha256(f"{kind}|{scope}|{key}".encode()).hexdigest()[:16] + ".json"
        (self.root / name).write_text(json.dumps(value))
        return self._make_ref(name)  # type: ignore[return-value]

    def _read(self, kind: str, scope: object, key: str, ref: str) -> Any:
        self.threads.append(threading.get_ident())
        self.calls.append((f"deserialize_{kind}", scope, key))
        return json.loads((self.root / ref.removeprefix("file:")).read_text())

    def serialize_task_store_to_ref(self, scope: TaskScope, key: str, value: Any) -> str:
        return self._write("task", scope, key, value)

    def deserialize_task_store_from_ref(self, scope: TaskScope, key: str, ref: str) -> Any:
        return self._read("task", scope, key, ref)

    def serialize_asset_store_to_ref(self, scope: AssetScope, key: str, value: Any) -> str:
        return self._write("asset", scope, key, value)

    def deserialize_asset_store_from_ref(self, scope: AssetScope, key: str, ref: str) -> Any:
        return self._read("asset", scope, key, ref)

    def files(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir())


@pytest.fixture
def worker(tmp_path: Path) -> FileWorkerBackend:
    return FileWorkerBackend(tmp_path / "blobs")


class TestTaskStateStoreAccessor:
    async def test_reads_and_writes_its_task_instance(self, store: BaseStateBackend) -> None:
        """The accessor reads and writes the state of its own task instance, as its writer."""
        accessor = TaskStateStoreAccessor(store, TASK, writer=TASK_WRITER)
        assert await in_thread(accessor.set, "job_id", "spark-1") == 1
        assert await accessor.aset("page", 3) == 1
        assert await store.aget(TASK, "job_id") == "spark-1"
        assert await in_thread(accessor.get, "page") == 3
        assert await accessor.aget("missing", "d") == "d"
        entry = await accessor.aget_entry("job_id")
        assert entry is not None and entry.writer == TASK_WRITER
        await accessor.adelete("page")
        await in_thread(accessor.delete, "job_id")
        assert await store.alist(TASK) == []

    async def test_retention_and_compare_and_set_pass_through(
        self, store: BaseStateBackend
    ) -> None:
        """retention and expected_version reach the backend; a bad retention is a TypeError."""
        accessor = TaskStateStoreAccessor(store, TASK)
        await accessor.aset("job_id", "x", retention=NEVER_EXPIRE, expected_version=0)
        entry = await in_thread(accessor.get_entry, "job_id")
        assert entry is not None and entry.never_expire
        await in_thread(accessor.set, "ttl", 1, retention=timedelta(hours=1))
        ttl = await accessor.aget_entry("ttl")
        assert ttl is not None and ttl.expires_at is not None
        with pytest.raises(TypeError, match="timedelta"):
            await accessor.aset("job_id", "y", retention=7)
        assert await accessor.aget("job_id") == "x"

    async def test_clear_per_map_index_or_all(self, store: BaseStateBackend) -> None:
        """clear() empties this map index; clear(all_map_indices=True) every one of the task."""
        mapped = [
            TaskStateStoreAccessor(store, TaskScope("dag", "run_1", "m", i)) for i in range(3)
        ]
        for accessor in mapped:
            await accessor.aset("k", 1)
            await accessor.aset("j", 2)
        assert await mapped[0].aclear() == 2
        assert await mapped[1].aget("k") == 1
        assert await in_thread(mapped[1].clear, True) == 4
        assert [await a.aget("k") for a in mapped] == [None, None, None]

    def test_repr_names_the_task_instance(self) -> None:
        """repr() shows the task instance the accessor is bound to."""
        accessor = TaskStateStoreAccessor(MemoryStateBackend(), TaskScope("d", "r", "t", 4))
        assert repr(accessor) == "<TaskStateStoreAccessor d/r/t[4]>"


class TestAssetStateStoreAccessor:
    async def test_reads_and_writes_its_asset(self, store: BaseStateBackend) -> None:
        """The accessor reads, writes, lists and clears the state of one asset."""
        writer = Writer("watcher", "orders_watch")
        accessor = AssetStateStoreAccessor(store, ORDERS, writer=writer)
        await accessor.aset("watermark", "2024-06-01")
        await in_thread(accessor.set, "cursor", 7)
        assert await store.aget(ORDERS.scope, "watermark") == "2024-06-01"
        assert [e.key for e in await accessor.alist()] == ["cursor", "watermark"]
        assert [e.writer for e in await in_thread(accessor.list)] == [writer, writer]
        assert await in_thread(accessor.get, "cursor") == 7
        await accessor.adelete("cursor")
        assert await in_thread(accessor.clear) == 1
        assert await accessor.aclear() == 0
        assert await store.alist(INVOICES.scope) == []

    async def test_compare_and_set(self, store: BaseStateBackend) -> None:
        """expected_version makes an asset write conditional."""
        accessor = AssetStateStoreAccessor(store, ORDERS)
        assert await accessor.aset("w", 1, expected_version=0) == 1
        assert await in_thread(accessor.set, "w", 2, expected_version=1) == 2
        assert (await accessor.aget_entry("w") or pytest.fail()).version == 2


class TestAssetStateStoreAccessors:
    def _mapping(self, *assets: Asset) -> AssetStateStoreAccessors:
        return AssetStateStoreAccessors(MemoryStateBackend(), list(assets))

    def test_subscript_by_asset_or_name(self) -> None:
        """An Asset matches by name or, when both have one, by URI; a str matches the name."""
        mapping = self._mapping(ORDERS, INVOICES)
        orders = mapping[ORDERS]
        assert orders.asset == ORDERS
        assert mapping["orders"] is orders
        assert mapping[Asset("orders")] is orders
        assert mapping[Asset("renamed", uri="s3://data/orders")] is orders
        assert mapping[Asset(uri="s3://data/orders")] is orders
        assert mapping["invoices"].asset == INVOICES

    @pytest.mark.parametrize(
        "item", [Asset("missing"), "missing", Asset("x", uri="s3://other")], ids=repr
    )
    def test_undeclared_asset_is_a_key_error_naming_it(self, item: Asset | str) -> None:
        """An undeclared asset raises KeyError naming it and the declared ones."""
        with pytest.raises(KeyError) as info:
            self._mapping(ORDERS, INVOICES)[item]
        name = item if isinstance(item, str) else item.name
        assert name in str(info.value) and "'orders', 'invoices'" in str(info.value)

    @pytest.mark.parametrize("item", [1, None, ORDERS.scope, b"orders", ("orders",)], ids=repr)
    def test_wrong_key_type_is_a_type_error(self, item: object) -> None:
        """Subscripting with anything but an Asset or a str raises TypeError."""
        mapping = self._mapping(ORDERS)
        with pytest.raises(TypeError, match="Asset or an asset name"):
            mapping[item]  # type: ignore[index]
        assert item not in mapping

    def test_len_iter_assets_and_contains(self) -> None:
        """The mapping has len(), iterates over the assets, and knows what it contains."""
        mapping = self._mapping(ORDERS, INVOICES)
        assert len(mapping) == 2
        assert list(mapping) == [ORDERS, INVOICES] == list(mapping.assets)
        assert [mapping[a].asset for a in mapping] == [ORDERS, INVOICES]
        assert ORDERS in mapping and "invoices" in mapping and "missing" not in mapping
        assert repr(mapping) == "<AssetStateStoreAccessors ['orders', 'invoices']>"

    def test_duplicates_count_once(self) -> None:
        """An asset given twice, by name or by URI, is one asset."""
        mapping = self._mapping(ORDERS, Asset("orders"), Asset("alias", uri="s3://data/orders"))
        assert mapping.assets == (ORDERS,)

    def test_non_asset_is_rejected(self) -> None:
        """Only Asset objects can be bound; anything else is a TypeError naming its type."""
        with pytest.raises(TypeError, match="str"):
            AssetStateStoreAccessors(MemoryStateBackend(), ["orders"])  # type: ignore[list-item]

    async def test_shorthand_with_one_asset(self, store: BaseStateBackend) -> None:
        """With one asset, every method works on the mapping itself, sync and async."""
        mapping = AssetStateStoreAccessors(store, [ORDERS])
        await mapping.aset("a", 1)
        await in_thread(mapping.set, "b", 2, expected_version=0)
        assert await mapping.aget("a") == 1 and await in_thread(mapping.get, "b") == 2
        assert (await mapping.aget_entry("a") or pytest.fail()).version == 1
        assert (await in_thread(mapping.get_entry, "b") or pytest.fail()).version == 1
        assert [e.key for e in await mapping.alist()] == ["a", "b"]
        assert [e.key for e in await in_thread(mapping.list)] == ["a", "b"]
        await mapping.adelete("a")
        await in_thread(mapping.delete, "b")
        await mapping.aset("c", 3)
        assert await mapping.aclear() == 1
        await mapping.aset("d", 4)
        assert await in_thread(mapping.clear) == 1
        assert await store.alist(ORDERS.scope) == []

    async def test_shorthand_with_several_assets_says_to_subscript(
        self, store: BaseStateBackend
    ) -> None:
        """With several assets, every shorthand method raises ValueError saying to subscript."""
        mapping = AssetStateStoreAccessors(store, [ORDERS, INVOICES])
        sync_calls: list[tuple[str, Callable[[], object]]] = [
            ("get", lambda: mapping.get("k")),
            ("get_entry", lambda: mapping.get_entry("k")),
            ("set", lambda: mapping.set("k", 1)),
            ("delete", lambda: mapping.delete("k")),
            ("clear", mapping.clear),
            ("list", mapping.list),
        ]
        for name, call in sync_calls:
            with pytest.raises(ValueError, match=rf"{name}\(\).*2 are declared.*subscript"):
                call()
        with pytest.raises(ValueError, match="subscript"):
            await mapping.aset("k", 1)
        for name in ("aget", "aget_entry", "adelete"):
            with pytest.raises(ValueError, match=rf"{name}\(\).*subscript"):
                await getattr(mapping, name)("k")
        for name in ("aclear", "alist"):
            with pytest.raises(ValueError, match="subscript"):
                await getattr(mapping, name)()
        assert await store.alist(ORDERS.scope) == await store.alist(INVOICES.scope) == []

    async def test_writes_are_shared_between_holders(self, store: BaseStateBackend) -> None:
        """A watcher's accessors and a task's accessors of the same asset see each other's writes."""
        watcher = AssetStateStoreAccessors(store, [ORDERS], writer=Writer("watcher", "w"))
        task = AssetStateStoreAccessors(store, [INVOICES, ORDERS])
        await watcher.aset("watermark", 10)
        assert await task[Asset(uri="s3://data/orders")].aget("watermark") == 10
        await task["orders"].aset("watermark", 11)
        assert await watcher.aget("watermark") == 11


class TestWorkerOffload:
    async def test_large_task_value_is_offloaded(
        self, store: BaseStateBackend, worker: FileWorkerBackend
    ) -> None:
        """With a worker backend, the store keeps the reference and get() returns the value."""
        accessor = TaskStateStoreAccessor(store, TASK, worker_backend=worker)
        await in_thread(accessor.set, "big", BIG)
        (name,) = worker.files()
        assert await store.aget(TASK, "big") == f"file:{name}"
        assert await in_thread(accessor.get, "big") == BIG
        assert await accessor.aget("big") == BIG
        assert worker.calls == [
            ("serialize_task", TASK, "big"),
            ("deserialize_task", TASK, "big"),
            ("deserialize_task", TASK, "big"),
        ]

    async def test_without_worker_backend_the_limit_applies(self, store: BaseStateBackend) -> None:
        """The same large value without a worker backend is refused as too large."""
        accessor = TaskStateStoreAccessor(store, TASK)
        with pytest.raises(ValueTooLargeError, match="'big'"):
            await accessor.aset("big", BIG)
        assert await store.alist(TASK) == []

    async def test_asset_values_use_the_asset_hooks(
        self, store: BaseStateBackend, worker: FileWorkerBackend
    ) -> None:
        """Asset accessors offload through the asset twins of the hooks."""
        mapping = AssetStateStoreAccessors(store, [ORDERS], worker_backend=worker)
        await mapping.aset("snapshot", BIG)
        assert await in_thread(mapping.get, "snapshot") == BIG
        assert [c[0] for c in worker.calls] == ["serialize_asset", "deserialize_asset"]
        assert worker.calls[0][1] == AssetScope(name="orders")
        assert (await mapping.aget_entry("snapshot") or pytest.fail()).value == BIG
        assert [e.value for e in await mapping.alist()] == [BIG]
        assert [e.value for e in await in_thread(mapping.list)] == [BIG]

    async def test_async_calls_run_the_hooks_off_the_loop(
        self, store: BaseStateBackend, worker: FileWorkerBackend
    ) -> None:
        """aset()/aget() call the sync hooks in a worker thread, never on the event loop."""
        accessor = TaskStateStoreAccessor(store, TASK, worker_backend=worker)
        await accessor.aset("big", BIG)
        assert await accessor.aget("big") == BIG
        assert (await accessor.aget_entry("big") or pytest.fail()).value == BIG
        assert len(worker.threads) == 3 and threading.get_ident() not in worker.threads

    @pytest.mark.parametrize(
        ("key", "value", "retention", "error"),
        [
            ("k", None, None, ValueError),
            ("k", [math.nan], None, ValueError),
            ("k", {"at": datetime(2024, 1, 1, tzinfo=UTC)}, None, TypeError),
            ("", BIG, None, ValueError),
            (5, BIG, None, TypeError),
            ("k", BIG, 7, TypeError),
        ],
        ids=["none", "nan", "datetime", "empty-key", "key-type", "retention"],
    )
    async def test_invalid_input_is_refused_before_offloading(
        self,
        store: BaseStateBackend,
        worker: FileWorkerBackend,
        key: Any,
        value: Any,
        retention: Any,
        error: type[Exception],
    ) -> None:
        """Bad keys, values and retentions are refused before the worker backend writes a file."""
        accessor = TaskStateStoreAccessor(store, TASK, worker_backend=worker)
        with pytest.raises(error):
            await accessor.aset(key, value, retention=retention)
        with pytest.raises(error):
            await in_thread(accessor.set, key, value, retention=retention)
        assert worker.files() == [] and worker.calls == []
        assert await store.alist(TASK) == []

    async def test_non_str_reference_is_a_type_error(
        self, store: BaseStateBackend, tmp_path: Path
    ) -> None:
        """A worker backend returning something other than a str stores nothing."""
        worker = FileWorkerBackend(tmp_path / "blobs", make_ref=lambda name: {"file": name})
        accessor = TaskStateStoreAccessor(store, TASK, worker_backend=worker)
        with pytest.raises(TypeError, match="FileWorkerBackend returned a dict"):
            await accessor.aset("k", 1)
        with pytest.raises(TypeError, match="must return a str"):
            await in_thread(accessor.set, "k", 1)
        assert await store.alist(TASK) == []

    async def test_reference_over_the_limit_is_refused(
        self, store: BaseStateBackend, tmp_path: Path
    ) -> None:
        """The reference itself must fit in max_value_bytes."""
        worker = FileWorkerBackend(tmp_path / "blobs", make_ref=lambda name: "r" * 70_000)
        accessor = TaskStateStoreAccessor(store, TASK, worker_backend=worker)
        with pytest.raises(ValueTooLargeError, match="70002"):
            await accessor.aset("k", 1)
        assert await store.alist(TASK) == []

    async def test_values_written_without_offload_read_as_they_are(
        self, store: BaseStateBackend, worker: FileWorkerBackend
    ) -> None:
        """A non-string value written without offload is returned as is; a missing key gives the default."""
        await store.aset(ORDERS.scope, "watermark", 42)
        mapping = AssetStateStoreAccessors(store, [ORDERS], worker_backend=worker)
        assert await mapping.aget("watermark") == 42
        assert await in_thread(mapping.get, "missing", "d") == "d"
        assert worker.calls == []

    async def test_default_hooks_say_what_to_implement(self, store: BaseStateBackend) -> None:
        """A worker backend without the hooks raises NotImplementedError naming them."""
        accessor = TaskStateStoreAccessor(store, TASK, worker_backend=MemoryStateBackend())
        with pytest.raises(NotImplementedError, match=r"serialize_task_store_to_ref.*\[workers\]"):
            await accessor.aset("k", 1)
        assert await store.alist(TASK) == []
        mapping = AssetStateStoreAccessors(store, [ORDERS], worker_backend=MemoryStateBackend())
        await store.aset(ORDERS.scope, "w", "ref")
        with pytest.raises(NotImplementedError, match="deserialize_asset_store_from_ref"):
            await in_thread(mapping.get, "w")
