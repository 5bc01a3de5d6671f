"""Operator controls kept in the store: watcher pause/resume/retry rows and API token rows.

Both are rows so that every daemon, the ``watchkeeper`` command and the HTTP API act on the
same truth: a watcher paused from the command line is stopped by whichever daemon runs it,
and stays paused across restarts.

- A :class:`WatcherControl` row per watcher name an operator touched: ``paused``, and
  ``retry_seq``, a counter that ``retry`` increments (each daemon remembers the last value it
  saw and restarts a ``failed`` trigger of that watcher when the counter moves).
- An :class:`ApiToken` row per token: its scopes, a random salt and the SHA-256 of salt and
  secret (the secret itself is never stored), expiry and revocation.

A backend offers these through :class:`SupportsControls` (a runtime-checkable capability,
checked once by its callers); the built-in backends implement it, each in its own module
(``_memory_controls``, ``_sqlite_controls``, ``_postgres_controls``).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from ._values import check_name
from .errors import StateStoreError

__all__ = [
    "ApiToken",
    "SupportsControls",
    "TokenExistsError",
    "WatcherControl",
    "check_watcher_name",
]


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


class TokenExistsError(StateStoreError, ValueError):
    """Raised when a token is created under the name of a token that is not revoked."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"a token named {name!r} already exists; revoke it first")


def check_watcher_name(name: object) -> str:
    """``name`` if it is a valid watcher name (the store's naming rule), else raise."""
    return check_name(name, what="watcher name")


@runtime_checkable
class SupportsControls(Protocol):
    """A backend that stores watcher controls and API tokens (the built-in ones do)."""

    async def aset_watcher_paused(self, watcher: str, paused: bool, *, by: str) -> WatcherControl:
        """Pause or resume ``watcher`` (creating its row); return the row."""
        ...

    async def arequest_watcher_retry(self, watcher: str, *, by: str) -> WatcherControl:
        """Add one to ``watcher``'s ``retry_seq`` (creating its row); return the row."""
        ...

    async def alist_watcher_controls(self) -> builtins.list[WatcherControl]:
        """Every control row, ordered by watcher name."""
        ...

    async def alast_event_id(self, asset: str | None = None) -> int:
        """The id of the latest committed event (of ``asset``), 0 when there is none: where a
        live tail of the events starts."""
        ...

    async def alist_event_json(
        self, *, asset: str | None, since_id: int, limit: int
    ) -> builtins.list[tuple[int, str]]:
        """Events with ``id > since_id`` in id order, as ``(id, JSON object text)`` built by
        the database (``id``, ``asset``, ``watcher``, ``payload``, ``dedup_key``,
        ``created_at``): what a live stream sends, without decoding and re-encoding each one."""
        ...

    async def adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:
        """Delete ``key`` of ``asset`` only if it is at ``expected_version``, atomically.

        Raises :class:`~watchkeeper.store.VersionConflictError` (``actual`` 0: the key does not
        exist) and writes nothing otherwise; an unknown asset is
        :class:`~watchkeeper.store.AssetNotFoundError`.
        """
        ...

    async def acreate_token(self, token: ApiToken) -> None:
        """Store ``token``; a revoked token of the same name is replaced.

        Raises :class:`TokenExistsError` when a live (not revoked) token has that name.
        """
        ...

    async def alist_tokens(self) -> builtins.list[ApiToken]:
        """Every token row (revoked ones too), ordered by name."""
        ...

    async def aget_token(self, token_id: str) -> ApiToken | None:
        """The token row whose public id is ``token_id``, or None."""
        ...

    async def arevoke_token(self, name: str) -> bool:
        """Mark the token ``name`` revoked; False when there is no live token of that name."""
        ...
