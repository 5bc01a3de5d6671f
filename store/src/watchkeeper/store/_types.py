"""The plain data types of the store: scopes, assets, entries, events, writers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, Final, Literal, Self

from ._slots import slot_setters
from ._values import (
    MAX_BIGINT,
    MAX_MAP_INDEX,
    MAX_SCOPE_ID_BYTES,
    check_bigint,
    check_key,
    check_name,
    decode_value,
)
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "Asset",
    "AssetEvent",
    "AssetInfo",
    "AssetScope",
    "DaemonStatus",
    "EventBatchCommit",
    "EventCommit",
    "Fence",
    "GcReport",
    "Lease",
    "NodeHeartbeat",
    "NodeLease",
    "Put",
    "RawEntry",
    "RefusedDefinition",
    "StateEntry",
    "StateScope",
    "TaskScope",
    "TriggerStatus",
    "Writer",
]


@dataclass(frozen=True, slots=True)
class TaskScope:
    """One task instance: the namespace of task state. Retries of a run share it.

    ``dag_id``, ``run_id`` and ``task_id`` follow the naming rule (non-empty UTF-8, no control
    characters) with a limit of ``MAX_SCOPE_ID_BYTES`` each; ``map_index`` is -1 (not mapped)
    or an index up to ``MAX_MAP_INDEX``. Anything else is refused here, the same for every
    backend: :class:`InvalidNameError`/:class:`InvalidArgumentError` (``ValueError``) or
    :class:`KeyTypeError`/:class:`ArgumentTypeError` (``TypeError``).
    """

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    def __post_init__(self) -> None:
        check_name(self.dag_id, what="dag_id", max_bytes=MAX_SCOPE_ID_BYTES)
        check_name(self.run_id, what="run_id", max_bytes=MAX_SCOPE_ID_BYTES)
        check_name(self.task_id, what="task_id", max_bytes=MAX_SCOPE_ID_BYTES)
        check_bigint(self.map_index, what="map_index", minimum=-1, maximum=MAX_MAP_INDEX)

    @classmethod
    def _from_row(cls, dag_id: str, run_id: str, task_id: str, map_index: int) -> Self:
        """A scope read back from a database row: not validated again (rows written before a
        rule was tightened must still be reported, by garbage collection for one)."""
        scope = object.__new__(cls)
        for name, value in zip(cls.__slots__, (dag_id, run_id, task_id, map_index), strict=True):
            object.__setattr__(scope, name, value)
        return scope

    def __str__(self) -> str:
        return f"{self.dag_id}/{self.run_id}/{self.task_id}[{self.map_index}]"


@dataclass(frozen=True, slots=True)
class AssetScope:
    """One asset: the namespace of asset state. At least one field must be set.

    Workers address an asset by ``name`` or ``uri``; server-side callers may use ``asset_id``.
    A name or URI that breaks the naming rule cannot be registered, so it is refused here
    (:class:`InvalidNameError`) rather than looked up.
    """

    name: str | None = None
    uri: str | None = None
    asset_id: int | None = None

    def __post_init__(self) -> None:
        if self.name is None and self.uri is None and self.asset_id is None:
            raise InvalidArgumentError(
                "AssetScope", None, "needs at least one of name, uri or asset_id", show=False
            )
        if self.name is not None:
            check_name(self.name, what="asset name")
        if self.uri is not None:
            check_name(self.uri, what="asset URI")
        if self.asset_id is not None:
            check_bigint(self.asset_id, what="asset_id", minimum=1, maximum=MAX_BIGINT)

    def __str__(self) -> str:
        if self.name is not None:
            return self.name
        if self.uri is not None:
            return self.uri
        return f"asset#{self.asset_id}"


StateScope = TaskScope | AssetScope


@dataclass(frozen=True, slots=True)
class Asset:
    """A named piece of data, identified by ``name`` (or by ``uri`` when both sides have one):
    ``Asset(uri=...)`` alone takes the URI as its name. ``watchers`` holds the
    :class:`~watchkeeper.triggerer.AssetWatcher` objects that watch it; the store ignores them."""

    name: str = ""
    uri: str | None = None
    watchers: Sequence[Any] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            if not self.uri:
                raise InvalidArgumentError("Asset", self.name, "needs a name or a uri", show=False)
            object.__setattr__(self, "name", self.uri)
        check_name(self.name, what="asset name")
        if self.uri is not None:
            check_name(self.uri, what="asset URI")
        object.__setattr__(self, "watchers", tuple(self.watchers))

    def matches(self, other: Asset) -> bool:
        """True when the names are equal, or when both have a URI and the URIs are equal."""
        if self.name == other.name:
            return True
        return self.uri is not None and other.uri is not None and self.uri == other.uri

    @property
    def scope(self) -> AssetScope:
        return AssetScope(name=self.name)


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
class Lease:
    """A trigger's lease row: who holds it (``None`` once released), its token and expiry.

    ``token`` (the trigger's epoch) grows by one each time the lease passes to another
    holder, so a write fenced with an older token is recognisably stale. A trigger lease has
    no time to live of its own: it lasts as long as its holder's node lease (see
    :class:`NodeLease`), and ``expires_at`` is that node lease's expiry (``None`` when the
    lease is released or its holder's node lease was reaped).
    """

    trigger_id: str
    owner: str | None
    token: int
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class NodeLease:
    """One daemon's node lease: renewed every second or so, it keeps every trigger lease the
    daemon holds alive. ``alive`` turns False when another daemon reaps it after
    ``expires_at`` (on the database's clock); ``held`` counts the trigger leases it holds."""

    owner: str
    alive: bool
    expires_at: datetime
    held: int


@dataclass(frozen=True, slots=True)
class NodeHeartbeat:
    """What renewing a node lease found: ``renewed`` is False when the node lease had to be
    created afresh (the first time, or after another daemon reaped it: every trigger lease
    the node held before is then gone); ``nodes`` lists every node lease after the renewal
    and the reaping of expired ones (``reaped`` names those), ``now`` is the store's clock."""

    renewed: bool
    nodes: tuple[NodeLease, ...]
    reaped: tuple[str, ...]
    now: datetime

    def live(self) -> list[NodeLease]:
        """The node leases alive and not expired at ``now``, by owner."""
        return [n for n in self.nodes if n.alive and n.expires_at > self.now]


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


@dataclass(frozen=True, slots=True)
class Put:
    """One write of a key, checked and encoded: what a backend's put hook receives.

    ``value_json`` is the value as JSON text; ``expires_at``/``never_expire`` the task-state
    retention (asset state has none); ``expected_version`` makes it a compare-and-set (0: the
    key must not exist yet); a ``writer`` carrying a fence makes it conditional on the lease.
    """

    scope: StateScope
    key: str
    value_json: str
    expires_at: datetime | None = None
    never_expire: bool = False
    expected_version: int | None = None
    writer: Writer | None = None


@dataclass(frozen=True, slots=True)
class RawEntry:
    """A stored row as a backend returns it: the value still JSON text."""

    key: str
    value_json: str
    version: int
    updated_at: datetime
    writer: Writer | None
    expires_at: datetime | None = None
    never_expire: bool = False


@dataclass(frozen=True, slots=True)
class StateEntry:
    """A stored value with its metadata: ``version`` increases by one with every write."""

    key: str
    value: Any
    version: int
    updated_at: datetime
    writer: Writer | None
    expires_at: datetime | None = None
    never_expire: bool = False


@dataclass(frozen=True, slots=True)
class AssetInfo:
    """A registered asset."""

    asset_id: int
    name: str
    uri: str | None
    active: bool
    updated_at: datetime


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


@dataclass(slots=True)
class GcReport:
    """What a garbage-collection pass deleted (or, with ``dry_run``, would delete): the state
    rows are listed (task scope or asset name, and key); ``events`` is the number of asset
    events past their retention (there may be millions, so they are counted, not listed)."""

    dry_run: bool
    expired: list[tuple[TaskScope, str]] = field(default_factory=list)
    retention: list[tuple[TaskScope, str]] = field(default_factory=list)
    orphaned: list[tuple[str, str]] = field(default_factory=list)
    events: int = 0

    @property
    def total(self) -> int:
        return len(self.expired) + len(self.retention) + len(self.orphaned) + self.events


@dataclass(frozen=True, slots=True)
class TriggerStatus:
    """What the daemon reports about one running trigger (``watchkeeper status`` reads it);
    ``state`` is one of ``running``, ``backing_off``, ``failed``, ``stopped``."""

    trigger_id: str
    classpath: str
    assets: tuple[str, ...]
    watchers: tuple[str, ...]
    state: str
    failures: int = 0
    last_error: str | None = None
    last_event_at: datetime | None = None
    events: int = 0
    updated_at: datetime | None = None
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class RefusedDefinition:
    """A watcher file (``watcher`` None) or one of its watchers that a daemon refused, and why."""

    file: str
    watcher: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """One daemon's heartbeat row (``watchkeeper status``): stale, its leases lapsed, once
    ``heartbeat_at`` is ``lease_ttl`` seconds old. ``refused``: what its last load refused;
    ``settings``: its own timings in seconds (``heartbeat_interval``, node ``lease_ttl``...)."""

    owner: str
    started_at: datetime
    heartbeat_at: datetime
    lease_ttl: float
    watchers_path: str
    refused: tuple[RefusedDefinition, ...] = ()
    settings: Mapping[str, float] = field(default_factory=dict)
