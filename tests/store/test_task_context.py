"""The context a task receives (DESIGN.md, "Context rules"), built by ``build_task_context``."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from watchkeeper.store import (
    Asset,
    AssetStateStoreAccessors,
    BaseStateBackend,
    MemoryStateBackend,
    SqliteStateBackend,
    TaskScope,
    TaskStateStoreAccessor,
    build_task_context,
)
from watchkeeper.store.protocols import Writer

ORDERS = Asset("orders", uri="s3://data/orders")
INVOICES = Asset("invoices")
IDS: dict[str, Any] = {"dag_id": "dag", "run_id": "run_1", "task_id": "load"}


class AssetAlias:
    """Stands in for a non-concrete inlet (an alias, a lineage object): not an Asset."""

    name = "orders"


@pytest.fixture
async def store(local_backend: BaseStateBackend) -> BaseStateBackend:
    """An open backend (memory, SQLite) with ``orders`` and ``invoices`` registered."""
    await local_backend.events.aregister_assets([ORDERS, INVOICES])
    return local_backend


def context(backend: BaseStateBackend | None = None, **kwargs: Any) -> dict[str, Any]:
    return build_task_context(backend or MemoryStateBackend(), **{**IDS, **kwargs})


class TestTaskStateStore:
    def test_always_present(self) -> None:
        """context["task_state_store"] exists even when the task declares nothing."""
        ctx = context()
        store = ctx["task_state_store"]
        assert isinstance(store, TaskStateStoreAccessor)
        assert store.scope == TaskScope("dag", "run_1", "load", -1)

    def test_task_store_is_an_alias(self) -> None:
        """context["task_store"] is the very same accessor."""
        ctx = context(inlets=[ORDERS])
        assert ctx["task_store"] is ctx["task_state_store"]

    def test_ids_are_in_the_context(self) -> None:
        """The task instance's identifiers and try number are context keys."""
        ctx = context(map_index=3, try_number=2, inlets=[ORDERS], outlets=(INVOICES,))
        assert {k: ctx[k] for k in ("dag_id", "run_id", "task_id", "map_index", "try_number")} == {
            **IDS,
            "map_index": 3,
            "try_number": 2,
        }
        assert ctx["inlets"] == (ORDERS,) and ctx["outlets"] == (INVOICES,)

    async def test_writes_carry_the_task_writer(self, store: BaseStateBackend) -> None:
        """Writes through the context record Writer("task", "<dag>/<run>/<task>[<map>]", try)."""
        ctx = context(store, map_index=2, try_number=3, outlets=[ORDERS])
        await ctx["task_state_store"].aset("k", 1)
        await ctx["asset_state_store"].aset("w", 1)
        expected = Writer("task", "dag/run_1/load[2]", 3)
        task_entry = await store.aget_entry(TaskScope("dag", "run_1", "load", 2), "k")
        asset_entry = await store.aget_entry(ORDERS.scope, "w")
        assert task_entry is not None and task_entry.writer == expected
        assert asset_entry is not None and asset_entry.writer == expected

    async def test_retries_share_state_and_new_runs_start_empty(
        self, store: BaseStateBackend
    ) -> None:
        """A later try of the same run sees what an earlier try wrote; another run sees nothing."""
        first = context(store, try_number=1)
        await anyio.to_thread.run_sync(partial(first["task_store"].set, "job_id", "spark-1"))
        retry = context(store, try_number=2)
        assert await retry["task_store"].aget("job_id") == "spark-1"
        next_run = context(store, run_id="run_2")
        assert await next_run["task_store"].aget("job_id") is None

    def test_building_does_no_io(self, tmp_path: Path) -> None:
        """Building a context touches no database: it works on an unopened backend."""
        path = tmp_path / "never.db"
        ctx = context(SqliteStateBackend(path), inlets=[ORDERS])
        assert isinstance(ctx["asset_store"], AssetStateStoreAccessors)
        assert not path.exists()


class TestAssetStateStorePresence:
    @pytest.mark.parametrize("key", ["asset_state_store", "asset_store"])
    def test_absent_without_assets_explains_why(self, key: str) -> None:
        """Without a declared asset, reading the asset store raises KeyError saying what to declare."""
        ctx = context()
        with pytest.raises(KeyError, match="inlets or outlets") as info:
            ctx[key]
        assert key in str(info.value) and "dag/run_1/load[-1]" in str(info.value)
        assert key not in ctx and ctx.get(key) is None

    def test_other_missing_keys_are_plain_key_errors(self) -> None:
        """A context key that never exists raises an ordinary KeyError naming it."""
        with pytest.raises(KeyError, match="no_such_key"):
            context()["no_such_key"]

    def test_non_concrete_inlets_do_not_count(self) -> None:
        """Inlets and outlets that are not concrete Assets give no asset store."""
        ctx = context(inlets=[AssetAlias()], outlets=[AssetAlias()])
        with pytest.raises(KeyError, match="inlets or outlets"):
            ctx["asset_state_store"]

    @pytest.mark.parametrize(
        ("inlets", "outlets"),
        [([ORDERS], []), ([], [ORDERS]), ([AssetAlias()], [ORDERS]), (ORDERS, ())],
        ids=["inlets", "outlets-only", "alias-and-asset", "single-asset"],
    )
    def test_present_with_one_concrete_asset(self, inlets: Any, outlets: Any) -> None:
        """One concrete asset in inlets or outlets (outlets alone are enough) gives the store."""
        ctx = context(inlets=inlets, outlets=outlets)
        assert ctx["asset_state_store"].assets == (ORDERS,)

    def test_asset_store_is_an_alias(self) -> None:
        """context["asset_store"] is the very same mapping."""
        ctx = context(outlets=[ORDERS])
        assert ctx["asset_store"] is ctx["asset_state_store"]


class TestAssetStateStoreRules:
    def test_asset_in_inlets_and_outlets_counts_once(self) -> None:
        """An asset in both inlets and outlets, by name or by URI, is one asset."""
        ctx = context(
            inlets=[ORDERS], outlets=[Asset("orders"), Asset("x", uri="s3://data/orders")]
        )
        assert len(ctx["asset_state_store"]) == 1

    async def test_shorthand_with_exactly_one_asset(self, store: BaseStateBackend) -> None:
        """With one declared asset, get/set work on context["asset_state_store"] directly."""
        ctx = context(store, inlets=[ORDERS], outlets=[ORDERS])
        await ctx["asset_state_store"].aset("watermark", "2024-06-01")
        assert await store.aget(ORDERS.scope, "watermark") == "2024-06-01"
        read = await anyio.to_thread.run_sync(ctx["asset_store"].get, "watermark")
        assert read == "2024-06-01"

    def test_shorthand_with_several_assets_says_to_subscript(self) -> None:
        """With several declared assets, the shorthand raises ValueError saying to subscript."""
        ctx = context(inlets=[ORDERS], outlets=[INVOICES])
        with pytest.raises(ValueError, match="subscript"):
            ctx["asset_state_store"].get("watermark")

    async def test_subscript_by_asset_or_name(self, store: BaseStateBackend) -> None:
        """Each declared asset is reached by subscripting with the Asset, its name or its URI."""
        ctx = context(store, inlets=[ORDERS, INVOICES])
        assets = ctx["asset_state_store"]
        await assets[ORDERS].aset("w", 1)
        await assets["invoices"].aset("w", 2)
        assert await assets[Asset(uri="s3://data/orders")].aget("w") == 1
        assert await store.aget(INVOICES.scope, "w") == 2

    def test_undeclared_asset_is_a_key_error_naming_it(self) -> None:
        """Subscripting with an asset the task did not declare raises KeyError naming it."""
        assets = context(inlets=[ORDERS])["asset_state_store"]
        with pytest.raises(KeyError, match="'invoices'"):
            assets[INVOICES]
        with pytest.raises(KeyError, match="'customers'"):
            assets["customers"]

    def test_wrong_key_type_is_a_type_error(self) -> None:
        """Subscripting with something that is neither an Asset nor a name raises TypeError."""
        assets = context(inlets=[ORDERS])["asset_state_store"]
        with pytest.raises(TypeError, match="int"):
            assets[1]

    def test_len_iteration_and_assets(self) -> None:
        """The mapping has len(), iterates over the declared assets and lists them in .assets."""
        assets = context(inlets=[ORDERS], outlets=[INVOICES, ORDERS])["asset_state_store"]
        assert len(assets) == 2
        assert list(assets) == [ORDERS, INVOICES] == list(assets.assets)
        assert {a.name: assets[a].asset for a in assets} == {"orders": ORDERS, "invoices": INVOICES}


class TestArguments:
    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [
            ({"try_number": 0}, ValueError, "try_number"),
            ({"try_number": "1"}, TypeError, "try_number"),
            ({"try_number": True}, TypeError, "try_number"),
            ({"dag_id": ""}, ValueError, "dag_id"),
            ({"map_index": "0"}, TypeError, "map_index"),
            ({"inlets": "orders"}, TypeError, "inlets"),
            ({"outlets": b"orders"}, TypeError, "outlets"),
            ({"worker_backend": object()}, TypeError, "worker_backend"),
        ],
        ids=repr,
    )
    def test_bad_arguments_are_named(
        self, kwargs: dict[str, Any], error: type[Exception], message: str
    ) -> None:
        """A bad argument raises an error that names it."""
        with pytest.raises(error, match=message):
            context(**kwargs)

    def test_backend_must_be_a_backend(self) -> None:
        """Passing something that is not a BaseStateBackend is a TypeError."""
        with pytest.raises(TypeError, match="BaseStateBackend"):
            build_task_context(object(), **IDS)  # type: ignore[arg-type]


class DictWorkerBackend(BaseStateBackend):
    """A worker-side backend that keeps values in a dict; the reference is an index."""

    def __init__(self) -> None:
        super().__init__()
        self.blobs: list[Any] = []

    def serialize_task_store_to_ref(self, scope: TaskScope, key: str, value: Any) -> str:
        self.blobs.append(value)
        return f"blob:{len(self.blobs) - 1}"

    def deserialize_task_store_from_ref(self, scope: TaskScope, key: str, ref: str) -> Any:
        return self.blobs[int(ref.removeprefix("blob:"))]

    def serialize_asset_store_to_ref(self, scope: Any, key: str, value: Any) -> str:
        self.blobs.append(value)
        return f"blob:{len(self.blobs) - 1}"

    def deserialize_asset_store_from_ref(self, scope: Any, key: str, ref: str) -> Any:
        return self.blobs[int(ref.removeprefix("blob:"))]


class TestWorkerBackendInContext:
    async def test_both_stores_offload(self, store: BaseStateBackend) -> None:
        """With worker_backend, both context stores keep references and read values back."""
        worker = DictWorkerBackend()
        ctx = context(store, outlets=[ORDERS], worker_backend=worker)
        big = ["y" * 1000] * 100
        await ctx["task_state_store"].aset("big", big)
        await ctx["asset_state_store"].aset("big", {"rows": big})
        assert await store.aget(TaskScope("dag", "run_1", "load"), "big") == "blob:0"
        assert await store.aget(ORDERS.scope, "big") == "blob:1"
        assert await ctx["task_store"].aget("big") == big
        assert await ctx["asset_store"].aget("big") == {"rows": big}
