"""``PubSubWatcher``: one event per message of a Google Cloud Pub/Sub subscription, exactly once.

The rule it follows (commit, then acknowledge; a dedup key for what the source redelivers):
the watcher pulls up to ``batch_size`` messages with one ``Pull`` call, commits them as one
:class:`~watchkeeper.triggerer.TriggerEventBatch`, and only once that batch committed (the
generator resumes after the commit) acknowledges them with one ``Acknowledge`` call. Each
event's ``dedup_key`` is ``<watcher name>:pubsub:<subscription>:<message id>``; Pub/Sub keeps
a message's id across redeliveries, so a message redelivered after a crash between the commit
and the acknowledgement (or after an acknowledgement that was lost) writes nothing, and is
acknowledged then. Nothing is lost and nothing is emitted twice.

Its leases are extended while it is held, by a thread of its own (the generator is suspended
during the commit). Why ``Pull`` rather than a streaming pull: a pull is one request and one
answer, a stream a session the service must notice has ended (the emulator never notices a
killed client's and keeps sending to it); see docs/pubsub.md and BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.to_thread
from pydantic import Field, ValidationInfo, field_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import BrokerSourceError, decode_body, make_dedup_key, reconnect_delay, scrub
from ._common import import_off_loop
from ._params import Count, OptionalText, ReadyMadeWatcher, Seconds, Text, WatcherParams

if TYPE_CHECKING:
    from google.pubsub_v1 import SubscriberAsyncClient
    from google.pubsub_v1.types import ReceivedMessage

__all__ = ["PubSubParams", "PubSubWatcher"]

log = get_logger(__name__)

_CLIENT_MODULES = (
    "grpc",
    "grpc.aio",
    "google.auth",
    "google.api_core.exceptions",
    "google.pubsub_v1",
    "google.pubsub_v1.types",
    "google.pubsub_v1.services.subscriber.transports.grpc",
    "google.pubsub_v1.services.subscriber.transports.grpc_asyncio",
)
_SUBSCRIPTION = re.compile(r"^projects/([^/\s]+)/subscriptions/([^/\s]+)$")
_HOST = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d+$")
_CLOSE_TIMEOUT = 5.0
_MAX_IDS = 2500
"""Ack ids per request (the service limits a request's size; its own clients send 2,500)."""
_TICK = 1.0
"""Seconds between two looks of the lease keeper at the leases."""
_MIN_DEADLINE = 10
"""The shortest lease the service gives (a subscription's ack deadline is 10 s or more)."""
_SCOPES = ("https://www.googleapis.com/auth/pubsub",)
_FATAL_CODES = frozenset(
    {"NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED", "INVALID_ARGUMENT", "FAILED_PRECONDITION"}
)
"""gRPC status codes that no retry cures: ``run()`` raises at once (the daemon's backoff
applies)."""


class PubSubParams(WatcherParams):
    """The parameters of :class:`PubSubWatcher`."""

    subscription: Text
    """The subscription, ``projects/<project>/subscriptions/<name>``."""
    batch_size: Annotated[int, Field(ge=1, le=1000)] = 100
    """At most this many messages committed together in one transaction, then acknowledged
    with one call."""
    ack_deadline: Annotated[int, Field(ge=10, le=600)] = 60
    """Seconds by which the lease of a message the watcher holds is extended, once half of
    its lease has passed (a batch whose commit takes long)."""
    poll_interval: Seconds = 0.5
    """Seconds between two pulls when the last one brought nothing (the service holds a pull
    open a while by itself; the emulator answers at once)."""
    emulator_host: OptionalText = None
    """``host:port`` of a Pub/Sub emulator (plain gRPC, no credentials); default: the
    ``PUBSUB_EMULATOR_HOST`` variable when set, else Google's service."""
    endpoint: OptionalText = None
    """``host:port`` of another endpoint of the service (a regional or private one, TLS);
    default: ``pubsub.googleapis.com:443``."""
    call_timeout: Seconds = 30.0
    """Seconds each call (a pull, an acknowledgement) may take, and the longest
    a keepalive ping of a silent connection may go unanswered before it counts as lost."""
    keepalive: Seconds = 30.0
    """Seconds between the connection's keepalive pings (how a network path that drops every
    packet is found)."""
    reconnect_attempts: Count = 30
    """Failed calls in a row (backing off up to 10 s apart) before ``run()`` raises."""

    @field_validator("subscription")
    @classmethod
    def _subscription_path(cls, value: str) -> str:
        if _SUBSCRIPTION.match(value) is None:
            raise ValueError(
                f"subscription must be projects/<project>/subscriptions/<name>, got {value!r}"
            )
        return value

    @field_validator("emulator_host", "endpoint")
    @classmethod
    def _host_port(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and _HOST.match(value) is None:
            raise ValueError(f"{info.field_name} must be host:port, got {value!r}")
        return value


class _LeaseKeeper:
    """The ack ids of the batch the watcher holds (pulled, not yet acknowledged), and a thread
    that extends their leases while they are held.

    The watcher's generator is suspended while its batch commits, so the extensions cannot run
    there; a thread of its own, with a blocking client, sends them meanwhile. The ids are
    shared between the event loop and the thread under a lock.
    """

    def __init__(self, deadline: int, extend: Callable[[list[str]], None], watcher: str) -> None:
        self.deadline = deadline
        self.extend = extend
        self.watcher = watcher  # for the logs: the thread has none of the loop's context
        self._ends: dict[str, tuple[float, float]] = {}
        """``{ack id: (when its lease ends, how long it was)}``."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="pubsub-leases", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (blocking: call it in a worker thread)."""
        self._stop.set()
        self._thread.join(_CLOSE_TIMEOUT)

    def hold(self, ids: Iterable[str]) -> None:
        # A pulled message's first lease is the subscription's deadline, at least 10 s.
        lease = (time.monotonic() + _MIN_DEADLINE, float(_MIN_DEADLINE))
        with self._lock:
            for ack_id in ids:
                self._ends[ack_id] = lease

    def release(self) -> list[str]:
        """Forget every id held; the ids."""
        with self._lock:
            ids = list(self._ends)
            self._ends.clear()
        return ids

    def _due(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            due = [key for key, (end, length) in self._ends.items() if end - now <= length / 2]
            for ack_id in due:
                self._ends[ack_id] = (now + self.deadline, float(self.deadline))
        return due

    def _keep(self) -> None:
        while not self._stop.wait(_TICK):
            due = self._due()
            if not due:
                continue
            try:
                for start in range(0, len(due), _MAX_IDS):
                    self.extend(due[start : start + _MAX_IDS])
            except Exception as exc:  # noqa: BLE001 - a redelivery is suppressed: log only
                error = type(exc).__name__
                log.warning(
                    "pubsub_extend_failed", watcher=self.watcher, count=len(due), error=error
                )
                continue
            log.debug("pubsub_leases_extended", watcher=self.watcher, count=len(due))


class PubSubWatcher(ReadyMadeWatcher[PubSubParams]):
    """Yields one batch of events per pull from a Google Cloud Pub/Sub subscription.

    Each message is one event with the payload ``{"subscription", "message_id",
    "published", "ordering_key", "attributes", "delivery_attempt", "data"}``: the
    subscription's path, the message's id, when it was published (ISO 8601), its ordering key
    (null when it has none), its attributes (``{name: value}``, or null), the delivery
    attempt the service counts on a subscription with a dead-letter policy (else null), and
    the data as JSON when it is UTF-8 JSON, else its text, else ``{"base64": ...}``.

    Exactly once: the watcher pulls up to ``batch_size`` messages at a time (``Pull``),
    commits them as one batch, and acknowledges them with one ``Acknowledge`` call once the
    batch committed. Each event has the ``dedup_key`` ``<watcher name>:pubsub:<subscription>:
    <message id>``: a message redelivered after a crash between the commit and the
    acknowledgement, an acknowledgement lost with its connection, or a lease that ran out
    writes nothing and is acknowledged then. While a batch is held (in the commit, waiting
    for its acknowledgement), a thread of the watcher extends its leases by ``ack_deadline``
    seconds before they run out, so a slow commit does not let the service hand it out
    again. A watcher stopped (or reconnecting after an error) gives back the batch it holds
    (``ModifyAckDeadline`` to 0), so it comes again at once rather than when its leases run
    out. On a subscription with message ordering, the messages of one ordering key are
    handed out, and committed, in publish order. After a pull that brought nothing the
    watcher waits ``poll_interval`` seconds before the next.

    Credentials come from Google's application default credentials
    (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the
    metadata server of a Google Cloud machine); they are never parameters, so never
    serialized, and no token appears in a message. With ``emulator_host`` (or the
    ``PUBSUB_EMULATOR_HOST`` variable) the watcher talks plain gRPC to an emulator and uses
    none. Permission needed: ``roles/pubsub.subscriber`` on the subscription.

    Connection: each call (a pull, an acknowledgement) must answer within ``call_timeout``
    seconds; the connection is pinged every ``keepalive`` seconds and one whose ping goes
    unanswered within ``call_timeout`` counts as lost. While the service cannot be reached
    (or is unavailable) the watcher opens a new connection with a growing delay, its status
    ``backing_off`` with the reason (logged as ``pubsub_reconnecting``), and ``running``
    again once a pull succeeds; after
    ``reconnect_attempts`` failures in a row, or at once when the subscription does not exist
    or the credentials are refused, ``run()`` raises :class:`BrokerSourceError` and the
    daemon restarts the watcher with its backoff. An acknowledgement that fails is logged
    (``pubsub_ack_failed``): its messages come again and are suppressed.

    State key (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name):

    - ``<name>.message_id``: the id of the last message committed, for people and
      ``watchkeeper status``. The subscription itself is the position: an acknowledged
      message is gone from it.

    How to rewind it: seek the subscription to a time or a snapshot (``gcloud pubsub
    subscriptions seek``, with the subscription's ``retain_acked_messages`` for messages
    already acknowledged). The messages come again with their ids, so those whose events are
    still remembered (``[events] dedup_retention_days``) are suppressed; to emit them anew,
    run the watcher under a new name (the keys start with it).

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = PubSubParams
    positional = 1
    client = ("google.pubsub_v1", "pubsub")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.params.emulator_host is not None and self.params.endpoint is not None:
            raise ValueError(f"{type(self).__name__}: give emulator_host or endpoint, not both")
        self._client: SubscriberAsyncClient | None = None
        self._blocking_channel: Any = None
        self._keeper: _LeaseKeeper | None = None
        self._name = f"{type(self).__name__}({self.params.subscription!r})"
        self._troubled = False

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} subscription={self.params.subscription!r} "
            f"host={self._host()!r} connected={self._client is not None}>"
        )

    def _host(self) -> str:
        emulator = self._emulator()
        return emulator or self.params.endpoint or "pubsub.googleapis.com:443"

    def _emulator(self) -> str | None:
        return self.params.emulator_host or os.environ.get("PUBSUB_EMULATOR_HOST") or None

    def _secrets(self) -> list[str]:
        """An access token of the environment, never to be shown (a proxy's error may quote it)."""
        tokens = ("GOOGLE_OAUTH_ACCESS_TOKEN", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE")
        return [value for name in tokens if (value := os.environ.get(name))]

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        await import_off_loop(*_CLIENT_MODULES)
        from google.api_core.exceptions import DeadlineExceeded, GoogleAPICallError

        secrets = self._secrets()
        key = f"{self.watcher_name}.message_id"
        prefix = make_dedup_key(self.watcher_name, "pubsub", self.params.subscription) + ":"
        failures = 0
        while True:
            client: SubscriberAsyncClient | None = None
            keeper: _LeaseKeeper | None = None
            try:
                try:
                    client, extend = await self._new_clients()
                except Exception as exc:  # no credentials, a malformed endpoint: not retried
                    raise BrokerSourceError(
                        self._name, "creating the client", exc, secrets
                    ) from exc
                self._client = client
                keeper = self._keeper = _LeaseKeeper(self.params.ack_deadline, extend, self._name)
                keeper.start()
                while True:
                    try:
                        answer = await client.pull(
                            subscription=self.params.subscription,
                            max_messages=self.params.batch_size,
                            retry=None,
                            timeout=self.params.call_timeout,
                        )
                        batch = list(answer.received_messages)
                    except DeadlineExceeded:
                        batch = []  # the service held the pull open and nothing came
                    failures = 0
                    if self._troubled:
                        self._troubled = False
                        log.info("pubsub_reachable", watcher=self.watcher_name)
                        self.report_source(None)
                    if not batch:
                        await anyio.sleep(self.params.poll_interval)
                        continue
                    keeper.hold(message.ack_id for message in batch)
                    events = [self._event(message, prefix) for message in batch]
                    yield TriggerEventBatch(events, state={key: batch[-1].message.message_id})
                    # Committed (or suppressed as a redelivery): the service may forget them.
                    await self._acknowledge(client, keeper.release(), secrets)
            except (GoogleAPICallError, OSError, TimeoutError) as exc:
                failures = self._failed(exc, failures, secrets)
            finally:
                self._client = None
                with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                    await self._close(client, keeper)
            await anyio.sleep(reconnect_delay(failures))

    async def cleanup(self) -> None:
        """Stop the lease keeper, close the clients, if ``run()`` was abandoned unfinalized."""
        client, self._client = self._client, None
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await self._close(client, self._keeper)

    async def _new_clients(self) -> tuple[SubscriberAsyncClient, Callable[[list[str]], None]]:
        """The client of the watcher's calls, and the blocking call that extends leases (for
        the lease keeper's thread), each on a channel of its own."""
        import grpc
        from google.pubsub_v1 import SubscriberAsyncClient, SubscriberClient
        from google.pubsub_v1.services.subscriber.transports.grpc import SubscriberGrpcTransport
        from google.pubsub_v1.services.subscriber.transports.grpc_asyncio import (
            SubscriberGrpcAsyncIOTransport,
        )

        options = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.keepalive_time_ms", round(self.params.keepalive * 1000)),
            ("grpc.keepalive_timeout_ms", round(self.params.call_timeout * 1000)),
            ("grpc.primary_user_agent", "watchkeeper"),
            # A channel of its own connection: a new channel after a failure connects anew,
            # rather than waiting out the backoff of a connection shared in the process.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 500),
            ("grpc.max_reconnect_backoff_ms", 10_000),
        ]
        emulator = self._emulator()
        if emulator is not None:
            channel = grpc.aio.insecure_channel(emulator, options=options)
            blocking = grpc.insecure_channel(emulator, options=options)
        else:
            import google.auth

            # google.auth.default() reads files and may ask a metadata server: not on the loop.
            credentials, _ = await anyio.to_thread.run_sync(
                lambda: google.auth.default(scopes=_SCOPES)
            )
            host = self.params.endpoint or "pubsub.googleapis.com:443"
            channel = SubscriberGrpcAsyncIOTransport.create_channel(
                host, credentials=credentials, options=options
            )
            blocking = SubscriberGrpcTransport.create_channel(
                host, credentials=credentials, options=options
            )
        client = SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))
        keeper_client = SubscriberClient(transport=SubscriberGrpcTransport(channel=blocking))
        subscription, deadline = self.params.subscription, self.params.ack_deadline
        timeout = self.params.call_timeout

        def extend(ids: list[str]) -> None:
            keeper_client.modify_ack_deadline(
                subscription=subscription,
                ack_ids=ids,
                ack_deadline_seconds=deadline,
                retry=None,
                timeout=timeout,
            )

        self._blocking_channel = blocking
        return client, extend

    async def _acknowledge(
        self, client: SubscriberAsyncClient, ids: list[str], secrets: list[str]
    ) -> None:
        """Acknowledge a committed batch; what is not acknowledged comes again, suppressed."""
        from google.api_core.exceptions import GoogleAPICallError

        try:
            for start in range(0, len(ids), _MAX_IDS):
                await client.acknowledge(
                    subscription=self.params.subscription,
                    ack_ids=ids[start : start + _MAX_IDS],
                    retry=None,
                    timeout=self.params.call_timeout,
                )
        except (GoogleAPICallError, OSError) as exc:
            # Not acknowledged: the service hands them out again, and they are suppressed.
            log.warning(
                "pubsub_ack_failed",
                watcher=self.watcher_name,
                count=len(ids),
                error=scrub(f"{type(exc).__name__}: {exc}", secrets),
            )

    async def _close(
        self, client: SubscriberAsyncClient | None, keeper: _LeaseKeeper | None
    ) -> None:
        """Give back the batch still held (it comes again at once; if its events did commit,
        they are then suppressed), stop the lease keeper, close the channels."""
        self._keeper = None
        try:
            if keeper is not None:
                held = keeper.release()
                await anyio.to_thread.run_sync(keeper.stop, abandon_on_cancel=True)
                if client is not None and held:
                    with contextlib.suppress(Exception), anyio.fail_after(self.params.call_timeout):
                        for start in range(0, len(held), _MAX_IDS):
                            await client.modify_ack_deadline(
                                subscription=self.params.subscription,
                                ack_ids=held[start : start + _MAX_IDS],
                                ack_deadline_seconds=0,
                                retry=None,
                                timeout=self.params.call_timeout,
                            )
        finally:
            blocking, self._blocking_channel = self._blocking_channel, None
            if blocking is not None:
                blocking.close()
            if client is not None:
                await _close_channel(client)

    def _failed(self, exc: BaseException, failures: int, secrets: list[str]) -> int:
        """Count a failed call: raise for what no retry cures or after too many, else
        report the source as unreachable and return the new count of failures in a row."""
        from google.api_core.exceptions import GoogleAPICallError

        if isinstance(exc, GoogleAPICallError):
            code = getattr(exc.grpc_status_code, "name", None)
            if code in _FATAL_CODES:
                raise BrokerSourceError(self._name, "pulling", exc, secrets) from exc
        failures += 1
        if isinstance(exc, TimeoutError) and not str(exc):
            exc = TimeoutError(f"no answer within {self.params.call_timeout:g} s")
        reason = scrub(f"{type(exc).__name__}: {exc}", secrets)
        if failures > self.params.reconnect_attempts:
            raise BrokerSourceError(
                self._name, f"pulling ({failures} failures in a row)", exc, secrets
            ) from exc
        self._troubled = True
        log.warning(
            "pubsub_reconnecting",
            subscription=self.params.subscription,
            watcher=self.watcher_name,
            reason=reason,
            attempt=failures,
        )
        self.report_source(f"{self._name}: pulling from {self._host()} failed, retrying: {reason}")
        return failures

    def _event(self, received: ReceivedMessage, prefix: str) -> TriggerEvent:
        message = received.message
        published = message.publish_time
        attributes = dict(message.attributes)
        return TriggerEvent(
            {
                "subscription": self.params.subscription,
                "message_id": message.message_id,
                "published": None if published is None else published.isoformat(),
                "ordering_key": message.ordering_key or None,
                "attributes": attributes or None,
                "delivery_attempt": received.delivery_attempt or None,
                "data": decode_body(message.data),
            },
            dedup_key=prefix + _safe(message.message_id),
        )


def _safe(message_id: str) -> str:
    """The message id as a dedup key part (ids are short digits; anything else is hashed)."""
    if message_id.isalnum() and len(message_id) <= 200:
        return message_id
    return make_dedup_key("", message_id)[1:]


async def _close_channel(client: SubscriberAsyncClient) -> None:
    transport: Any = client.transport  # its close() is not annotated
    await transport.close()
