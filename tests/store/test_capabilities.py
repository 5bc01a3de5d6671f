"""The services of a store: present ones are reached by attribute, absent ones are None."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from watchkeeper.store import MemoryStateBackend, MissingCapabilityError
from watchkeeper.store.backend import SERVICE_NAMES, BaseStateBackend, Services


class TestServices:
    def test_a_built_in_backend_has_every_service(self) -> None:
        """The memory backend offers every service; each attribute is its service."""
        backend = MemoryStateBackend()
        assert tuple(f.name for f in fields(Services)) == SERVICE_NAMES
        for name in SERVICE_NAMES:
            assert getattr(backend, name) is getattr(backend.services, name) is not None

    def test_an_absent_service_names_the_store_and_the_service(self) -> None:
        """A store without a service raises MissingCapabilityError naming both at the
        attribute, and its ``services`` field is None (what code that does without reads)."""
        backend = MemoryStateBackend()
        backend.services = replace(backend.services, leases=None)
        assert backend.services.leases is None
        with pytest.raises(MissingCapabilityError, match="MemoryStateBackend has no leases"):
            _ = backend.leases
        assert backend.events is backend.services.events

    def test_a_custom_backend_starts_with_no_service(self) -> None:
        """A BaseStateBackend subclass that sets no services has none of them."""

        class Bare(BaseStateBackend):
            pass

        bare = Bare()
        assert bare.services == Services()
        for name in SERVICE_NAMES:
            with pytest.raises(MissingCapabilityError, match=f"Bare has no {name} service"):
                getattr(bare, name)
