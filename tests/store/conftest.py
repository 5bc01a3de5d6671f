"""Fixtures of the store contract modules: a backend with two assets, optionally seeded."""

from __future__ import annotations

import pytest
from watchkeeper.store.protocols import BaseStateBackend

from tests.store._contract import ALL_SCOPES, INVOICES, ORDERS, TASK


@pytest.fixture
async def store(backend: BaseStateBackend) -> BaseStateBackend:
    """The backend with the assets ``orders`` and ``invoices`` registered."""
    await backend.events.aregister_assets([ORDERS, INVOICES])
    return backend


@pytest.fixture
async def seeded(store: BaseStateBackend) -> BaseStateBackend:
    """Keys ``a`` and ``b`` in every scope (``a`` of TASK at version 2)."""
    for scope in ALL_SCOPES:
        await store.aset(scope, "a", {"n": 1})
        await store.aset(scope, "b", [1, 2])
    await store.aset(TASK, "a", {"n": 2})
    return store
