"""Operator controls kept in the store: watcher pause/resume/retry rows and API token rows.

Both are rows so that every daemon, the ``watchkeeper`` command and the HTTP API act on the
same truth: a watcher paused from the command line is stopped by whichever daemon runs it,
and stays paused across restarts.

- A :class:`WatcherControl` row per watcher name an operator touched: ``paused``, and
  ``retry_seq``, a counter that ``retry`` increments (each daemon remembers the last value it
  saw and restarts a ``failed`` trigger of that watcher when the counter moves).
- An :class:`ApiToken` row per token: its scopes, a random salt and the SHA-256 of salt and
  secret (the secret itself is never stored), expiry and revocation.

A backend offers these through the :class:`OperatorControls` capability (a runtime-checkable
Protocol exported from :mod:`watchkeeper.store.backend`, checked once by its callers).
:class:`ControlsBackend` writes its rules once (open store, argument checks) over ``_a<name>``
hooks, like :class:`~watchkeeper.store.backend.MetastoreBackend`; the built-in backends
implement the hooks in ``_memory_controls``, ``sqlite/controls`` and ``postgres/controls``.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from ._backend import BaseStateBackend
from ._values import check_bigint, check_events_query, check_key, check_name
from .errors import ArgumentTypeError

__all__ = [
    "ApiToken",
    "ControlsBackend",
    "OperatorControls",
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


def check_watcher_name(name: object) -> str:
    """``name`` if it is a valid watcher name (the store's naming rule), else raise."""
    return check_name(name, what="watcher name")


@runtime_checkable
class OperatorControls(Protocol):
    """What the operator API needs of a backend (the built-in ones have it): watcher controls,
    API tokens, the reads of a live event stream and an atomic compare-and-delete."""

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

    async def acount_events_since(self, since: datetime) -> dict[str, int]:
        """The number of events each watcher committed at or after ``since`` (an event of
        several assets counts once per asset, as it is logged); watchers with none are left
        out. What a watcher's events per minute over a window are computed from."""
        ...

    async def adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:
        """Delete ``key`` of ``asset`` only if it is at ``expected_version``, atomically.

        Raises :class:`~watchkeeper.store.errors.VersionConflictError` (``actual`` 0: the key does not
        exist) and writes nothing otherwise; an unknown asset is
        :class:`~watchkeeper.store.errors.AssetNotFoundError`.
        """
        ...

    async def acreate_token(self, token: ApiToken) -> None:
        """Store ``token``; a revoked token of the same name is replaced.

        Raises :class:`~watchkeeper.store.errors.TokenExistsError` when a live (not revoked) token has that name.
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


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(name, value, "a str")
    return value


class ControlsBackend(BaseStateBackend, ABC):
    """:class:`OperatorControls` written once: each method checks the store is open and its
    arguments the same way for every backend, then calls its ``_a<name>`` hook."""

    async def aset_watcher_paused(self, watcher: str, paused: bool, *, by: str) -> WatcherControl:
        """Pause or resume ``watcher`` (creating its row); return the row."""
        self._check_open()
        name = check_watcher_name(watcher)
        if not isinstance(paused, bool):
            raise ArgumentTypeError("paused", paused, "a bool")
        return await self._aset_watcher_paused(name, paused, _check_text("by", by))

    async def arequest_watcher_retry(self, watcher: str, *, by: str) -> WatcherControl:
        """Add one to ``watcher``'s ``retry_seq`` (creating its row); return the row."""
        self._check_open()
        name = check_watcher_name(watcher)
        return await self._arequest_watcher_retry(name, _check_text("by", by))

    async def alist_watcher_controls(self) -> builtins.list[WatcherControl]:
        """Every control row, ordered by watcher name."""
        self._check_open()
        return await self._alist_watcher_controls()

    async def alast_event_id(self, asset: str | None = None) -> int:
        """The id of the latest committed event (of ``asset``), 0 when there is none."""
        self._check_open()
        check_events_query(asset, 0, None)
        return await self._alast_event_id(asset)

    async def alist_event_json(
        self, *, asset: str | None, since_id: int, limit: int
    ) -> builtins.list[tuple[int, str]]:
        """Events with ``id > since_id`` in id order, as ``(id, JSON object text)``."""
        self._check_open()
        check_events_query(asset, since_id, limit)
        return await self._alist_event_json(asset, since_id, limit)

    async def acount_events_since(self, since: datetime) -> dict[str, int]:
        """The number of events each watcher committed at or after ``since``.

        Raises:
            ArgumentTypeError: ``since`` is not a timezone-aware datetime.
        """
        self._check_open()
        if not isinstance(since, datetime) or since.tzinfo is None:
            raise ArgumentTypeError("since", since, "a timezone-aware datetime")
        return await self._acount_events_since(since)

    async def adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:
        """Delete ``key`` of ``asset`` only if it is at ``expected_version``, atomically."""
        self._check_open()
        name = check_name(asset, what="asset name")
        version = check_bigint(expected_version, what="expected_version")
        await self._adelete_if_version(name, check_key(key), version)

    async def acreate_token(self, token: ApiToken) -> None:
        """Store ``token``; a revoked token of the same name is replaced."""
        self._check_open()
        if not isinstance(token, ApiToken):
            raise ArgumentTypeError("token", token, "an ApiToken")
        await self._acreate_token(token)

    async def alist_tokens(self) -> builtins.list[ApiToken]:
        """Every token row (revoked ones too), ordered by name."""
        self._check_open()
        return await self._alist_tokens()

    async def aget_token(self, token_id: str) -> ApiToken | None:
        """The token row whose public id is ``token_id``, or None."""
        self._check_open()
        return await self._aget_token(_check_text("token_id", token_id))

    async def arevoke_token(self, name: str) -> bool:
        """Mark the token ``name`` revoked; False when there is no live token of that name."""
        self._check_open()
        return await self._arevoke_token(_check_text("name", name))

    # -- hooks: called with checked arguments, on an open store --------------------------------

    @abstractmethod
    async def _aset_watcher_paused(self, watcher: str, paused: bool, by: str) -> WatcherControl: ...

    @abstractmethod
    async def _arequest_watcher_retry(self, watcher: str, by: str) -> WatcherControl: ...

    @abstractmethod
    async def _alist_watcher_controls(self) -> builtins.list[WatcherControl]: ...

    @abstractmethod
    async def _alast_event_id(self, asset: str | None) -> int: ...

    @abstractmethod
    async def _alist_event_json(
        self, asset: str | None, since_id: int, limit: int
    ) -> builtins.list[tuple[int, str]]: ...

    @abstractmethod
    async def _acount_events_since(self, since: datetime) -> dict[str, int]: ...

    @abstractmethod
    async def _adelete_if_version(self, asset: str, key: str, expected_version: int) -> None: ...

    @abstractmethod
    async def _acreate_token(self, token: ApiToken) -> None: ...

    @abstractmethod
    async def _alist_tokens(self) -> builtins.list[ApiToken]: ...

    @abstractmethod
    async def _aget_token(self, token_id: str) -> ApiToken | None: ...

    @abstractmethod
    async def _arevoke_token(self, name: str) -> bool: ...
