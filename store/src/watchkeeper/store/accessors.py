"""The accessors handed to tasks (``context[...]``) and triggers (``self.asset_state_store``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta

from ._backend import BaseStateBackend
from ._types import Asset, AssetScope, StateEntry, TaskScope, Writer
from ._values import JSONValue

__all__ = [
    "AssetStateStoreAccessor",
    "AssetStateStoreAccessors",
    "TaskStateStoreAccessor",
]


class TaskStateStoreAccessor:
    """Task state of one task instance: ``context["task_state_store"]``."""

    __slots__ = ("_backend", "_writer", "scope")

    def __init__(
        self, backend: BaseStateBackend, scope: TaskScope, *, writer: Writer | None = None
    ) -> None:
        self._backend = backend
        self.scope = scope
        self._writer = writer

    def __repr__(self) -> str:
        return f"<TaskStateStoreAccessor {self.scope}>"

    def get(self, key: str, default: JSONValue = None) -> JSONValue:
        """The stored value of ``key``, or ``default``."""
        return self._backend.get(self.scope, key, default)

    def get_entry(self, key: str) -> StateEntry | None:
        return self._backend.get_entry(self.scope, key)

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
            value,
            retention=retention,
            expected_version=expected_version,
            writer=self._writer,
        )

    def delete(self, key: str) -> None:
        self._backend.delete(self.scope, key)

    def clear(self, all_map_indices: bool = False) -> int:
        """Delete this map index's keys, or every map index's with ``all_map_indices``."""
        return self._backend.clear(self.scope, all_map_indices=all_map_indices)

    async def aget(self, key: str, default: JSONValue = None) -> JSONValue:
        return await self._backend.aget(self.scope, key, default)

    async def aget_entry(self, key: str) -> StateEntry | None:
        return await self._backend.aget_entry(self.scope, key)

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
            value,
            retention=retention,
            expected_version=expected_version,
            writer=self._writer,
        )

    async def adelete(self, key: str) -> None:
        await self._backend.adelete(self.scope, key)

    async def aclear(self, all_map_indices: bool = False) -> int:
        return await self._backend.aclear(self.scope, all_map_indices=all_map_indices)


class AssetStateStoreAccessor:
    """State of one asset, shared by every task and watcher that declares it."""

    __slots__ = ("_backend", "_writer", "asset", "scope")

    def __init__(
        self, backend: BaseStateBackend, asset: Asset, *, writer: Writer | None = None
    ) -> None:
        self._backend = backend
        self.asset = asset
        self.scope = AssetScope(name=asset.name)
        self._writer = writer

    def __repr__(self) -> str:
        return f"<AssetStateStoreAccessor asset={self.asset.name!r}>"

    def get(self, key: str, default: JSONValue = None) -> JSONValue:
        """The stored value of ``key``, or ``default``."""
        return self._backend.get(self.scope, key, default)

    def get_entry(self, key: str) -> StateEntry | None:
        return self._backend.get_entry(self.scope, key)

    def set(self, key: str, value: JSONValue, *, expected_version: int | None = None) -> int:
        """Upsert ``key``; asset state has no retention, it lives until deleted."""
        return self._backend.set(
            self.scope, key, value, expected_version=expected_version, writer=self._writer
        )

    def delete(self, key: str) -> None:
        self._backend.delete(self.scope, key)

    def clear(self) -> int:
        """Delete every key of the asset."""
        return self._backend.clear(self.scope)

    def list(self) -> list[StateEntry]:
        return self._backend.list(self.scope)

    async def aget(self, key: str, default: JSONValue = None) -> JSONValue:
        return await self._backend.aget(self.scope, key, default)

    async def aget_entry(self, key: str) -> StateEntry | None:
        return await self._backend.aget_entry(self.scope, key)

    async def aset(self, key: str, value: JSONValue, *, expected_version: int | None = None) -> int:
        return await self._backend.aset(
            self.scope, key, value, expected_version=expected_version, writer=self._writer
        )

    async def adelete(self, key: str) -> None:
        await self._backend.adelete(self.scope, key)

    async def aclear(self) -> int:
        return await self._backend.aclear(self.scope)

    async def alist(self) -> list[StateEntry]:
        return await self._backend.alist(self.scope)


class AssetStateStoreAccessors(Mapping[Asset | str, AssetStateStoreAccessor]):
    """The asset state a task or trigger may reach: one accessor per declared asset.

    Subscript with an :class:`Asset` (matched by name, or by URI when both have one) or with
    the asset's name. With exactly one asset, ``get``/``set``/``delete``/``clear`` (and their
    ``a`` twins) may be called on the mapping itself; with several that raises ``ValueError``.
    """

    __slots__ = ("_accessors",)

    def __init__(
        self,
        backend: BaseStateBackend,
        assets: Sequence[Asset],
        *,
        writer: Writer | None = None,
    ) -> None:
        unique: list[Asset] = []
        for asset in assets:
            if not isinstance(asset, Asset):
                raise TypeError(f"expected an Asset, got {type(asset).__name__}")
            if not any(asset.matches(seen) for seen in unique):
                unique.append(asset)
        self._accessors = tuple(
            AssetStateStoreAccessor(backend, asset, writer=writer) for asset in unique
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
            raise TypeError(
                f"asset state is subscripted with an Asset or an asset name, "
                f"got {type(item).__name__}"
            )
        declared = ", ".join(repr(a.name) for a in self.assets) or "none"
        raise KeyError(f"asset {name!r} is not declared here (declared: {declared})")

    def __iter__(self) -> Iterator[Asset]:  # type: ignore[override]
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
        names = ", ".join(repr(a.name) for a in self.assets)
        raise ValueError(
            f"{method}() on the asset state store needs exactly one asset, but {len(self)} are "
            f"declared ({names}); subscript it first: store[asset].{method}(...)"
        )

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
