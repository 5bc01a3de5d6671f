"""Operator controls kept in the store: watcher pause/resume/retry rows and API token rows.

Both are rows so that every daemon, the ``watchkeeper`` command and the HTTP API act on the
same truth: a watcher paused from the command line is stopped by whichever daemon runs it,
and stays paused across restarts. The controls service (:mod:`._services`) keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["ApiToken", "WatcherControl"]


@dataclass(frozen=True, slots=True)
class WatcherControl:
    """What operators asked of one watcher: whether it is paused, and how many retries."""

    watcher: str
    paused: bool
    retry_seq: int
    updated_at: datetime
    updated_by: str | None = None


@dataclass(frozen=True, slots=True)
class ApiToken:
    """A stored API token: never the secret, only ``digest = sha256(salt + secret)``.

    ``token_id`` is the public half of the token the user holds (``wk_<token_id>_<secret>``),
    the key it is looked up by; ``scopes`` are strings such as ``read``,
    ``write:asset:orders_*``, ``operate`` and ``admin``.
    """

    name: str
    token_id: str
    scopes: tuple[str, ...]
    salt: str
    digest: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def __repr__(self) -> str:  # the digest and salt stay out of logs and tracebacks
        return f"<ApiToken {self.name!r} scopes={list(self.scopes)!r}>"
