"""What every route shares: the context, the error type, authentication, JSON shapes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from starlette.requests import Request
from watchkeeper.store import BaseStateBackend, StateEntry
from watchkeeper.store.protocols import EventLog, OperatorControls, TaskQueue, get_logger

from .._core import describe_error, iso
from ..daemon import controls_of
from ._errors import ApiError
from ._feed import SSE_BATCH, EventFeed
from ._metrics import Metrics
from ._parse import int_param
from ._rates import RunnerRates
from ._series import WatcherSeries
from ._signatures import CHALLENGE, Hook
from ._tokens import Principal, verify_token

if TYPE_CHECKING:
    from ..daemon import Daemon
    from ..runtime import TriggerRunner

__all__ = [
    "MAX_PAGE",
    "ApiContext",
    "ApiError",
    "authenticate",
    "ctx_of",
    "entry_json",
    "etag",
    "forbid",
    "int_param",
    "require",
    "utc_now",
]

log = get_logger(__name__)

MAX_PAGE = 1000
FEED_KEEP = 5 * SSE_BATCH


@dataclass
class ApiContext:
    """What the routes work on. ``daemon``/``runner`` are None in ``watchkeeper api``."""

    backend: BaseStateBackend
    metrics: Metrics
    daemon: Daemon | None = None
    runner: TriggerRunner | None = None
    rates: RunnerRates | None = None
    """The runner's watcher rates (sampled while the server runs); None: count the event log."""
    sse_poll: float = 0.25
    """Seconds between two reads of new events for each live stream."""
    closing: anyio.Event = field(default_factory=anyio.Event)
    """Set when the server stops: live streams end."""
    task_group: anyio.abc.TaskGroup | None = None
    """The server's task group (set by :func:`~._server.serve_api`): for heartbeat kicks."""
    feeds: dict[str | None, EventFeed] = field(default_factory=dict)
    """The live streams' shared reads, by filter (an asset, or None for every event)."""
    feed_keep: int = FEED_KEEP
    """Events a live stream's shared feed keeps ready; a client further behind reads alone."""
    token_recheck: float = 5.0
    """Seconds between two checks of a live stream's token: revoked or expired, the stream ends."""
    max_streams_per_token: int = 20
    """Most live streams one token holds open at once; one more is answered 429."""
    open_streams: dict[str, int] = field(default_factory=dict)
    """Live streams open now, by token id."""
    metrics_token_required: bool = False
    """``/metrics`` needs a token with read scope."""
    series: WatcherSeries | None = None
    """The watchers' last hour (sampled by the server that serves this context), or None."""
    hooks: Mapping[str, Hook] = field(default_factory=dict)
    """The assets that take signed webhooks (``[api.hooks]``), by asset name."""

    @property
    def tasks(self) -> TaskQueue:
        """The store as a task queue; a 501 :class:`ApiError` when it keeps no tasks."""
        queue = self.backend.services.tasks
        if queue is None:
            raise ApiError(501, "not_supported", f"{type(self.backend).__name__} keeps no tasks")
        return queue

    @property
    def events(self) -> EventLog:
        """The store's event log; a 501 :class:`ApiError` when it keeps none."""
        store = self.backend.services.events
        if store is None:
            raise ApiError(
                501, "not_supported", f"{type(self.backend).__name__} keeps no event log"
            )
        return store

    @property
    def controls(self) -> OperatorControls:
        """The store's tokens and controls; a 501 :class:`ApiError` when it keeps none."""
        store = controls_of(self.backend)
        if store is None:
            raise ApiError(
                501, "not_supported", f"{type(self.backend).__name__} keeps no tokens or controls"
            )
        return store

    def feed(self, asset: str | None) -> EventFeed:
        """The shared feed of a live stream's filter (made when its first client comes).

        :param asset: the stream's asset; None for every event.
        """
        feed = self.feeds.get(asset)
        if feed is None:
            feed = self.feeds[asset] = EventFeed(self.events, asset, keep=self.feed_keep)
        return feed

    def kick(self) -> None:
        """Let the in-process daemon act on a control now instead of at its next heartbeat."""
        daemon, tg = self.daemon, self.task_group
        if daemon is None or tg is None:
            return

        async def heartbeat() -> None:
            try:
                await daemon.renew_leases()
            except Exception as exc:  # noqa: BLE001 - the regular heartbeat tries again
                log.warning("api_heartbeat_failed", error=describe_error(exc))

        tg.start_soon(heartbeat)


def ctx_of(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


def utc_now() -> datetime:
    return datetime.now(UTC)


# -- authorization -------------------------------------------------------------------------------


async def authenticate(request: Request) -> Principal:
    """The request's principal; 401 without a valid bearer token (never says which part failed)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    challenge = dict(CHALLENGE)
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>", headers=challenge)
    principal = await verify_token(ctx_of(request).controls, token.strip(), utc_now())
    if principal is None:
        raise ApiError(
            401, "unauthorized", "the token is unknown, revoked or expired", headers=challenge
        )
    return principal


def forbid(principal: Principal, what: str) -> ApiError:
    return ApiError(403, "forbidden", f"token {principal.name!r} may not {what}")


def require(allowed: bool, principal: Principal, what: str) -> None:
    if not allowed:
        raise forbid(principal, what)


# -- JSON shapes ----------------------------------------------------------------------------------


def entry_json(entry: StateEntry) -> dict[str, Any]:
    return {
        "key": entry.key,
        "value": entry.value,
        "version": entry.version,
        "writer": None if entry.writer is None else str(entry.writer),
        "updated_at": iso(entry.updated_at),
    }


def etag(version: int) -> str:
    return f'"{version}"'
