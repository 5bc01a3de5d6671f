"""The records of an event's way from the trigger to the log: the commit (one event, or a
batch with one state), the writer and the lease it carries, and the committed event.

An event keeps one form on that way, its payload's JSON text: the commit carries it, the
drivers write it as it is, and :class:`AssetEvent` decodes it when its payload is first read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, Final, Literal

from ._slots import slot_setters
from ._values import check_key, check_name, decode_value
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["AssetEvent", "EventBatchCommit", "EventCommit", "Fence", "Writer"]


@dataclass(frozen=True, slots=True)
class Fence:
    """The lease a write depends on: the trigger, the daemon that holds it, and its token.

    A fenced write (an :class:`EventCommit`, or a ``set`` by a :class:`Writer` that carries a
    fence) is stored only if, inside the same transaction, the lease of ``trigger_id`` is still
    held by ``owner`` with ``token`` and has not expired; otherwise nothing is written and the
    backend raises :class:`~watchkeeper.store.errors.LeaseLostError`.
    """

    trigger_id: str
    owner: str
    token: int

    def __post_init__(self) -> None:
        for name in ("trigger_id", "owner"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"Fence.{name}", value, "must be a non-empty str")
        if type(self.token) is not int:
            raise ArgumentTypeError("Fence.token", self.token, "an int")
        if self.token < 1:
            raise InvalidArgumentError("Fence.token", self.token, "must be >= 1")


@dataclass(frozen=True, slots=True)
class Writer:
    """Who wrote a row: a task instance try, a watcher, the CLI or the API.

    ``fence`` (not stored, not compared) makes the writer's ``set`` calls conditional on a
    trigger lease: the runtime gives each watcher's accessors such a writer.
    """

    kind: Literal["task", "watcher", "cli", "api"]
    name: str
    try_number: int | None = None
    fence: Fence | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        if self.try_number is not None:
            return f"{self.kind}:{self.name}#try{self.try_number}"
        return f"{self.kind}:{self.name}"


class AssetEvent:
    """A committed asset event; ``id`` increases in commit order.

    An event keeps one form of its payload: the JSON text it was committed as, until
    ``payload`` is first read, which decodes it (once). A commit's events therefore cost no
    decoding unless their payloads are read. Built with the payload itself
    (``AssetEvent(id, asset, watcher, payload, dedup_key, created_at)``) or from its text
    (:meth:`from_json`). Immutable; equal when every field (the payload decoded) is.
    """

    __slots__ = ("_payload", "_text", "asset", "created_at", "dedup_key", "id", "watcher")

    id: int
    asset: str
    watcher: str
    dedup_key: str | None
    created_at: datetime
    _payload: Any
    _text: str | None

    def __init__(
        self,
        id: int,
        asset: str,
        watcher: str,
        payload: Any,
        dedup_key: str | None,
        created_at: datetime,
    ) -> None:
        _EV_ID(self, id)
        _EV_ASSET(self, asset)
        _EV_WATCHER(self, watcher)
        _EV_PAYLOAD(self, payload)
        _EV_TEXT(self, None)
        _EV_KEY(self, dedup_key)
        _EV_CREATED(self, created_at)

    @classmethod
    def from_json(
        cls,
        id: int,
        asset: str,
        watcher: str,
        payload_json: str,
        dedup_key: str | None,
        created_at: datetime,
    ) -> AssetEvent:
        """The event whose payload is the JSON text ``payload_json`` (decoded when read)."""
        event = _NEW(cls)
        _EV_ID(event, id)
        _EV_ASSET(event, asset)
        _EV_WATCHER(event, watcher)
        _EV_TEXT(event, payload_json)
        _EV_KEY(event, dedup_key)
        _EV_CREATED(event, created_at)
        return event

    @property
    def payload(self) -> Any:
        """The payload, decoded from its JSON text on the first read."""
        text = self._text
        if text is None:
            return self._payload
        payload = decode_value(text)
        _EV_PAYLOAD(self, payload)
        _EV_TEXT(self, None)
        return payload

    def _fields(self) -> tuple[Any, ...]:
        return (self.id, self.asset, self.watcher, self.payload, self.dedup_key, self.created_at)

    def __eq__(self, other: object) -> bool:
        if type(other) is not AssetEvent:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"AssetEvent(id={self.id!r}, asset={self.asset!r}, watcher={self.watcher!r}, "
            f"payload={self.payload!r}, dedup_key={self.dedup_key!r}, "
            f"created_at={self.created_at!r})"
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"AssetEvent is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"AssetEvent is immutable: cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (AssetEvent, self._fields())

    def to_json(self) -> str:
        """:meth:`to_record` as compact JSON text, the payload's own text put in as it was
        committed (a payload not read yet is never decoded)."""
        text = self._text
        if text is None:
            text = _RECORD_ENCODE(self._payload)
        key = self.dedup_key
        return (
            f'{{"id":{int(self.id)},"asset":{_QUOTE(self.asset)},'
            f'"watcher":{_QUOTE(self.watcher)},"payload":{text},'
            f'"dedup_key":{"null" if key is None else _QUOTE(key)},"created_at":"'
            f'{self.created_at.astimezone(UTC).isoformat(timespec="microseconds")}"}}'
        )

    def to_record(self) -> dict[str, Any]:
        """The event as ``events --json`` prints it and the API serves it (:meth:`to_json`
        is the same as text); ``created_at`` in UTC with six digits of microseconds."""
        return {
            "id": self.id,
            "asset": self.asset,
            "watcher": self.watcher,
            "payload": self.payload,
            "dedup_key": self.dedup_key,
            "created_at": self.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
        }


_QUOTE: Final = encode_basestring
_RECORD_ENCODE: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_NEW: Final = object.__new__
_EV_ID, _EV_ASSET, _EV_WATCHER, _EV_PAYLOAD, _EV_TEXT, _EV_KEY, _EV_CREATED = (
    AssetEvent.__dict__[name].__set__
    for name in ("id", "asset", "watcher", "_payload", "_text", "dedup_key", "created_at")
)


@dataclass(frozen=True, slots=True)
class EventCommit:
    """One trigger event to commit atomically, with the state it carries.

    For each asset: if ``dedup_key`` is already recorded for that asset nothing is written for
    it (neither event nor state); otherwise one event is inserted and every ``state`` item is
    upserted into the asset's state, in the same transaction. ``payload_json`` and the ``state``
    values are JSON text already validated by :mod:`._values`.

    ``fence`` (by default the writer's) makes the whole commit conditional on a trigger lease
    (:class:`Fence`); a refused commit writes nothing. The names, the dedup key and the state
    keys are checked against the naming rule when the commit is built (:class:`InvalidNameError`,
    :class:`InvalidKeyError`), so every backend refuses the same commits, before any I/O.

    ``payload_json`` is the event's one form from here to its row: the store writes the text
    as it is and never decodes it; the events returned decode it if their payload is read.
    """

    watcher: str
    assets: tuple[str, ...]
    payload_json: str
    dedup_key: str | None = None
    state: Mapping[str, str] = field(default_factory=dict)
    writer: Writer | None = None
    fence: Fence | None = None

    def __post_init__(self) -> None:
        check_name(self.watcher, what="watcher name")
        for asset in self.assets:
            check_name(asset, what="asset name")
        if self.dedup_key is not None:
            check_name(self.dedup_key, what="dedup key")
        for key in self.state:
            check_key(key)
        if self.fence is None and self.writer is not None and self.writer.fence is not None:
            object.__setattr__(self, "fence", self.writer.fence)

    @classmethod
    def from_checked(
        cls,
        watcher: str,
        assets: tuple[str, ...],
        payload_json: str,
        dedup_key: str | None,
        state: Mapping[str, str],
        writer: Writer | None,
    ) -> EventCommit:
        """The commit, without ``__init__``'s name checks: for a caller that checked every name
        and key itself (the triggerer: the names once per trigger). The fence is the writer's."""
        commit = object.__new__(cls)
        put = _COMMIT_SETTERS  # in field order
        put[0](commit, watcher)
        put[1](commit, assets)
        put[2](commit, payload_json)
        put[3](commit, dedup_key)
        put[4](commit, state)
        put[5](commit, writer)
        put[6](commit, None if writer is None else writer.fence)
        return commit


_COMMIT_SETTERS: Final = slot_setters(EventCommit)


@dataclass(frozen=True, slots=True)
class EventBatchCommit:
    """Several trigger events and one state, to commit atomically (all or nothing).

    ``events`` holds one ``(payload_json, dedup_key)`` pair per event, in order; ``state`` is
    the state after the last of them. For each asset, an event whose ``dedup_key`` is already
    recorded there (or taken by an earlier event of the batch) is suppressed on its own; the
    others are inserted in order, and ``state`` is upserted into the asset's state once, if at
    least one event of the batch was inserted there. So a batch redelivered in full writes
    nothing, as a suppressed :class:`EventCommit` does, and a state never commits without an
    event of its batch.

    ``fence`` (by default the writer's) guards the whole batch: see :class:`Fence`. A refused
    batch, or one naming an unknown asset, writes nothing. Each payload is JSON text, written
    as it is (see :class:`EventCommit`).
    """

    watcher: str
    assets: tuple[str, ...]
    events: tuple[tuple[str, str | None], ...]
    state: Mapping[str, str] = field(default_factory=dict)
    writer: Writer | None = None
    fence: Fence | None = None

    def __post_init__(self) -> None:
        events = self.events
        if type(events) is not tuple:
            events = tuple(events)
            object.__setattr__(self, "events", events)
        if not events:
            raise InvalidArgumentError(
                "EventBatchCommit.events", events, "a batch needs at least one event", show=False
            )
        for index, event in enumerate(events):
            # Checked here, once: a malformed pair would otherwise fail half-way in a driver.
            if (
                type(event) is not tuple
                or len(event) != 2
                or type(event[0]) is not str
                or (event[1] is not None and type(event[1]) is not str)
            ):
                raise ArgumentTypeError(
                    f"EventBatchCommit.events[{index}]",
                    event,
                    "a (payload_json: str, dedup_key: str | None) tuple",
                )
        if self.fence is None and self.writer is not None and self.writer.fence is not None:
            object.__setattr__(self, "fence", self.writer.fence)
