"""Fixtures of the store contract modules: a backend with two assets, optionally seeded."""

from __future__ import annotations

import pytest
from _contract import ALL_SCOPES, INVOICES, ORDERS, TASK
from watchkeeper.store.backend import MetastoreBackend


@pytest.fixture
async def store(backend: MetastoreBackend) -> MetastoreBackend:
    """The backend with the assets ``orders`` and ``invoices`` registered."""
    await backend.aregister_assets([ORDERS, INVOICES])
    return backend


@pytest.fixture
async def seeded(store: MetastoreBackend) -> MetastoreBackend:
    """Keys ``a`` and ``b`` in every scope (``a`` of TASK at version 2)."""
    for scope in ALL_SCOPES:
        await store.aset(scope, "a", {"n": 1})
        await store.aset(scope, "b", [1, 2])
    await store.aset(TASK, "a", {"n": 2})
    return store
