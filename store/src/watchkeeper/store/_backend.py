"""``BaseStateBackend``: validation, the sync/async bridge, and the hooks a backend implements."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

import anyio
import anyio.abc

from ._lifecycle import Lifecycle
from ._offload import OffloadHooks
from ._protocols import Services
from ._slots import slot_setters
from ._types import AssetScope, Put, RawEntry, StateEntry, StateScope, TaskScope, Writer
from ._values import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    MAX_BIGINT,
    NEVER_EXPIRE,
    JSONValue,
    check_key,
    check_retention,
    decode_value,
    encode_value,
    expiry_of,
)
from .errors import (
    ArgumentTypeError,
    HookNotImplementedError,
    InvalidArgumentError,
    InvalidSettingError,
    MissingCapabilityError,
    RetentionTypeError,
    StoreClosedError,
)

if TYPE_CHECKING:
    from ._protocols import (
        EventLog,
        GarbageCollector,
        LeaseTable,
        OperatorControls,
        RunLogs,
        StatusTable,
        TaskQueue,
    )

__all__ = ["BaseStateBackend"]

T = TypeVar("T")


_PING_SCOPE = TaskScope("watchkeeper", "ping", "ping")
"""A task scope nothing writes: what the default :meth:`BaseStateBackend.aping` reads."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


_new_object: Final = object.__new__
_PUT_SETTERS: Final = slot_setters(Put)


def _check_expected_version(expected_version: object) -> None:
    if expected_version is None:
        return
    if type(expected_version) is not int or not 0 <= expected_version <= MAX_BIGINT:
        raise InvalidArgumentError(
            "expected_version", expected_version, f"must be an int from 0 to {MAX_BIGINT}"
        )


def _entry(raw: RawEntry) -> StateEntry:
    return StateEntry(
        key=raw.key,
        value=decode_value(raw.value_json),
        version=raw.version,
        updated_at=raw.updated_at,
        writer=raw.writer,
        expires_at=raw.expires_at,
        never_expire=raw.never_expire,
    )


S = TypeVar("S")


def _present(store: object, service: S | None, name: str) -> S:
    if service is None:
        raise MissingCapabilityError(store, name)
    return service


class BaseStateBackend(Lifecycle, OffloadHooks):
    """Where task and asset state lives.

    The async methods (``aget``, ``aset``, ...) are the primary interface; every one has a sync
    twin (``get``, ``set``, ...). The public methods validate their input here, once, and then
    call the backend's hooks. A backend implements **either** the async hooks (``_aget``,
    ``_aput``, ``_adelete``, ``_aclear``, ``_alist``) **or** the sync ones (``_get``, ``_put``,
    ``_delete``, ``_clear``, ``_list``); the other side is bridged:

    - async hooks from sync callers: on the loop that opened the backend (``async with``) from
      any other thread, through a greenback portal on the loop's own thread (the triggerer gives
      each trigger one), or on a private loop thread when the backend was opened with ``with``;
    - sync hooks from async callers: in a worker thread, so the loop never blocks.

    The rest of the store is in **services** (:mod:`watchkeeper.store.protocols`):
    ``store.events``, ``store.tasks``, ``store.leases``, ``store.controls``, ``store.status``,
    ``store.gc`` and ``store.logs``. The built-in backends have them all; a custom one sets
    ``self.services`` to those it has (the others are ``None`` there, and their attribute
    raises :class:`MissingCapabilityError`: a daemon on a store without leases runs every
    trigger unfenced, as a single daemon).
    """

    def __init__(
        self,
        *,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if max_value_bytes <= 0:
            raise InvalidSettingError("max_value_bytes", f"must be positive, got {max_value_bytes}")
        if max_payload_bytes <= 0:
            raise InvalidSettingError(
                "max_payload_bytes", f"must be positive, got {max_payload_bytes}"
            )
        self.max_value_bytes = max_value_bytes
        self.max_payload_bytes = max_payload_bytes
        """The largest event payload (JSON, bytes): the runtime checks it before committing."""
        super().__init__()
        self.clock: Callable[[], datetime] = _utcnow
        self.applied_migrations: list[int] = []
        """The schema migrations the last opening applied (empty when it was up to date)."""
        self.services = Services()
        """The services this store offers (``None`` for one it lacks)."""

    # -- services ----------------------------------------------------------------------------

    @property
    def events(self) -> EventLog:
        """The asset registry and the event log."""
        return _present(self, self.services.events, "events")

    @property
    def tasks(self) -> TaskQueue:
        """Event consumers, tasks, runs and run leases."""
        return _present(self, self.services.tasks, "tasks")

    @property
    def leases(self) -> LeaseTable:
        """Node and trigger leases."""
        return _present(self, self.services.leases, "leases")

    @property
    def controls(self) -> OperatorControls:
        """Watcher controls and API tokens."""
        return _present(self, self.services.controls, "controls")

    @property
    def status(self) -> StatusTable:
        """Trigger and daemon status rows."""
        return _present(self, self.services.status, "status")

    @property
    def gc(self) -> GarbageCollector:
        """Garbage collection."""
        return _present(self, self.services.gc, "gc")

    @property
    def logs(self) -> RunLogs:
        """The logs kept with each run's tries."""
        return _present(self, self.services.logs, "logs")

    # -- health ------------------------------------------------------------------------------

    async def aping(self) -> None:
        """Return once the store answered a round trip; raise when it did not.

        :class:`~watchkeeper.store.StoreUnavailableError` means it does not answer now (try
        again later). The runtime pings while the store is unavailable, to know when to
        resume its watchers. This default reads a key nobody writes; the built-in backends
        go through their writer, so a store that answers reads but refuses writes (a
        read-only standby, a locked SQLite file) does not count as back.
        """
        await self.aget_raw(_PING_SCOPE, "ping")

    async def averify(self) -> None:
        """Raise when the store this backend opened is gone for good (the daemon's heartbeat
        calls it); nothing to check by default. The SQLite backend checks that its path
        still names the file it opened (:class:`~watchkeeper.store.DatabaseFileRemovedError`).
        """
        self._check_open()

    async def amigrate(self) -> builtins.list[int]:
        """Apply pending schema migrations; return the versions applied (opening does this too)."""
        return []

    def configure_sessions(self, name: str, lease_seconds: float) -> None:
        """Name this store's database sessions ``name`` and let the server end one left idle
        inside a transaction for about ``lease_seconds``, so a frozen process cannot hold its
        row locks (and its fenced leases) much past its leases. Call before it opens. A store
        without server sessions (memory, SQLite) has nothing to set."""

    def _describe(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._describe()
        return f"<{type(self).__name__}{' ' + extra if extra else ''} open={self._open}>"

    # -- the bridge --------------------------------------------------------------------------

    _HOOKS: ClassVar[tuple[str, ...]] = ("get", "put", "delete", "clear", "list")
    _async_native: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Decide once per class which side of each hook it implements: the per-call
        # -- hook dispatch: which side of each hook a class implements -------------------------
        cls._async_native = frozenset(
            name
            for name in cls._HOOKS
            if getattr(cls, f"_a{name}") is not getattr(BaseStateBackend, f"_a{name}")
        )

    def _overrides(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(BaseStateBackend, name)

    async def _call_hook(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Await the async hook ``_a<name>``, or run the sync hook ``_<name>`` in a thread."""
        if self._overrides(f"_a{name}"):
            return await getattr(self, f"_a{name}")(*args, **kwargs)
        if self._overrides(f"_{name}"):
            sync = getattr(self, f"_{name}")
            return await anyio.to_thread.run_sync(lambda: sync(*args, **kwargs))
        raise HookNotImplementedError(
            self, f"_a{name}", f"it implements neither _a{name} nor _{name}"
        )

    def _call_hook_sync(self, method: str, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._overrides(f"_{name}"):
            return getattr(self, f"_{name}")(*args, **kwargs)
        return self._run_sync(method, self._call_hook, name, *args, **kwargs)

    # -- hooks: implement one side -------------------------------------------------------------

    async def _aget(self, scope: StateScope, key: str) -> RawEntry | None:
        raise NotImplementedError

    async def _aput(self, put: Put) -> int:
        """Upsert and return the new version; with ``put.expected_version`` compare first
        (0 means "must not exist") and raise :class:`VersionConflictError` on mismatch.

        A ``writer`` that carries a fence makes the write conditional: inside the transaction
        that writes, the fence's lease must still be live, else :class:`LeaseLostError` and
        nothing is written (see :mod:`._leases`)."""
        raise NotImplementedError

    async def _adelete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        """Delete one key; True when it existed. A ``writer`` with a fence is checked as in
        :meth:`_aput`: in the transaction that deletes, :class:`LeaseLostError` if stale."""
        raise NotImplementedError

    async def _aclear(
        self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None
    ) -> int:
        """Delete every key of the scope; return how many. Fenced like :meth:`_adelete`."""
        raise NotImplementedError

    async def _alist(self, scope: StateScope) -> list[RawEntry]:
        raise NotImplementedError

    def _get(self, scope: StateScope, key: str) -> RawEntry | None:
        raise NotImplementedError

    def _put(self, put: Put) -> int:
        raise NotImplementedError

    def _delete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        raise NotImplementedError

    def _clear(self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None) -> int:
        raise NotImplementedError

    def _list(self, scope: StateScope) -> list[RawEntry]:
        raise NotImplementedError

    # -- validation shared by both sides -------------------------------------------------------

    def _prepare_put(
        self,
        scope: StateScope,
        key: object,
        value: object,
        retention: object,
        expected_version: int | None,
        writer: Writer | None,
    ) -> Put:
        self._check_scope(scope)
        key = check_key(key)
        retention = check_retention(retention)
        if isinstance(scope, AssetScope) and retention is not None:
            raise RetentionTypeError(retention, "asset state has no retention")
        text = encode_value(key, value, max_value_bytes=self.max_value_bytes)
        expires_at = (
            expiry_of(retention, self.clock()) if isinstance(retention, timedelta) else None
        )
        # Put(...) with its fields set directly (see ._slots): every value is checked above.
        put = _new_object(Put)
        fill = _PUT_SETTERS
        fill[0](put, scope)
        fill[1](put, key)
        fill[2](put, text)
        fill[3](put, expires_at)
        fill[4](put, retention is NEVER_EXPIRE)
        fill[5](put, expected_version)
        fill[6](put, writer)
        return put

    @staticmethod
    def _check_scope(scope: object) -> None:
        kind = type(scope)
        if kind is not AssetScope and kind is not TaskScope and not isinstance(scope, StateScope):
            raise ArgumentTypeError("scope", scope, "a TaskScope or AssetScope")

    # -- public async API ----------------------------------------------------------------------

    async def aget(self, scope: StateScope, key: str, default: JSONValue = None) -> JSONValue:
        """Return the stored value of ``key`` in ``scope``, or ``default``."""
        raw = await self.aget_raw(scope, key)
        return default if raw is None else decode_value(raw.value_json)

    async def aget_raw(self, scope: StateScope, key: str) -> RawEntry | None:
        self._check_scope(scope)
        check_key(key)
        if not self._open:
            raise StoreClosedError(self)
        if "get" in self._async_native:
            return await self._aget(scope, key)
        result: RawEntry | None = await self._call_hook("get", scope, key)
        return result

    async def aget_entry(self, scope: StateScope, key: str) -> StateEntry | None:
        """Return the value with its version, update time and writer, or ``None``."""
        raw = await self.aget_raw(scope, key)
        return None if raw is None else _entry(raw)

    async def aset(
        self,
        scope: StateScope,
        key: str,
        value: JSONValue,
        *,
        retention: timedelta | object | None = None,
        expected_version: int | None = None,
        writer: Writer | None = None,
    ) -> int:
        """Upsert ``key`` and return its new version.

        ``expected_version`` makes it a compare-and-set (0: the key must not exist yet).
        """
        put = self._prepare_put(scope, key, value, retention, expected_version, writer)
        # What aput does, inline: one coroutine fewer on the most frequent write.
        _check_expected_version(put.expected_version)
        if not self._open:
            raise StoreClosedError(self)
        if "put" in self._async_native:
            return await self._aput(put)
        version: int = await self._call_hook("put", put)
        return version

    async def aput_json(
        self,
        scope: StateScope,
        key: str,
        value_json: str,
        *,
        expires_at: datetime | None = None,
        never_expire: bool = False,
        expected_version: int | None = None,
        writer: Writer | None = None,
    ) -> int:
        """Store already-validated JSON text (accessors that offload values use this)."""
        return await self.aput(
            Put(scope, key, value_json, expires_at, never_expire, expected_version, writer)
        )

    async def aput(self, put: Put) -> int:
        """Store one prepared :class:`Put` and return the key's new version."""
        _check_expected_version(put.expected_version)
        if not self._open:
            raise StoreClosedError(self)
        if "put" in self._async_native:
            return await self._aput(put)
        version: int = await self._call_hook("put", put)
        return version

    async def adelete(self, scope: StateScope, key: str, *, writer: Writer | None = None) -> None:
        """Delete ``key``; a missing key is not an error.

        A ``writer`` with a fence deletes only while its lease is live (as ``aset`` does).
        """
        self._check_scope(scope)
        check_key(key)
        self._check_open()
        await self._call_hook("delete", scope, key, writer=writer)

    async def aclear(
        self, scope: StateScope, *, all_map_indices: bool = False, writer: Writer | None = None
    ) -> int:
        """Delete every key of the scope (of every map index with ``all_map_indices``).

        A ``writer`` with a fence clears only while its lease is live (as ``aset`` does).
        """
        self._check_scope(scope)
        self._check_open()
        count: int = await self._call_hook("clear", scope, all_map_indices, writer=writer)
        return count

    async def alist(self, scope: StateScope) -> list[StateEntry]:
        """Every entry of the scope, ordered by key."""
        self._check_scope(scope)
        self._check_open()
        raws: list[RawEntry] = await self._call_hook("list", scope)
        return [_entry(raw) for raw in raws]

    # -- public sync API -------------------------------------------------------------------------

    def get(self, scope: StateScope, key: str, default: JSONValue = None) -> JSONValue:
        raw = self.get_raw(scope, key)
        return default if raw is None else decode_value(raw.value_json)

    def get_raw(self, scope: StateScope, key: str) -> RawEntry | None:
        self._check_scope(scope)
        check_key(key)
        result: RawEntry | None = self._call_hook_sync("get", "get", scope, key)
        return result

    def get_entry(self, scope: StateScope, key: str) -> StateEntry | None:
        raw = self.get_raw(scope, key)
        return None if raw is None else _entry(raw)

    def set(
        self,
        scope: StateScope,
        key: str,
        value: JSONValue,
        *,
        retention: timedelta | object | None = None,
        expected_version: int | None = None,
        writer: Writer | None = None,
    ) -> int:
        return self.put(self._prepare_put(scope, key, value, retention, expected_version, writer))

    def put_json(
        self,
        scope: StateScope,
        key: str,
        value_json: str,
        *,
        expires_at: datetime | None = None,
        never_expire: bool = False,
        expected_version: int | None = None,
        writer: Writer | None = None,
    ) -> int:
        return self.put(
            Put(scope, key, value_json, expires_at, never_expire, expected_version, writer)
        )

    def put(self, put: Put) -> int:
        """The sync twin of :meth:`aput`."""
        _check_expected_version(put.expected_version)
        if self._overrides("_put"):
            return self._put(put)
        return self._run_sync("set", self.aput, put)

    def delete(self, scope: StateScope, key: str, *, writer: Writer | None = None) -> None:
        self._check_scope(scope)
        check_key(key)
        self._call_hook_sync("delete", "delete", scope, key, writer=writer)

    def clear(
        self, scope: StateScope, *, all_map_indices: bool = False, writer: Writer | None = None
    ) -> int:
        self._check_scope(scope)
        count: int = self._call_hook_sync("clear", "clear", scope, all_map_indices, writer=writer)
        return count

    def list(self, scope: StateScope) -> builtins.list[StateEntry]:
        self._check_scope(scope)
        raws: builtins.list[RawEntry] = self._call_hook_sync("list", "list", scope)
        return [_entry(raw) for raw in raws]
