"""The logs kept with each run: the record of a chunk, and the rules every backend applies.

A try's output arrives as chunks, each ``(stream, text)`` with ``stream`` one of
:data:`LOG_STREAMS`. The store keeps them with their run, each numbered by ``seq``: a number
that only grows, across the run's tries (and across runs), so ``seq`` alone orders a run's
chunks and a reader that saw ``seq`` asks for what came after it.

**The cap.** A try keeps at most ``max_bytes`` bytes of text (UTF-8); past it, its oldest
chunks are dropped whole, so what is kept is the tail, at most the cap. A chunk longer than
the cap keeps its last ``max_bytes`` bytes.

**Retention.** A finished run's logs go with its asset events: garbage collection deletes
them once the run finished longer ago than ``[events] retention_days`` (see :mod:`._gc`).

**Text.** Each chunk's text goes through :func:`~._redact.redact_secrets` before it is
stored, on every backend; a NUL (which PostgreSQL's text cannot hold) becomes U+FFFD, as
does anything that is not valid UTF-8.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, Protocol

from ._redact import redact_secrets
from ._values import check_bigint
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "DEFAULT_LOG_MAX_BYTES",
    "LOG_STREAMS",
    "LogChunk",
    "LogStream",
    "LogsDriver",
    "NewChunk",
    "check_chunks",
    "check_max_bytes",
    "clean_text",
    "tail_of",
]

LogStream = Literal["stdout", "stderr", "log"]

LOG_STREAMS: Final[tuple[LogStream, ...]] = ("stdout", "stderr", "log")
"""What a chunk may come from: the task's ``print()`` and ``sys.stdout``, ``sys.stderr``, and
the log records of its code (``log``)."""

DEFAULT_LOG_MAX_BYTES: Final = 1024 * 1024
"""The bytes of text a try keeps when no cap is given (``[worker] log_max_bytes``' default)."""


@dataclass(frozen=True, slots=True)
class LogChunk:
    """A piece of one try's output: ``text`` written to ``stream`` (``"stdout"``,
    ``"stderr"`` or ``"log"``) by try ``try_number`` of run ``run_id``; ``seq`` grows with
    each chunk stored (within the run's try and across its tries), ``created_at`` is when the
    store took it."""

    run_id: int
    try_number: int
    seq: int
    stream: str
    text: str
    created_at: datetime


NewChunk = tuple[str, str, int]
"""A checked chunk on its way to a driver: ``(stream, text, size in bytes)``."""


def clean_text(text: str) -> str:
    """``text`` as the store keeps it: secrets masked, NUL and invalid UTF-8 as U+FFFD."""
    text = redact_secrets(text).replace("\x00", "\ufffd")
    try:
        text.encode()
    except UnicodeEncodeError:  # lone surrogates (surrogateescape'd bytes)
        text = text.encode(errors="surrogatepass").decode(errors="replace")
    return text


def tail_of(text: str, max_bytes: int) -> str:
    """The last ``max_bytes`` bytes of ``text`` (a character cut in two is dropped)."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[-max_bytes:].decode(errors="ignore")


def check_chunks(chunks: object, max_bytes: int) -> list[NewChunk]:
    """``chunks`` (a sequence of ``(stream, text)``) checked and cleaned, empty texts left
    out, and only the tail of the batch that fits ``max_bytes`` kept; raises
    :class:`ArgumentTypeError` or :class:`InvalidArgumentError` naming the bad item."""
    if isinstance(chunks, str | bytes) or not isinstance(chunks, Sequence):
        raise ArgumentTypeError("chunks", chunks, "a sequence of (stream, text) pairs")
    checked: list[tuple[str, str]] = []
    for item in chunks:
        if not isinstance(item, tuple) or len(item) != 2:
            raise ArgumentTypeError("chunks", item, "a sequence of (stream, text) pairs")
        stream, text = item
        if stream not in LOG_STREAMS:
            raise InvalidArgumentError("stream", stream, f"must be one of {', '.join(LOG_STREAMS)}")
        if not isinstance(text, str):
            raise ArgumentTypeError("text", text, "a str")
        if text:
            checked.append((stream, text))
    kept: list[NewChunk] = []
    room = max_bytes
    for stream, text in reversed(checked):  # the newest first: the tail is what is kept
        text = tail_of(clean_text(text), room)
        size = len(text.encode())
        if size:
            kept.append((stream, text, size))
            room -= size
        if room <= 0:
            break
    kept.reverse()
    return kept


def check_max_bytes(value: object) -> int:
    """A cap of a try's logs: an int of at least 1."""
    return check_bigint(value, what="max_bytes", minimum=1)


class LogsDriver(Protocol):
    """The primitives of :class:`~watchkeeper.store.protocols.LogsService` (here, beside the
    rules they keep, rather than in ``_protocols``)."""

    async def _aappend_logs(
        self, run_id: int, try_number: int, chunks: list[NewChunk], max_bytes: int
    ) -> None:
        """Store these chunks (at least one, their sizes summing to at most ``max_bytes``)
        after the run's others, then drop the try's oldest until the try keeps at most
        ``max_bytes``; :class:`~.errors.RunNotFoundError` for an unknown run."""

    async def _alist_logs(
        self, run_id: int, try_number: int | None, after_seq: int, limit: int | None
    ) -> list[LogChunk]:
        """The run's chunks with ``seq > after_seq`` (of one try, or all), by ``seq``;
        :class:`~.errors.RunNotFoundError` for an unknown run."""
