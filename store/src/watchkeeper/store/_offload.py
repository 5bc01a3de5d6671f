"""The worker-side offload hooks: what a backend configured as ``[workers] state_backend`` overrides.

:class:`~watchkeeper.store.BaseStateBackend` inherits these defaults, which raise
:class:`HookNotImplementedError` (a ``NotImplementedError``) naming the backend and the hook (a configuration error, not a
capability check: the metastore capabilities are in :mod:`watchkeeper.store.protocols`).
"""

from __future__ import annotations

from ._types import (
    AssetScope,
    TaskScope,
)
from ._values import JSONValue
from .errors import HookNotImplementedError

__all__ = ["OffloadHooks"]


class OffloadHooks:
    """Defaults for the four offload hooks: each raises until a backend overrides it."""

    # -- worker-side offload hooks ([workers] state_backend) -------------------------------------
    #
    # A worker-side backend keeps large (or credentialed) values in worker infrastructure and
    # hands back a compact reference string; the state store then stores the reference. The
    # accessors call these hooks (sync ones run in a worker thread from async code), after the
    # key, the retention and the value have been validated and before anything is stored.

    def _no_offload(self, hook: str) -> HookNotImplementedError:
        return HookNotImplementedError(
            self,
            f"{hook}()",
            "a backend configured as [workers] state_backend must override the four "
            "*_to_ref/*_from_ref hooks",
        )

    def serialize_task_store_to_ref(self, scope: TaskScope, key: str, value: JSONValue) -> str:
        """Store a task-state ``value`` outside the state store; return its reference."""
        raise self._no_offload("serialize_task_store_to_ref")

    def deserialize_task_store_from_ref(self, scope: TaskScope, key: str, ref: str) -> JSONValue:
        """Return the task-state value that ``ref`` (from the hook above) points to."""
        raise self._no_offload("deserialize_task_store_from_ref")

    def serialize_asset_store_to_ref(self, scope: AssetScope, key: str, value: JSONValue) -> str:
        """Store an asset-state ``value`` outside the state store; return its reference."""
        raise self._no_offload("serialize_asset_store_to_ref")

    def deserialize_asset_store_from_ref(self, scope: AssetScope, key: str, ref: str) -> JSONValue:
        """Return the asset-state value that ``ref`` (from the hook above) points to."""
        raise self._no_offload("deserialize_asset_store_from_ref")
