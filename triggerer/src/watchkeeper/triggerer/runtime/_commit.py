"""Turning what a trigger yields into an :class:`EventCommit`, validating it on the way.

This sits on the per-event path, so it does the least work that still rejects everything the
store would reject: one type check, one JSON encoding of the payload (whose size check is one
``len()`` unless the payload is long), one encoding per state item, and one frozen dataclass. Nothing is written when validation fails, because the commit is
only built, never sent, until every part of the event passed.

A :class:`~watchkeeper.triggerer.TriggerEventBatch` becomes one
:class:`~watchkeeper.store.EventBatchCommit`: every event of it is checked the same way, and
its one state encoded once, before anything is sent, so a bad event fails the whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from watchkeeper.store.protocols import (
    EncodedState,
    EventBatchCommit,
    EventCommit,
    Writer,
    check_key,
    check_name,
    encode_payload,
    encode_value,
)

from ..errors import InvalidEventError
from ..trigger import TriggerEvent, TriggerEventBatch

__all__ = ["EventEncoder"]

_NO_STATE: Final[Mapping[str, str]] = MappingProxyType({})


class EventEncoder:
    """Builds the :class:`EventCommit` of each event one trigger yields.

    Everything that is the same for every event of the trigger (its id, the names of the
    watched assets, the writer, the size limits) is computed once, here.
    """

    __slots__ = (
        "assets",
        "max_payload_bytes",
        "max_value_bytes",
        "names_checked",
        "watcher",
        "writer",
    )

    def __init__(
        self,
        watcher: str,
        assets: tuple[str, ...],
        *,
        writer: Writer | None,
        max_value_bytes: int | None,
        max_payload_bytes: int | None,
    ) -> None:
        self.watcher = watcher
        self.assets = assets
        self.writer = writer
        self.max_value_bytes = max_value_bytes
        self.max_payload_bytes = max_payload_bytes
        # Checked once: then each event's commit is built without checking them again. If
        # one breaks the rule, every commit goes through EventCommit's own checks, which
        # raise its error for the first event, as they would without this shortcut.
        self.names_checked = _names_keep_rule(watcher, assets)

    def __repr__(self) -> str:
        return f"<EventEncoder watcher={self.watcher!r} assets={list(self.assets)!r}>"

    def build(self, item: object) -> EventCommit | EventBatchCommit:
        """Validate one yielded item and return its commit.

        Raises :class:`InvalidEventError` when ``item`` is neither a :class:`TriggerEvent` nor
        a :class:`TriggerEventBatch` (or its ``state``/``dedup_key`` has the wrong shape), and
        the store's own errors (``ValueTypeError``, ``InvalidValueError``,
        ``PayloadTooLargeError``, ``ValueTooLargeError``, ``KeyTypeError``, ``InvalidKeyError``)
        when the payload or a state item is not storable.
        """
        if not isinstance(item, TriggerEvent):
            if isinstance(item, TriggerEventBatch):
                return self.build_batch(item)
            hint = (
                "; wrap a list of events in TriggerEventBatch(events, state=...)"
                if isinstance(item, list | tuple)
                else ""
            )
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded a {type(item).__name__}; run() must yield "
                f"TriggerEvent(payload, state=..., dedup_key=...) objects{hint}"
            )
        # The payload's one form from here to its row: its JSON text.
        payload_json = encode_payload(item.payload, max_payload_bytes=self.max_payload_bytes)
        state = item.state
        encoded = _NO_STATE if state is None else self._state(state)
        dedup_key = item.dedup_key
        if dedup_key is not None:
            if not isinstance(dedup_key, str) or not dedup_key:
                raise InvalidEventError(
                    f"trigger {self.watcher!r} yielded an event whose dedup_key is "
                    f"{dedup_key!r}; it must be a non-empty str or None"
                )
            check_name(dedup_key, what="dedup key")
        if self.names_checked:
            # Every name and key is checked by now (the state keys in _state).
            return EventCommit.from_checked(
                self.watcher,
                self.assets,
                payload_json,
                dedup_key,
                encoded,
                self.writer,
            )
        return EventCommit(self.watcher, self.assets, payload_json, dedup_key, encoded, self.writer)

    def build_batch(self, batch: TriggerEventBatch) -> EventBatchCommit:
        """Validate every event of ``batch`` and its state; return the batch's commit.

        Raises what :meth:`build` raises, with a note naming the event's index, and
        :class:`InvalidEventError` for an empty batch or an event carrying its own ``state``.
        """
        events = batch.events
        if not events:
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded an empty TriggerEventBatch; a batch needs "
                "at least one event (its state commits only with one)"
            )
        limit = self.max_payload_bytes
        pairs: list[tuple[str, str | None]] = []
        encode = encode_payload
        try:
            for event in events:
                # The common event (a TriggerEvent, no state, no dedup key) inline; any other
                # through _batched, which checks and refuses.
                if type(event) is TriggerEvent and event.state is None and event.dedup_key is None:
                    pairs.append((encode(event.payload, max_payload_bytes=limit), None))
                else:
                    pairs.append(self._batched(event, limit))
        except Exception as exc:
            index = len(pairs)  # the event being checked
            exc.add_note(f"raised for event {index} of a TriggerEventBatch of {len(events)}")
            raise
        state = batch.state
        encoded = _NO_STATE if state is None else self._state(state)
        return EventBatchCommit(self.watcher, self.assets, tuple(pairs), encoded, self.writer)

    def _batched(self, event: object, limit: int | None) -> tuple[str, str | None]:
        """``(payload_json, dedup_key)`` of one event of a batch."""
        if not isinstance(event, TriggerEvent):
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded a TriggerEventBatch holding a "
                f"{type(event).__name__}; a batch holds TriggerEvent objects"
            )
        if event.state:
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded a TriggerEventBatch whose event has a state "
                "of its own; a batch has one state, the one after its last event: "
                "TriggerEventBatch(events, state=...)"
            )
        dedup_key = event.dedup_key
        if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key):
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded an event whose dedup_key is "
                f"{dedup_key!r}; it must be a non-empty str or None"
            )
        return encode_payload(event.payload, max_payload_bytes=limit), dedup_key

    def _state(self, state: object) -> Mapping[str, str]:
        """The encoded items of an event's (or a batch's) ``state``."""
        if type(state) is not dict and not isinstance(state, Mapping):  # dict: no ABC check
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded an event whose state is a "
                f"{type(state).__name__}; state must be a mapping of str keys to JSON values"
            )
        if not state:
            return _NO_STATE
        limit = self.max_value_bytes
        encoded = EncodedState()  # encoded here by the store's rules: not checked again
        for key, value in state.items():  # a loop: no comprehension frame per event
            encoded[check_key(key)] = encode_value(key, value, max_value_bytes=limit)
        return encoded


def _names_keep_rule(watcher: str, assets: tuple[str, ...]) -> bool:
    """Whether the watcher and asset names keep the store's naming rule (and ``assets`` is a
    tuple, as a commit holds it)."""
    if type(assets) is not tuple:
        return False
    try:
        check_name(watcher, what="watcher name")
        for asset in assets:
            check_name(asset, what="asset name")
    except Exception:  # noqa: BLE001 - EventCommit's own checks raise it, per event
        return False
    return True
