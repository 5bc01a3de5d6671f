"""The logs service: a run's tries' output, checked once for every backend (the rules are
:mod:`._logs`')."""

from __future__ import annotations

from collections.abc import Sequence

from ._logs import DEFAULT_LOG_MAX_BYTES, LogChunk, LogsDriver, check_chunks, check_max_bytes
from ._services import Service
from ._values import check_bigint

__all__ = ["LogsService"]


class LogsService(Service[LogsDriver]):
    """Each try's stdout, stderr and log records, kept with its run
    (:class:`~.protocols.RunLogs`)."""

    __slots__ = ()

    async def aappend(
        self,
        run_id: int,
        try_number: int,
        chunks: Sequence[tuple[str, str]],
        *,
        max_bytes: int = DEFAULT_LOG_MAX_BYTES,
    ) -> None:
        """Keep ``chunks`` (``(stream, text)`` pairs) after try ``try_number``'s earlier ones,
        secrets masked; the try keeps at most ``max_bytes`` bytes of text, its tail. Empty
        texts are skipped (nothing to store: no round trip). An unknown run is a
        :class:`~.errors.RunNotFoundError`, and nothing is stored."""
        self._store._check_open()
        run_id = check_bigint(run_id, what="run_id", minimum=1)
        try_number = check_bigint(try_number, what="try_number", minimum=1)
        cap = check_max_bytes(max_bytes)
        kept = check_chunks(chunks, cap)
        if kept:
            await self._driver._aappend_logs(run_id, try_number, kept, cap)

    async def alist(
        self,
        run_id: int,
        *,
        try_number: int | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[LogChunk]:
        """The run's chunks after ``after_seq`` in order (only try ``try_number``'s when
        given; at most ``limit``). An unknown run is a :class:`~.errors.RunNotFoundError`."""
        self._store._check_open()
        run_id = check_bigint(run_id, what="run_id", minimum=1)
        if try_number is not None:
            check_bigint(try_number, what="try_number", minimum=1)
        after_seq = check_bigint(after_seq, what="after_seq")
        if limit is not None:
            check_bigint(limit, what="limit", minimum=1)
        return await self._driver._alist_logs(run_id, try_number, after_seq, limit)
