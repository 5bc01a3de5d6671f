"""The writes :class:`~watchkeeper.store.PostgresStateBackend` queues: each a piece of data the
group-commit writer applies in a batch (:mod:`.batch`), never code of its own but for
:class:`CallOp`.

Every write is an :class:`Op` with the phase of the batch it runs in: asset registrations
first, then event commits (:class:`EventsOp`: a single event is a batch of one), compare-and-
sets, upserts, deletes, clears, and the rest (status rows, garbage collection). A worker's
usual step is an op too (:class:`~.steps.StepOp`), run after the batch's transaction.

Ops that can fail for a reason of their own (an asset that is not registered, a lease the
daemon no longer holds, a version that does not match) are checked inside the transaction
before they write, so a failure touches nothing and records its error on that op alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring as _quote
from typing import TYPE_CHECKING, Any, Final

from .._commit_queue import WRITE_OVERHEAD, QueuedWrite
from .._types import (
    AssetScope,
    EventBatchCommit,
    EventCommit,
    Fence,
    Put,
    StateScope,
    TaskScope,
    Writer,
)
from ..errors import AssetNotFoundError
from .sql import writer_fields

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "CAS",
    "CATALOG",
    "CLEAR",
    "DELETE",
    "EVENTS",
    "LATE",
    "PUT",
    "CallOp",
    "ClearOp",
    "DeleteOp",
    "EventsOp",
    "Op",
    "PutOp",
    "at_sql",
    "epoch_us",
]


CATALOG: Final = 0  # asset registration: first, so the scopes resolve against it
EVENTS: Final = 1
CAS: Final = 2
PUT: Final = 3
DELETE: Final = 4
CLEAR: Final = 5
LATE: Final = 6  # trigger status, garbage collection


class Op(QueuedWrite):
    """One write waiting for the writer, with the phase of the batch it runs in."""

    __slots__ = ("phase",)

    def __init__(self, phase: int) -> None:
        super().__init__()
        self.phase = phase

    def resolve(self, ids: dict[AssetScope, int | None]) -> None:
        """Take the asset ids of the scopes :meth:`scopes` named (or record a missing one)."""

    def scopes(self) -> Sequence[AssetScope]:
        return ()

    def fence_at(self) -> tuple[Fence, datetime] | None:
        """The lease this write depends on, and the write's timestamp to check it at."""
        return None


class _ScopedOp(Op):
    """An op on one state scope; an asset scope is resolved to ``asset_id`` in the batch.

    ``writer`` wrote it; when it carries a fence, the op is checked against the lease at
    ``at`` inside the batch's transaction, before anything is written.
    """

    __slots__ = ("asset_id", "at", "scope", "writer")

    def __init__(self, scope: StateScope, phase: int, writer: Writer | None, at: datetime) -> None:
        super().__init__(phase)
        self.scope = scope
        self.writer = writer
        self.at = at
        self.asset_id: int | None = None

    def fence_at(self) -> tuple[Fence, datetime] | None:
        fence = None if self.writer is None else self.writer.fence
        return None if fence is None else (fence, self.at)

    def scopes(self) -> Sequence[AssetScope]:
        return (self.scope,) if isinstance(self.scope, AssetScope) else ()

    def resolve(self, ids: dict[AssetScope, int | None]) -> None:
        if isinstance(self.scope, AssetScope):
            self.asset_id = ids[self.scope]
            if self.asset_id is None:
                self.error = AssetNotFoundError(str(self.scope))

    def row_key(self, key: str) -> tuple[Any, ...]:
        s = self.scope
        if isinstance(s, TaskScope):
            return (s.dag_id, s.run_id, s.task_id, s.map_index, key)
        return (self.asset_id, key)


class PutOp(_ScopedOp):
    """Upsert one key; with ``expected`` a compare-and-set (0: must not exist)."""

    __slots__ = ("expected", "expires_at", "key", "never_expire", "value_json")

    def __init__(self, put: Put, *, updated_at: datetime) -> None:
        expected = put.expected_version
        super().__init__(put.scope, PUT if expected is None else CAS, put.writer, updated_at)
        self.key, self.value_json = put.key, put.value_json
        self.expires_at, self.never_expire = put.expires_at, put.never_expire
        self.expected = expected

    def weight(self) -> int:
        return WRITE_OVERHEAD + len(self.value_json)

    def pk(self) -> tuple[Any, ...]:
        return self.row_key(self.key)

    def row(self) -> tuple[Any, ...]:
        data: tuple[Any, ...] = (self.value_json, self.at, *writer_fields(self.writer))
        if isinstance(self.scope, TaskScope):
            data += (self.expires_at, self.never_expire)
        return self.pk() + data


class DeleteOp(_ScopedOp):
    """Delete one key; the result says whether it existed."""

    __slots__ = ("key",)

    def __init__(self, scope: StateScope, key: str, writer: Writer | None, at: datetime) -> None:
        super().__init__(scope, DELETE, writer, at)
        self.key = key

    def pk(self) -> tuple[Any, ...]:
        return self.row_key(self.key)


class ClearOp(_ScopedOp):
    """Delete every key of a scope; the result is how many."""

    __slots__ = ("all_map_indices",)

    def __init__(
        self, scope: StateScope, all_map_indices: bool, writer: Writer | None, at: datetime
    ) -> None:
        super().__init__(scope, CLEAR, writer, at)
        self.all_map_indices = all_map_indices


class EventsOp(Op):
    """Events of one trigger with one state, all or nothing: a single :class:`EventCommit` is
    a batch of one event. The result is the events written, in id order.

    Every event commit travels in one form (:mod:`.commits`): ``doc``, the op as one JSON
    object: ``w`` the watcher; its one event as ``p`` (payload) and ``d`` (dedup key), or its
    events as the array ``e`` of their payloads and, when any has a dedup key, the array ``ek``
    of their keys (null for none) beside it; each payload its own JSON text put in as it is
    (not quoted: the event keeps one form), but for a payload holding the escape ``\u0000``,
    which the server refuses to take out of the op's object as ``json``: that one goes quoted,
    as ``q``, or as a JSON string in ``e`` with its flag 1 in the array ``eq``; its one asset
    as ``a`` or its assets as ``n``; its state as ``k`` and ``v`` when it holds one key (the
    usual watermark: the statement reads them as two columns), else as the object ``s``;
    ``ft``/``fo``/``fk`` the fence, ``wk``/``wn``/``wt`` the writer; ``t`` its time
    (:func:`epoch_us`); absent keys are NULL. It is written here, by its caller, so the writer
    only joins the texts. Its assets are resolved, and its fence checked, by the statement that
    writes it, not by the batch's shared steps. ``keyed``: whether any event has a dedup key.
    """

    __slots__ = (
        "_weight", "created_at", "doc", "events", "fence", "keyed", "names", "state", "watcher",
        "writer",
    )  # fmt: skip

    def __init__(
        self,
        watcher: str,
        assets: Sequence[str],
        events: tuple[tuple[str, str | None], ...],
        state: Mapping[str, str],
        writer: Writer | None,
        fence: Fence | None,
        created_at: datetime,
    ) -> None:
        super().__init__(EVENTS)
        self.watcher, self.events, self.state = watcher, events, state
        self.writer, self.fence, self.created_at = writer, fence, created_at
        # Each asset once, in order (an asset named twice gets one event).
        names = self.names = list(assets) if len(assets) < 2 else list(dict.fromkeys(assets))
        # The document written by hand: each text through the C string encoder, which is
        # what json.dumps does for it, without the encoder's pass over the containers.
        q = _quote
        if len(events) == 1:
            payload, key = events[0]
            self.keyed = key is not None
            if _NUL in payload:
                doc = f'{{"w":{q(watcher)},"q":{q(payload)}'
            else:
                doc = f'{{"w":{q(watcher)},"p":{payload}'
            if key is not None:
                doc += f',"d":{q(key)}'
            size = len(payload) + WRITE_OVERHEAD
        else:
            # The payloads and the keys as arrays the statement reads side by side: each
            # element comes out as one value, with no object or pair to take apart per event.
            payloads = [p for p, _ in events]
            quoted = [i for i, p in enumerate(payloads) if _NUL in p]
            for i in quoted:
                payloads[i] = q(payloads[i])
            doc = f'{{"w":{q(watcher)},"e":[{",".join(payloads)}]'
            keys = [d for _, d in events]
            self.keyed = keys.count(None) < len(keys)
            if self.keyed:
                doc += f',"ek":[{",".join(["null" if d is None else q(d) for d in keys])}]'
            if quoted:  # which payloads went as JSON strings
                flags = ["0"] * len(payloads)
                for i in quoted:
                    flags[i] = "1"
                doc += f',"eq":[{",".join(flags)}]'
            size = sum([len(p) for p, _ in events]) + WRITE_OVERHEAD * len(events)
        if len(names) == 1:
            doc += f',"a":{q(names[0])}'
        else:
            doc += f',"n":[{",".join(map(q, names))}]'
        if len(state) == 1:  # the usual watermark: two columns, no JSON object to take apart
            for k, v in state.items():
                doc += f',"k":{q(k)},"v":{q(v)}'
                size += len(v)
        elif state:
            doc += ',"s":{' + ",".join([f"{q(k)}:{q(v)}" for k, v in state.items()]) + "}"
            size += sum([len(v) for v in state.values()])
        if fence is not None:
            doc += f',"ft":{q(fence.trigger_id)},"fo":{q(fence.owner)},"fk":{int(fence.token)}'
        if writer is not None:
            doc += f',"wk":{q(writer.kind)},"wn":{q(writer.name)}'
            if writer.try_number is not None:
                doc += f',"wt":{int(writer.try_number)}'
        # Its time in the document too (see epoch_us): no array of timestamps to encode.
        self.doc = f'{doc},"t":{epoch_us(created_at)}}}'
        self._weight = size if len(names) < 2 else size * len(names)

    @classmethod
    def of(cls, commit: EventCommit | EventBatchCommit, created_at: datetime) -> EventsOp:
        """The op of one event commit or one batch."""
        if type(commit) is EventBatchCommit:
            events = commit.events
        else:
            events = ((commit.payload_json, commit.dedup_key),)  # type: ignore[union-attr]
        return cls(
            commit.watcher, commit.assets, events, commit.state, commit.writer, commit.fence,
            created_at,
        )  # fmt: skip

    def weight(self) -> int:
        return self._weight

    def fence_at(self) -> tuple[Fence, datetime] | None:
        return None if self.fence is None else (self.fence, self.created_at)


_NUL: Final = "\\u0000"

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def epoch_us(at: datetime) -> int:
    """``at`` as whole microseconds since the Unix epoch, how a write's time travels in its
    JSON (the server turns it back with :func:`at_sql`, exactly). An array of timestamps
    would cost the driver an abstract-class check or three per element; a naive time is
    local time, as the driver takes it."""
    return ((at if at.tzinfo is not None else at.astimezone(UTC)) - _EPOCH) // _MICROSECOND


def at_sql(micros: str) -> str:
    """The SQL of the ``timestamptz`` whose :func:`epoch_us` is the ``int8`` ``micros``:
    the whole seconds and the microseconds added apart, each exact in a ``float8`` for any
    time PostgreSQL holds (the microseconds alone pass 2^53 some 285 years from 1970)."""
    return (
        f"(to_timestamp(({micros}) / 1000000) + (({micros}) % 1000000) * interval '1 microsecond')"
    )


class CallOp(Op):
    """Any other write: ``fn`` runs on the writer's connection inside the batch transaction."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[asyncpg.Connection], Awaitable[Any]], *, phase: int) -> None:
        super().__init__(phase)
        self.fn = fn
