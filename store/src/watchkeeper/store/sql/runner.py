"""What a SQL driver needs of its database: a :class:`Runner` runs jobs there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from .engine import Dialect, Job

__all__ = ["Runner"]

T = TypeVar("T")


class Runner(Protocol):
    """How jobs run on one database: its dialect, its tables' prefix, writes and reads."""

    @property
    def dialect(self) -> Dialect: ...
    @property
    def prefix(self) -> str: ...

    async def write(
        self,
        job: Callable[[], Job[T]],
        *,
        what: str,
        lane: str = "writes",
        bound: float | None = None,
    ) -> T:
        """Run a fresh ``job()`` to its end, committed (again, if the database asks: a job is
        idempotent). ``what`` names it in errors; jobs of one ``lane`` run one at a time where
        the runner has lanes (renewals of leases never wait for a claim); ``bound``: each
        statement's time limit, when shorter than the store's."""
        ...

    async def read(self, job: Callable[[], Job[T]], *, what: str) -> T:
        """Run a job that only reads, on the store's readers."""
        ...
