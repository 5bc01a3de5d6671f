"""The accessors handed to tasks (``context[...]``) and triggers (``self.asset_state_store``).

An accessor binds a backend to one scope and one writer. With a worker-side backend
(``[workers] state_backend``) it also offloads values: the value is validated as usual (except
for the size limit), handed to the worker backend's ``serialize_*_to_ref`` hook, and the
reference string it returns is what the state store keeps; reads pass every stored string
through ``deserialize_*_from_ref``. Values that are not strings were written without offload
(by a watcher, say) and are returned as they are.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Final

import anyio.to_thread

from ._backend import BaseStateBackend
from ._types import Asset, AssetScope, StateEntry, StateScope, TaskScope, Writer
from ._values import JSONValue, check_key, check_retention, encode_value, expiry_of
from .errors import (
    AmbiguousAssetError,
    ArgumentTypeError,
    AssetNotDeclaredError,
    ReferenceTypeError,
    RetentionTypeError,
)

__all__ = [
    "AssetStateStoreAccessor",
    "AssetStateStoreAccessors",
    "TaskStateStoreAccessor",
]

_MISSING: Final = object()


class _Accessor:
    """What both accessors share: reads, deletes, and the worker-side offload."""

    __slots__ = ("_backend", "_worker", "_writer", "scope")

    scope: StateScope

    def __init__(
        self,
        backend: BaseStateBackend,
        scope: StateScope,
        writer: Writer | None,
        worker_backend: BaseStateBackend | None,
    ) -> None:
        self._backend = backend
        self.scope = scope
        self._writer = writer
        self._worker = worker_backend

    # -- offload: subclasses pick the task or asset hooks ------------------------------------

    def _to_ref(self, key: str, value: JSONValue) -> str:
        raise NotImplementedError

    def _from_ref(self, key: str, ref: str) -> JSONValue:
        raise NotImplementedError

    def _checked_ref(self, key: str, value: JSONValue) -> str:
        ref: object = self._to_ref(key, value)
        if not isinstance(ref, str):
            assert self._worker is not None
            raise ReferenceTypeError(self._worker, key, ref)
        return ref

    def _validate_offloaded(self, key: str, value: JSONValue, retention: object) -> None:
        # Everything the store would reject must be rejected before the worker backend
        # writes anything; only the size limit is lifted (the reference is checked instead).
        check_key(key)
        retention = check_retention(retention)
        if isinstance(self.scope, AssetScope) and retention is not None:
            raise RetentionTypeError(retention, "asset state has no retention")
        expiry_of(retention, self._backend.clock())
        encode_value(key, value, max_value_bytes=None)

    def _stored(self, key: str, value: JSONValue, retention: object) -> JSONValue:
        if self._worker is None:
            return value
        self._validate_offloaded(key, value, retention)
        return self._checked_ref(key, value)

    async def _astored(self, key: str, value: JSONValue, retention: object) -> JSONValue:
        if self._worker is None:
            return value
        self._validate_offloaded(key, value, retention)
        # The hooks are sync and may do I/O: keep them off the event loop.
        return await anyio.to_thread.run_sync(self._checked_ref, key, value)

    def _loaded(self, key: str, stored: JSONValue) -> JSONValue:
        if self._worker is None or not isinstance(stored, str):
            return stored
        return self._from_ref(key, stored)

    async def _aloaded(self, key: str, stored: JSONValue) -> JSONValue:
        if self._worker is None or not isinstance(stored, str):
            return stored
        return await anyio.to_thread.run_sync(self._from_ref, key, stored)

    def _loaded_entry(self, entry: StateEntry | None) -> StateEntry | None:
        if entry is None or self._worker is None:
            return entry
        return dataclasses.replace(entry, value=self._loaded(entry.key, entry.value))

    async def _aloaded_entry(self, entry: StateEntry | None) -> StateEntry | None:
        if entry is None or self._worker is None:
            return entry
        return dataclasses.replace(entry, value=await self._aloaded(entry.key, entry.value))

    # -- the shared API ------------------------------------------------------------------------

    def get(self, key: str, default: JSONValue = None) -> JSONValue:
        """The stored value of ``key``, or ``default``."""
        stored = self._backend.get(self.scope, key, _MISSING)
        return default if stored is _MISSING else self._loaded(key, stored)

    def get_entry(self, key: str) -> StateEntry | None:
        """The value of ``key`` with its version, update time and writer, or ``None``."""
        return self._loaded_entry(self._backend.get_entry(self.scope, key))

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""
        self._backend.delete(self.scope, key, writer=self._writer)

    async def aget(self, key: str, default: JSONValue = None) -> JSONValue:
        stored = await self._backend.aget(self.scope, key, _MISSING)
        return default if stored is _MISSING else await self._aloaded(key, stored)

    async def aget_entry(self, key: str) -> StateEntry | None:
        return await self._aloaded_entry(await self._backend.aget_entry(self.scope, key))

    async def adelete(self, key: str) -> None:
        await self._backend.adelete(self.scope, key, writer=self._writer)


class TaskStateStoreAccessor(_Accessor):
    """Task state of one task instance: ``context["task_state_store"]``."""

    __slots__ = ()

    scope: TaskScope

    def __init__(
        self,
        backend: BaseStateBackend,
        scope: TaskScope,
        *,
        writer: Writer | None = None,
        worker_backend: BaseStateBackend | None = None,
    ) -> None:
        super().__init__(backend, scope, writer, worker_backend)

    def __repr__(self) -> str:
        return f"<TaskStateStoreAccessor {self.scope}>"

    def _to_ref(self, key: str, value: JSONValue) -> str:
        assert self._worker is not None
        return self._worker.serialize_task_store_to_ref(self.scope, key, value)

    def _from_ref(self, key: str, ref: str) -> JSONValue:
        assert self._worker is not None
        return self._worker.deserialize_task_store_from_ref(self.scope, key, ref)

    def set(
        self,
        key: str,
        value: JSONValue,
        *,
        retention: timedelta | object | None = None,
        expected_version: int | None = None,
    ) -> int:
        """Upsert ``key``; ``retention`` is a timedelta, ``NEVER_EXPIRE`` or ``None``."""
        return self._backend.set(
            self.scope,
            key,
            self._stored(key, value, retention),
            retention=retention,
            expected_version=expected_version,
            writer=self._writer,
        )

    def clear(self, all_map_indices: bool = False) -> int:
        """Delete this map index's keys, or every map index's with ``all_map_indices``."""
        return self._backend.clear(self.scope, all_map_indices=all_map_indices, writer=self._writer)

    async def aset(
        self,
        key: str,
        value: JSONValue,
        *,
        retention: timedelta | object | None = None,
        expected_version: int | None = None,
    ) -> int:
        return await self._backend.aset(
            self.scope,
            key,
            await self._astored(key, value, retention),
            retention=retention,
            expected_version=expected_version,
            writer=self._writer,
        )

    async def aclear(self, all_map_indices: bool = False) -> int:
        return await self._backend.aclear(
            self.scope, all_map_indices=all_map_indices, writer=self._writer
        )


class AssetStateStoreAccessor(_Accessor):
    """State of one asset, shared by every task and watcher that declares it."""

    __slots__ = ("asset",)

    scope: AssetScope

    def __init__(
        self,
        backend: BaseStateBackend,
        asset: Asset,
        *,
        writer: Writer | None = None,
        worker_backend: BaseStateBackend | None = None,
    ) -> None:
        super().__init__(backend, AssetScope(name=asset.name), writer, worker_backend)
        self.asset = asset

    def __repr__(self) -> str:
        return f"<AssetStateStoreAccessor asset={self.asset.name!r}>"

    def _to_ref(self, key: str, value: JSONValue) -> str:
        assert self._worker is not None
        return self._worker.serialize_asset_store_to_ref(self.scope, key, value)

    def _from_ref(self, key: str, ref: str) -> JSONValue:
        assert self._worker is not None
        return self._worker.deserialize_asset_store_from_ref(self.scope, key, ref)

    def set(self, key: str, value: JSONValue, *, expected_version: int | None = None) -> int:
        """Upsert ``key``; asset state has no retention, it lives until deleted."""
        return self._backend.set(
            self.scope,
            key,
            self._stored(key, value, None),
            expected_version=expected_version,
            writer=self._writer,
        )

    def clear(self) -> int:
        """Delete every key of the asset."""
        return self._backend.clear(self.scope, writer=self._writer)

    def list(self) -> list[StateEntry]:
        """Every entry of the asset, ordered by key."""
        entries = self._backend.list(self.scope)
        return [e for e in map(self._loaded_entry, entries) if e is not None]

    async def aset(self, key: str, value: JSONValue, *, expected_version: int | None = None) -> int:
        return await self._backend.aset(
            self.scope,
            key,
            await self._astored(key, value, None),
            expected_version=expected_version,
            writer=self._writer,
        )

    async def aclear(self) -> int:
        return await self._backend.aclear(self.scope, writer=self._writer)

    async def alist(self) -> builtins.list[StateEntry]:
        entries = await self._backend.alist(self.scope)
        loaded = [await self._aloaded_entry(entry) for entry in entries]
        return [e for e in loaded if e is not None]


class AssetStateStoreAccessors(Mapping[Asset | str, AssetStateStoreAccessor]):
    """The asset state a task or trigger may reach: one accessor per declared asset.

    Subscript with an :class:`Asset` (matched by name, or by URI when both have one) or with
    the asset's name. With exactly one asset, ``get``/``set``/``delete``/``clear``/``list`` (and
    their ``a`` twins) may be called on the mapping itself; with several that raises
    ``ValueError``.
    """

    __slots__ = ("_accessors",)

    def __init__(
        self,
        backend: BaseStateBackend,
        assets: Sequence[Asset],
        *,
        writer: Writer | None = None,
        worker_backend: BaseStateBackend | None = None,
    ) -> None:
        unique: list[Asset] = []
        for asset in assets:
            if not isinstance(asset, Asset):
                raise ArgumentTypeError("assets", asset, "Asset objects")
            if not any(asset.matches(seen) for seen in unique):
                unique.append(asset)
        self._accessors = tuple(
            AssetStateStoreAccessor(backend, asset, writer=writer, worker_backend=worker_backend)
            for asset in unique
        )

    @property
    def assets(self) -> tuple[Asset, ...]:
        return tuple(accessor.asset for accessor in self._accessors)

    def __repr__(self) -> str:
        names = ", ".join(repr(a.name) for a in self.assets)
        return f"<AssetStateStoreAccessors [{names}]>"

    def __getitem__(self, item: Asset | str) -> AssetStateStoreAccessor:
        if isinstance(item, Asset):
            for accessor in self._accessors:
                if accessor.asset.matches(item):
                    return accessor
            name = item.name
        elif isinstance(item, str):
            for accessor in self._accessors:
                if accessor.asset.name == item:
                    return accessor
            name = item
        else:
            raise ArgumentTypeError("an asset state subscript", item, "an Asset or an asset name")
        raise AssetNotDeclaredError(name, tuple(a.name for a in self.assets))

    def __iter__(self) -> Iterator[Asset]:
        return iter(self.assets)

    def __len__(self) -> int:
        return len(self._accessors)

    def __contains__(self, item: object) -> bool:
        try:
            self[item]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True

    def _only(self, method: str) -> AssetStateStoreAccessor:
        if len(self._accessors) == 1:
            return self._accessors[0]
        raise AmbiguousAssetError(method, tuple(a.name for a in self.assets))

    def get(self, key: str, default: JSONValue = None) -> JSONValue:  # type: ignore[override]
        return self._only("get").get(key, default)

    def get_entry(self, key: str) -> StateEntry | None:
        return self._only("get_entry").get_entry(key)

    def set(self, key: str, value: JSONValue, *, expected_version: int | None = None) -> int:
        return self._only("set").set(key, value, expected_version=expected_version)

    def delete(self, key: str) -> None:
        self._only("delete").delete(key)

    def clear(self) -> int:
        return self._only("clear").clear()

    def list(self) -> list[StateEntry]:
        return self._only("list").list()

    async def aget(self, key: str, default: JSONValue = None) -> JSONValue:
        return await self._only("aget").aget(key, default)

    async def aget_entry(self, key: str) -> StateEntry | None:
        return await self._only("aget_entry").aget_entry(key)

    async def aset(self, key: str, value: JSONValue, *, expected_version: int | None = None) -> int:
        return await self._only("aset").aset(key, value, expected_version=expected_version)

    async def adelete(self, key: str) -> None:
        await self._only("adelete").adelete(key)

    async def aclear(self) -> int:
        return await self._only("aclear").aclear()

    async def alist(self) -> builtins.list[StateEntry]:
        return await self._only("alist").alist()
