"""Turning what a trigger yields into an :class:`EventCommit`, validating it on the way.

This sits on the per-event path, so it does the least work that still rejects everything the
store would reject: one type check, one JSON encoding of the payload (whose size check is one
``len()`` unless the payload is long), one encoding per state item, and one frozen dataclass. Nothing is written when validation fails, because the commit is
only built, never sent, until every part of the event passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from watchkeeper.store.backend import EventCommit, Writer, check_key, encode_payload, encode_value

from .errors import InvalidEventError
from .trigger import TriggerEvent

__all__ = ["EventEncoder"]

_NO_STATE: Final[Mapping[str, str]] = MappingProxyType({})


class EventEncoder:
    """Builds the :class:`EventCommit` of each event one trigger yields.

    Everything that is the same for every event of the trigger (its id, the names of the
    watched assets, the writer, the size limits) is computed once, here.
    """

    __slots__ = ("assets", "max_payload_bytes", "max_value_bytes", "watcher", "writer")

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

    def __repr__(self) -> str:
        return f"<EventEncoder watcher={self.watcher!r} assets={list(self.assets)!r}>"

    def build(self, item: object) -> EventCommit:
        """Validate one yielded item and return its commit.

        Raises :class:`InvalidEventError` when ``item`` is not a :class:`TriggerEvent` (or its
        ``state``/``dedup_key`` has the wrong shape), and the store's own errors
        (``ValueTypeError``, ``InvalidValueError``, ``PayloadTooLargeError``,
        ``ValueTooLargeError``, ``KeyTypeError``, ``InvalidKeyError``) when the payload or a
        state item is not storable.
        """
        if not isinstance(item, TriggerEvent):
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded a {type(item).__name__}; run() must yield "
                "TriggerEvent(payload, state=..., dedup_key=...) objects"
            )
        payload_json = encode_payload(item.payload, max_payload_bytes=self.max_payload_bytes)
        state = item.state
        encoded: Mapping[str, str]
        if state is None:
            encoded = _NO_STATE
        elif isinstance(state, Mapping):
            if state:
                limit = self.max_value_bytes
                encoded = {
                    check_key(key): encode_value(key, value, max_value_bytes=limit)
                    for key, value in state.items()
                }
            else:
                encoded = _NO_STATE
        else:
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded an event whose state is a "
                f"{type(state).__name__}; state must be a mapping of str keys to JSON values"
            )
        dedup_key = item.dedup_key
        if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key):
            raise InvalidEventError(
                f"trigger {self.watcher!r} yielded an event whose dedup_key is "
                f"{dedup_key!r}; it must be a non-empty str or None"
            )
        return EventCommit(self.watcher, self.assets, payload_json, dedup_key, encoded, self.writer)
