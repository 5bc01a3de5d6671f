"""The services of a store: present ones are reached by attribute, absent ones are None."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from watchkeeper.store import MemoryStateBackend, MissingCapabilityError, PostgresStateBackend
from watchkeeper.store.protocols import SERVICE_NAMES, BaseStateBackend, Services


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


class TestSessionSettings:
    def test_postgres_names_its_sessions_and_bounds_idle_transactions(self) -> None:
        """One floor for every caller: the idle-in-transaction timeout is the lease, at least
        5 s; the session name is cut to PostgreSQL's 63 bytes; explicit settings win."""
        short = PostgresStateBackend("postgresql://unused")
        short.configure_sessions("w" * 80, 1.0)
        assert short.server_settings == {
            "application_name": "w" * 63,
            "idle_in_transaction_session_timeout": "5000ms",
        }
        long = PostgresStateBackend(
            "postgresql://unused", server_settings={"application_name": "x"}
        )
        long.configure_sessions("watchkeeper worker", 30.0)
        assert long.server_settings == {
            "application_name": "x",
            "idle_in_transaction_session_timeout": "30000ms",
        }
