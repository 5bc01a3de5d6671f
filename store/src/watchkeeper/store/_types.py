"""The plain data types of the store: scopes, assets, entries, statuses; the event records
(commits, writers, fences, events) are :mod:`._events`'s, named here too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self

from ._events import AssetEvent, EventBatchCommit, EventCommit, Fence, Writer
from ._values import (
    MAX_BIGINT,
    MAX_MAP_INDEX,
    MAX_SCOPE_ID_BYTES,
    check_bigint,
    check_name,
)
from .errors import InvalidArgumentError

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


@dataclass(slots=True)
class GcReport:
    """What a garbage-collection pass deleted (or, with ``dry_run``, would delete): the state
    rows are listed (task scope or asset name, and key); ``events`` is the number of asset
    events past their retention (there may be millions, so they are counted, not listed);
    ``logs`` the number of log chunks of the runs that finished before the events' cutoff."""

    dry_run: bool
    expired: list[tuple[TaskScope, str]] = field(default_factory=list)
    retention: list[tuple[TaskScope, str]] = field(default_factory=list)
    orphaned: list[tuple[str, str]] = field(default_factory=list)
    events: int = 0
    logs: int = 0

    @property
    def total(self) -> int:
        rows = len(self.expired) + len(self.retention) + len(self.orphaned)
        return rows + self.events + self.logs


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
