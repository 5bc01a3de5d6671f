"""The authoring API: triggers, the events they yield, and the watchers that attach them."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from watchkeeper.store import AssetStateStoreAccessors
from watchkeeper.store.protocols import redact_secrets

from .errors import AssetStoreUnavailableError, WatcherNameUnavailableError

__all__ = [
    "AssetWatcher",
    "BaseEventTrigger",
    "BaseTrigger",
    "TriggerEvent",
    "TriggerEventBatch",
]


class TriggerEvent:
    """What a trigger yields: a JSON ``payload``, and optionally the ``state`` it advances.

    ``state={key: value}`` is written to the watched assets' state in the same transaction as
    the event, so a watermark never moves without its event and no event commits without its
    watermark. ``dedup_key`` makes a redelivered source item produce no second event (and no
    state write). Both are optional; the runtime validates them when the event is yielded.

    :param payload: the event's payload: any JSON value within ``[events] max_payload_bytes``.
    :param state: state keys and JSON values written with the event, atomically.
    :param dedup_key: the source item's identity; an event whose key the asset already
        recorded commits nothing.
    """

    __slots__ = ("dedup_key", "payload", "state")

    def __init__(
        self,
        payload: Any,
        *,
        state: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
    ) -> None:
        self.payload = payload
        self.state = state
        self.dedup_key = dedup_key

    def __repr__(self) -> str:
        extra = ""
        if self.state:
            extra += f", state={self.state!r}"
        if self.dedup_key is not None:
            extra += f", dedup_key={self.dedup_key!r}"
        return f"TriggerEvent({self.payload!r}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TriggerEvent):
            return NotImplemented
        return (self.payload, self.state, self.dedup_key) == (
            other.payload,
            other.state,
            other.dedup_key,
        )

    __hash__ = None  # type: ignore[assignment]


class TriggerEventBatch:
    """What a trigger yields to commit several events and one ``state`` in one transaction.

    ``events`` are :class:`TriggerEvent` objects without a ``state`` of their own; ``state`` is
    the state after the last of them. The batch is atomic: all of its events and its state
    commit, or nothing does (an event that cannot be stored fails the whole batch). Each event
    still becomes its own asset event on each watched asset, and keeps its own ``dedup_key``: a
    redelivered event is suppressed alone, and ``state`` is written to each asset where at least
    one event of the batch was, so a batch redelivered in full writes nothing (as a suppressed
    single event does). The generator is resumed once the whole batch has committed.

    :param events: the events, in order (none of them with a ``state``).
    :param state: the state after the last event, written with the batch.
    """

    __slots__ = ("events", "state")

    def __init__(
        self, events: Iterable[TriggerEvent], *, state: Mapping[str, Any] | None = None
    ) -> None:
        self.events = list(events)
        self.state = state

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        extra = f", state={self.state!r}" if self.state else ""
        return f"TriggerEventBatch(<{len(self.events)} events>{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TriggerEventBatch):
            return NotImplemented
        return (self.events, self.state) == (other.events, other.state)

    __hash__ = None  # type: ignore[assignment]


class BaseTrigger(abc.ABC):
    """A unit of asynchronous waiting that yields :class:`TriggerEvent` objects (or batches of
    them, :class:`TriggerEventBatch`).

    Subclasses implement :meth:`run` as an async generator and :meth:`serialize`, which returns
    ``(classpath, kwargs)`` with JSON kwargs so that a daemon can rebuild the trigger as
    ``cls(**kwargs)``. :meth:`cleanup` is always awaited after ``run()`` ends, however it ends.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()

    @classmethod
    def classpath(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    @abc.abstractmethod
    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return ``(classpath, kwargs)``; kwargs must be JSON."""

    @abc.abstractmethod
    def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        """Yield events (or batches); an ``async def`` with ``yield``. Must never block the loop."""

    async def cleanup(self) -> None:  # noqa: B027 - optional hook, empty by design
        """Release what ``run()`` held; called after every run, with a timeout."""

    def __repr__(self) -> str:
        classpath, kwargs = self.serialize()
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return redact_secrets(f"<{classpath}({args})>")  # kwargs may hold a URL's password


class BaseEventTrigger(BaseTrigger):
    """A trigger that may watch assets; inside ``run()`` it reaches their state.

    ``self.asset_state_store`` (alias ``self.asset_store``) is bound by the runtime to the
    watched asset(s) right before ``run()``. With one asset, call ``get``/``set``/``aget``/...
    on it directly; with several, subscript it with the asset or iterate over it.

    ``self.watcher_name`` is bound at the same moment: the name of the :class:`AssetWatcher`
    this trigger runs as (the daemon runs one trigger per watcher name). Prefix your state keys
    with it (``f"{self.watcher_name}.watermark"``) so two watchers of one asset never share a
    key.
    """

    _wk_accessors: AssetStateStoreAccessors | None = None
    _wk_watcher_name: str | None = None
    _wk_source_status: Callable[[str | None], None] | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Set here, not first at bind time, so that every instance of a class has the same
        # attribute layout (CPython then shares one key table among them).
        self._wk_accessors = None
        self._wk_watcher_name = None
        self._wk_source_status = None

    @property
    def asset_state_store(self) -> AssetStateStoreAccessors:
        accessors = self._wk_accessors
        if accessors is None:
            raise AssetStoreUnavailableError(self)
        return accessors

    @property
    def asset_store(self) -> AssetStateStoreAccessors:
        return self.asset_state_store

    def bind_asset_state_store(self, accessors: AssetStateStoreAccessors | None) -> None:
        """Used by the runtime (and the test kit) to bind or unbind the accessors."""
        self._wk_accessors = accessors

    @property
    def watcher_name(self) -> str:
        name = self._wk_watcher_name
        if name is None:
            raise WatcherNameUnavailableError(self)
        return name

    def bind_watcher_name(self, name: str | None) -> None:
        """Used by the runtime (and the test kit) to bind or unbind the watcher's name."""
        self._wk_watcher_name = name

    def report_source(self, trouble: str | None) -> None:
        """Say, from inside ``run()`` (on the event loop), that the source cannot be reached.

        ``trouble`` is why (the source's address in it, its secrets masked here too): the
        watcher's status turns ``backing_off`` with it as ``last_error`` while ``run()`` retries
        or reconnects by itself. ``None`` says the source answers again: the status returns to
        ``running``. Outside a runtime (no one bound) this does nothing.
        """
        hook = self._wk_source_status
        if hook is not None:
            hook(None if trouble is None else redact_secrets(trouble))

    def bind_source_status(self, hook: Callable[[str | None], None] | None) -> None:
        """Used by the runtime to bind or unbind what :meth:`report_source` calls."""
        self._wk_source_status = hook


@dataclass(frozen=True, slots=True)
class AssetWatcher:
    """Attaches ``trigger`` to the asset(s) whose ``watchers=`` list it appears in.

    :param name: the watcher's name: unique among the definitions, the namespace of its
        state keys and the ``watcher`` of its events.
    :param trigger: the :class:`BaseEventTrigger` instance that watches the source.
    :raises TypeError: a trigger that is not a :class:`BaseEventTrigger`.
    :raises ValueError: an empty name.
    """

    name: str
    trigger: BaseEventTrigger

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("AssetWatcher needs a non-empty name")
        if not isinstance(self.trigger, BaseEventTrigger):
            raise TypeError(
                f"AssetWatcher {self.name!r}: trigger must be a BaseEventTrigger, "
                f"got {type(self.trigger).__name__}"
            )
