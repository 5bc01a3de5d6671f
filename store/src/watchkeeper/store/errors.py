"""The errors of the state store, rooted at :class:`StateStoreError`.

Where the seeds promise a built-in type (``ValueError``, ``TypeError``, ``KeyError``) the error
subclasses both, so ``except ValueError`` in user code keeps working. Messages are built from the
facts (key, size, limit, version) so a log line says what was wrong without a debugger.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousAssetError",
    "ArgumentTypeError",
    "AssetNotDeclaredError",
    "AssetNotFoundError",
    "BackendImportError",
    "BackendUnavailableError",
    "ConsumerCursorError",
    "ContextKeyError",
    "DatabaseFileRemovedError",
    "HookNotImplementedError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidNameError",
    "InvalidSettingError",
    "InvalidValueError",
    "KeyTypeError",
    "LeaseLostError",
    "MissingCapabilityError",
    "PayloadTooLargeError",
    "ReferenceTypeError",
    "RetentionTypeError",
    "RunLeaseLostError",
    "RunNotFoundError",
    "RunStateError",
    "StateStoreError",
    "StoreAlreadyOpenError",
    "StoreClosedError",
    "StoreUnavailableError",
    "SyncCallInLoopError",
    "TaskNotFoundError",
    "TokenExistsError",
    "ValueTooLargeError",
    "ValueTypeError",
    "VersionConflictError",
]


class StateStoreError(Exception):
    """Raised for any failure of the state store; the root of this module's tree."""


def _shown(value: object) -> str:
    """``repr(value)`` cut to one short line; an int too long to print is described instead."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's int-to-str digit limit
        return f"<an int of {value.bit_length()} bits>"  # type: ignore[attr-defined]
    return text if len(text) <= 40 else text[:37] + "..."


class InvalidArgumentError(StateStoreError, ValueError):
    """Raised when an argument is outside what every backend can keep: a map index or an
    asset id beyond the database's integer, an expected version below 0 or beyond 2**63 - 1,
    a retention whose expiry falls after year 9999, an asset scope with no field set.
    """

    def __init__(self, name: str, value: object, reason: str, *, show: bool = True) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        shown = f" {_shown(value)}" if show else ""
        super().__init__(f"invalid {name}{shown}: {reason}")


class ArgumentTypeError(StateStoreError, TypeError):
    """Raised when an argument has the wrong type (a map index that is not an int, say)."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name} must be {expected}, got {type(value).__name__}")


class InvalidNameError(StateStoreError, ValueError):
    """Raised when a name (an asset, a watcher, a dedup key) breaks the naming rule.

    The rule, one for every name the store keeps: a non-empty ``str`` that encodes as UTF-8
    (no lone surrogates), without C0 control characters or DEL, within a byte limit. The
    message shows the name escaped and cut short, so it is always one printable line.
    """

    def __init__(self, what: str, name: str, reason: str) -> None:
        self.what = what
        self.name = name
        self.reason = reason
        shown = name if len(name) <= 40 else name[:37] + "..."
        super().__init__(f"invalid {what} {shown!r}: {reason}")


class InvalidKeyError(InvalidNameError):
    """Raised when a state key breaks the naming rule (empty, too long, control characters)."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        super().__init__("key", key, reason)


class KeyTypeError(StateStoreError, TypeError):
    """Raised when a key (or another name: ``what``) is not a ``str``."""

    def __init__(self, key: object, *, what: str = "key") -> None:
        self.key = key
        super().__init__(f"{what} must be a str, got {type(key).__name__}")


class InvalidValueError(StateStoreError, ValueError):
    """Raised when a value cannot be stored although its types are JSON: ``None`` at the top,
    NaN or an infinity, a string with a lone surrogate (not UTF-8), an int too long to write
    as text, or containers nested deeper than ``MAX_VALUE_DEPTH``."""


class ValueTypeError(StateStoreError, TypeError):
    """Raised when a value (or part of it) is not JSON: a datetime, a set, a tuple, an object,
    or a dict with a key that is not a ``str``."""

    def __init__(self, path: str, value: object) -> None:
        self.path = path
        self.value_type = type(value).__name__
        super().__init__(
            f"value at {path} is a {self.value_type}, which is not JSON "
            "(use str, int, float, bool, list or dict with str keys)"
        )


class ValueTooLargeError(InvalidValueError):
    """Raised when a value's JSON encoding is larger than ``max_value_bytes``."""

    def __init__(self, key: str, size: int, limit: int) -> None:
        self.key = key
        self.size = size
        self.limit = limit
        super().__init__(
            f"value for key {key!r} is {size} bytes encoded, over the limit of {limit} bytes "
            "(configure [workers] state_backend to offload large values)"
        )


class PayloadTooLargeError(InvalidValueError):
    """Raised when an event payload's JSON encoding is larger than ``[events] max_payload_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"event payload is {size} bytes encoded, over the limit of {limit} bytes "
            "([events] max_payload_bytes); store large data elsewhere and send a reference"
        )


class RetentionTypeError(StateStoreError, TypeError):
    """Raised when ``retention`` is neither a ``timedelta``, ``NEVER_EXPIRE`` nor ``None``."""

    def __init__(self, retention: object, reason: str | None = None) -> None:
        self.retention = retention
        super().__init__(
            reason
            or f"retention must be a datetime.timedelta, NEVER_EXPIRE or None, "
            f"got {type(retention).__name__} {retention!r}"
        )


class VersionConflictError(StateStoreError):
    """Raised when a compare-and-set finds the key at another version than expected.

    Version 0 means the key does not exist.
    """

    def __init__(self, key: str, expected: int, actual: int) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(f"key {key!r} is at version {actual}, expected {expected}")


class AssetNotFoundError(StateStoreError, KeyError):
    """Raised when an asset scope names no registered, active asset.

    Airflow returns the default for such a read; watchkeeper says so instead, because a typo in
    an asset name otherwise looks like an empty watermark.
    """

    def __init__(self, asset: str) -> None:
        self.asset = asset
        super().__init__(asset)

    def __str__(self) -> str:
        return f"asset {self.asset!r} is not registered or not active"


class LeaseLostError(StateStoreError):
    """Raised when a fenced write comes from a daemon that no longer holds the trigger's lease.

    The lease expired, was released, or passed to another daemon (with a higher token).
    Nothing of the write was stored: a paused daemon that wakes up after another one took its
    watcher over can neither emit an event twice nor move a watermark backwards.
    """

    def __init__(self, trigger_id: str, owner: str, token: int, reason: str) -> None:
        self.trigger_id = trigger_id
        self.owner = owner
        self.token = token
        self.reason = reason
        super().__init__(
            f"lease of trigger {trigger_id!r} is no longer held by {owner!r} with token "
            f"{token} ({reason}); nothing was written"
        )


class RunLeaseLostError(StateStoreError):
    """Raised when a worker finishes a run whose lease it no longer holds.

    The lease lapsed, or another worker claimed the run (with a higher token). Nothing was
    written: a frozen worker that wakes up can neither mark the run succeeded nor emit its
    outlet events.
    """

    def __init__(self, run_id: int, owner: str, token: int, reason: str) -> None:
        self.run_id = run_id
        self.owner = owner
        self.token = token
        self.reason = reason
        super().__init__(
            f"lease of run {run_id} is no longer held by {owner!r} with token {token} "
            f"({reason}); nothing was written"
        )


class TaskNotFoundError(StateStoreError, KeyError):
    """Raised when a task name (or a task's asset) is not registered in the store."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(what)

    def __str__(self) -> str:
        return f"{self.what} is not registered (start a worker with its definitions first)"


class RunNotFoundError(StateStoreError, KeyError):
    """Raised when a run id names no run."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        super().__init__(run_id)

    def __str__(self) -> str:
        return f"run {self.run_id} does not exist"


class RunStateError(StateStoreError, ValueError):
    """Raised when a run is not in a state that allows the operation (retrying a running run)."""

    def __init__(self, run_id: int, state: str, wanted: str) -> None:
        self.run_id, self.state = run_id, state
        super().__init__(f"run {run_id} is {state}, {wanted}")


class ConsumerCursorError(StateStoreError, ValueError):
    """Raised when an acknowledgement would move a consumer's cursor backwards, or finds the
    cursor elsewhere than ``expected`` (another process acknowledged meanwhile)."""

    def __init__(self, name: str, event_id: int, current: int, reason: str) -> None:
        self.name, self.event_id, self.current = name, event_id, current
        super().__init__(
            f"consumer {name!r} cannot acknowledge event {event_id}: its cursor is at "
            f"{current} ({reason}); nothing was written"
        )


class BackendUnavailableError(StateStoreError):
    """Raised when the database cannot be reached or opened; the driver error is chained."""


class StoreUnavailableError(BackendUnavailableError):
    """Raised when the store does not answer now for a reason the call's data did not cause.

    A connection refused or lost, a server not accepting connections (shutting down, starting,
    ``ALLOW_CONNECTIONS false``), a read-only transaction during a failover, too many
    connections, an SQLite database locked past ``busy_timeout`` or a disk I/O error. The
    backend classifies the driver error once (it is chained); the same call may succeed
    later, so the runtime waits and retries instead of blaming the caller.
    """


class DatabaseFileRemovedError(StateStoreError):
    """Raised when the database file a backend opened is no longer the file at its path.

    It was removed (``rm -rf`` of its directory) or replaced by another file. Writes would
    go into a file nobody can open again, so from then on the backend refuses every read and
    write with this error; reopening the path is the only way on.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"the SQLite database file {path!r} {reason}; refusing to commit into a file "
            "that is gone (restore it or point [database] url elsewhere, then restart)"
        )


class StoreClosedError(StateStoreError):
    """Raised when a backend is used before it was opened or after it was closed."""

    def __init__(self, backend: object) -> None:
        super().__init__(f"{type(backend).__name__} is closed; open it with 'async with' first")


class MissingCapabilityError(StateStoreError, TypeError):
    """Raised when a store lacks a service the caller needs: a runner on a store with no
    event log, ``watchkeeper gc`` on one without garbage collection (the services are those
    of :mod:`watchkeeper.store.protocols`)."""

    def __init__(self, backend: object, capability: str) -> None:
        self.backend_type = type(backend).__name__
        self.capability = capability
        super().__init__(f"{self.backend_type} has no {capability} service")


class SyncCallInLoopError(StateStoreError, RuntimeError):
    """Raised when a sync method is called on the event loop thread outside a greenback portal.

    Blocking there would stall every other coroutine; use the ``a``-prefixed method instead.
    The triggerer gives each trigger a portal, so sync calls inside ``run()`` work.
    """

    def __init__(self, method: str) -> None:
        super().__init__(
            f"{method}() was called on the event loop thread; "
            f"use 'await a{method}(...)' in async code"
        )


class BackendImportError(StateStoreError, ImportError):
    """Raised when the configured backend cannot be imported: a ``[state_store] backend`` path
    that is not dotted, names no module or no attribute, or a backend whose driver (asyncpg,
    say) is not installed. ``what`` names the backend as configured; ``module`` is the module
    that failed to import, where one did."""

    def __init__(self, what: str, reason: str, *, module: str | None = None) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what} {reason}", name=module)


class InvalidSettingError(StateStoreError, ValueError):
    """Raised when a backend is configured with a value it cannot use: a database URL with no
    known scheme, a pool size below 1, a negative busy timeout, a schema name that is not a
    plain identifier. ``subject`` names the setting (and its value where that helps)."""

    def __init__(self, subject: str, reason: str) -> None:
        self.subject = subject
        self.reason = reason
        super().__init__(f"{subject} {reason}")


class StoreAlreadyOpenError(StateStoreError, RuntimeError):
    """Raised when a backend that is open is entered again (``async with`` twice)."""

    def __init__(self, backend: object) -> None:
        super().__init__(f"{type(backend).__name__} is already open")


class AssetNotDeclaredError(StateStoreError, KeyError):
    """Raised when the asset state store is subscripted with an asset its task or trigger did
    not declare."""

    def __init__(self, asset: str, declared: tuple[str, ...]) -> None:
        self.asset = asset
        self.declared = declared
        names = ", ".join(repr(name) for name in declared) or "none"
        super().__init__(f"asset {asset!r} is not declared here (declared: {names})")


class AmbiguousAssetError(StateStoreError, ValueError):
    """Raised when a method of the asset state store that needs one asset is called while
    several are declared: subscript it first (``store[asset]``)."""

    def __init__(self, method: str, declared: tuple[str, ...]) -> None:
        self.method = method
        self.declared = declared
        names = ", ".join(repr(name) for name in declared)
        super().__init__(
            f"{method}() on the asset state store needs exactly one asset, but "
            f"{len(declared)} are declared ({names}); subscript it first: "
            f"store[asset].{method}(...)"
        )


class ContextKeyError(StateStoreError, KeyError):
    """Raised when a task context has no such key; for an asset key, because the task
    declares no concrete asset."""

    def __init__(self, key: str, reason: str | None = None) -> None:
        self.key = key
        super().__init__(key if reason is None else f"context[{key!r}] {reason}")


class ReferenceTypeError(StateStoreError, TypeError):
    """Raised when a worker-side backend's offload hook returns a reference that is not a str."""

    def __init__(self, backend: object, key: str, ref: object) -> None:
        super().__init__(
            f"{type(backend).__name__} returned a {type(ref).__name__} reference for key "
            f"{key!r}; a worker-side backend must return a str"
        )


class HookNotImplementedError(StateStoreError, NotImplementedError):
    """Raised when a backend is asked for a hook it does not implement: a key/value hook on
    neither its sync nor its async side, or an offload hook of a backend configured as
    ``[workers] state_backend``."""

    def __init__(self, backend: object, hook: str, remedy: str) -> None:
        self.hook = hook
        super().__init__(f"{type(backend).__name__} does not implement {hook}; {remedy}")


class TokenExistsError(StateStoreError, ValueError):
    """Raised when an API token is created under the name of a token that is not revoked."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"a token named {name!r} already exists; revoke it first")
