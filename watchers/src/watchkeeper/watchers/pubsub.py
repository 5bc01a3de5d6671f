"""``PubSubWatcher``: one event per message of a Google Cloud Pub/Sub subscription, exactly once.

The rule it follows (commit, then acknowledge; a dedup key for what the source redelivers):
the watcher holds one streaming pull open on the subscription, commits the messages it hands
out as :class:`~watchkeeper.triggerer.TriggerEventBatch` es, and only once a batch committed
(the generator resumes after the commit) acknowledges its messages with one ``Acknowledge``
call. Each event's ``dedup_key`` is ``<watcher name>:pubsub:<subscription>:<message id>``;
Pub/Sub keeps a message's id across redeliveries, so a message redelivered after a crash
between the commit and the acknowledgement (or after an acknowledgement that was lost) writes
nothing, and is acknowledged then. Nothing is lost and nothing is emitted twice.

While a message is held (buffered, being committed, waiting for its acknowledgement) its
lease is extended on the stream itself (``modify_deadline_ack_ids``), so a slow commit does
not hand it to another subscriber. The requests of a streaming pull are read by gRPC in a
task of its own, concurrently with the watcher: that request iterator is where the extensions
are sent from, so they go on while the generator is suspended at its ``yield``.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
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
    from google.pubsub_v1.types import ReceivedMessage, StreamingPullRequest

__all__ = ["PubSubParams", "PubSubWatcher"]

log = get_logger(__name__)

_CLIENT_MODULES = (
    "grpc",
    "grpc.aio",
    "google.auth",
    "google.api_core.exceptions",
    "google.pubsub_v1",
    "google.pubsub_v1.types",
    "google.pubsub_v1.services.subscriber.transports.grpc_asyncio",
)
_SUBSCRIPTION = re.compile(r"^projects/([^/\s]+)/subscriptions/([^/\s]+)$")
_HOST = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d+$")
_CLOSE_TIMEOUT = 5.0
_MAX_IDS = 2500
"""Ack ids per request (the service limits a request's size; its own clients send 2,500)."""
_STEP = 0.25
"""Seconds between two looks of the request stream at the leases and the half-close."""
_HEARTBEAT = 30.0
"""Seconds of silence on the request stream after which it carries an empty request."""
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
    max_outstanding: Count | None = None
    """At most this many messages handed out and not yet acknowledged (the stream's flow
    control; default: twice ``batch_size``)."""
    ack_deadline: Annotated[int, Field(ge=10, le=600)] = 60
    """Seconds a message handed out stays leased to the watcher; the lease of a message still
    held is extended by as much each time half of it has passed."""
    emulator_host: OptionalText = None
    """``host:port`` of a Pub/Sub emulator (plain gRPC, no credentials); default: the
    ``PUBSUB_EMULATOR_HOST`` variable when set, else Google's service."""
    endpoint: OptionalText = None
    """``host:port`` of another endpoint of the service (a regional or private one, TLS);
    default: ``pubsub.googleapis.com:443``."""
    call_timeout: Seconds = 30.0
    """Seconds each call (opening the stream, an acknowledgement) may take, and the longest
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


class _Leases:
    """The ack ids the watcher holds (handed out, not yet acknowledged), each with the
    monotonic time its lease ends."""

    def __init__(self, deadline: int) -> None:
        self.deadline = deadline
        self.ends: dict[str, float] = {}
        self.extended = 0
        """How many lease extensions were sent (for the logs and the tests)."""
        self.closing = anyio.Event()
        """Set to end the request stream (the client's half-close)."""

    def hold(self, ids: Iterable[str]) -> None:
        end = time.monotonic() + self.deadline
        for ack_id in ids:
            self.ends[ack_id] = end

    def release(self, ids: Iterable[str]) -> None:
        for ack_id in ids:
            self.ends.pop(ack_id, None)

    def due(self) -> list[str]:
        """The ids whose lease has less than half of it left, marked as extended."""
        now = time.monotonic()
        soon = now + self.deadline / 2
        due = [ack_id for ack_id, end in self.ends.items() if end <= soon]
        for ack_id in due:
            self.ends[ack_id] = now + self.deadline
        return due


class PubSubWatcher(ReadyMadeWatcher[PubSubParams]):
    """Yields one batch of events per delivery of a Google Cloud Pub/Sub subscription.

    Each message is one event with the payload ``{"subscription", "message_id",
    "published", "ordering_key", "attributes", "delivery_attempt", "data"}``: the
    subscription's path, the message's id, when it was published (ISO 8601), its ordering key
    (null when it has none), its attributes (``{name: value}``, or null), the delivery
    attempt the service counts on a subscription with a dead-letter policy (else null), and
    the data as JSON when it is UTF-8 JSON, else its text, else ``{"base64": ...}``.

    Exactly once: the watcher opens a streaming pull (at most ``max_outstanding`` messages
    handed out and not acknowledged), commits what the stream delivers in batches of at most
    ``batch_size`` messages, and acknowledges each batch with one ``Acknowledge`` call once it
    committed. Each event has the ``dedup_key`` ``<watcher name>:pubsub:<subscription>:<message
    id>``: a message redelivered after a crash between the commit and the acknowledgement, an
    acknowledgement lost with its connection, or a lease that ran out writes nothing and is
    acknowledged then. While a message is held (waiting in the watcher, in the commit,
    waiting for its acknowledgement), its lease (``ack_deadline`` seconds) is extended on the
    stream each time half of it has passed, so a slow commit does not let the service hand it
    out again. A watcher stopped (or restarted after an error) gives back the messages it holds
    and has not committed (``ModifyAckDeadline`` to 0), so they come again at once rather than
    when their leases run out. On a subscription with message ordering, the messages of one
    ordering key are handed out, and committed, in publish order.

    Credentials come from Google's application default credentials
    (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the
    metadata server of a Google Cloud machine); they are never parameters, so never
    serialized, and no token appears in a message. With ``emulator_host`` (or the
    ``PUBSUB_EMULATOR_HOST`` variable) the watcher talks plain gRPC to an emulator and uses
    none. Permission needed: ``roles/pubsub.subscriber`` on the subscription.

    Connection: opening the stream and each acknowledgement must answer within
    ``call_timeout`` seconds; the connection is pinged every ``keepalive`` seconds and one
    whose ping goes unanswered within ``call_timeout`` counts as lost. While the service
    cannot be reached (or the stream breaks, or the service is unavailable) the watcher opens
    a new stream with a growing delay, its status ``backing_off`` with the reason (logged as
    ``pubsub_reconnecting``), and ``running`` again once a stream opens; after
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
        """What must never show: an access token of the environment (errors seldom quote one,
        but a proxy's might)."""
        found = []
        for variable in ("GOOGLE_OAUTH_ACCESS_TOKEN", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"):
            value = os.environ.get(variable)
            if value:
                found.append(value)
        return found

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEventBatch]:
        await import_off_loop(*_CLIENT_MODULES)
        from google.api_core.exceptions import GoogleAPICallError

        secrets = self._secrets()
        key = f"{self.watcher_name}.message_id"
        prefix = make_dedup_key(self.watcher_name, "pubsub", self.params.subscription) + ":"
        failures = 0
        while True:
            leases = _Leases(self.params.ack_deadline)
            buffered: deque[ReceivedMessage] = deque()
            client: SubscriberAsyncClient | None = None
            call: Any = None
            try:
                try:
                    client = await self._new_client()
                except Exception as exc:  # no credentials, a malformed endpoint: not retried
                    raise BrokerSourceError(
                        self._name, "creating the client", exc, secrets
                    ) from exc
                self._client = client
                with anyio.fail_after(self.params.call_timeout):
                    call = await client.streaming_pull(
                        requests=self._requests(leases), retry=None, timeout=None
                    )
                    await call.wait_for_connection()
                failures = 0
                if self._troubled:
                    self._troubled = False
                    log.info("pubsub_reachable", watcher=self.watcher_name)
                    self.report_source(None)
                while True:
                    if not buffered:
                        # Never cancelled from here: cancelling a read ends the stream.
                        response = await call.read()
                        if response is _eof():
                            raise ConnectionError("the service ended the stream")
                        received = list(response.received_messages)
                        leases.hold(m.ack_id for m in received)
                        buffered.extend(received)
                        if not buffered:
                            continue
                    size = min(len(buffered), self.params.batch_size)
                    batch = [buffered.popleft() for _ in range(size)]
                    events = [self._event(message, prefix) for message in batch]
                    yield TriggerEventBatch(events, state={key: batch[-1].message.message_id})
                    # Committed (or suppressed as a redelivery): the service may forget them.
                    await self._acknowledge(client, batch, leases, secrets)
            except (GoogleAPICallError, ConnectionError, OSError, TimeoutError) as exc:
                failures = self._failed(exc, failures, secrets)
            finally:
                self._client = None
                with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                    await self._close(client, call, leases, secrets)
            await anyio.sleep(reconnect_delay(failures))

    async def cleanup(self) -> None:
        """Close the client if ``run()`` was abandoned without being finalized."""
        client, self._client = self._client, None
        if client is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await _close_channel(client)

    async def _new_client(self) -> SubscriberAsyncClient:
        import grpc
        from google.pubsub_v1 import SubscriberAsyncClient
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
        else:
            import google.auth

            # google.auth.default() reads files and may ask a metadata server: not on the loop.
            credentials, _ = await anyio.to_thread.run_sync(
                lambda: google.auth.default(scopes=_SCOPES)
            )
            channel = SubscriberGrpcAsyncIOTransport.create_channel(
                self.params.endpoint or "pubsub.googleapis.com:443",
                credentials=credentials,
                options=options,
            )
        return SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))

    async def _requests(self, leases: _Leases) -> AsyncIterator[StreamingPullRequest]:
        """The stream's requests: the subscription first, then the lease extensions of the
        messages held (and a heartbeat when there is nothing to say).

        gRPC reads this iterator in a task of its own, so it goes on while the watcher's
        generator is suspended at a ``yield`` (a batch being committed).
        """
        from google.pubsub_v1.types import StreamingPullRequest

        deadline = self.params.ack_deadline
        yield StreamingPullRequest(
            subscription=self.params.subscription,
            stream_ack_deadline_seconds=deadline,
            max_outstanding_messages=self.params.max_outstanding or 2 * self.params.batch_size,
            # Each stream its own: a stream that takes over another's id (a restart in another
            # process) may be handed none of the messages, on the emulator at least.
            client_id=uuid.uuid4().hex,
        )
        quiet = 0.0
        tick = deadline / 4
        waited = 0.0
        while True:
            # Short sleeps rather than a cancel scope: this runs in gRPC's task, not ours.
            await anyio.sleep(_STEP)
            if leases.closing.is_set():
                return  # the half-close: the service ends the stream
            waited += _STEP
            if waited < tick:
                continue
            waited = 0.0
            due = leases.due()
            if due:
                for start in range(0, len(due), _MAX_IDS):
                    ids = due[start : start + _MAX_IDS]
                    yield StreamingPullRequest(
                        modify_deadline_ack_ids=ids, modify_deadline_seconds=[deadline] * len(ids)
                    )
                leases.extended += len(due)
                log.debug("pubsub_leases_extended", watcher=self.watcher_name, count=len(due))
                quiet = 0.0
                continue
            quiet += tick
            if quiet >= _HEARTBEAT:
                quiet = 0.0
                yield StreamingPullRequest(stream_ack_deadline_seconds=deadline)

    async def _acknowledge(
        self,
        client: SubscriberAsyncClient,
        batch: list[ReceivedMessage],
        leases: _Leases,
        secrets: list[str],
    ) -> None:
        """Acknowledge a committed batch; what is not acknowledged comes again, suppressed."""
        from google.api_core.exceptions import GoogleAPICallError

        ids = [message.ack_id for message in batch]
        leases.release(ids)
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
        self,
        client: SubscriberAsyncClient | None,
        call: Any,
        leases: _Leases,
        secrets: list[str],
    ) -> None:
        """Give back the messages still held (they come again at once; one whose event did
        commit is then suppressed), end the stream, close the channel."""
        try:
            if call is not None:
                # Ended first, by a half-close, and its end awaited: a message given back while
                # the stream is open could be handed to it again. Cancelling the call would
                # not do: the emulator keeps streaming to a cancelled stream (so to a killed
                # process's), and what it sends there stays leased until its deadline.
                leases.closing.set()
                with contextlib.suppress(Exception), anyio.move_on_after(self.params.call_timeout):
                    while not call.done():
                        response = await call.read()  # what came meanwhile is given back too
                        if response is _eof():
                            break
                        leases.hold(m.ack_id for m in response.received_messages)
                call.cancel()
            held = list(leases.ends)
            leases.ends.clear()
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
            if client is not None:
                await _close_channel(client)

    def _failed(self, exc: BaseException, failures: int, secrets: list[str]) -> int:
        """Count a broken stream: raise for what no retry cures or after too many, else
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


def _eof() -> Any:
    import grpc.aio

    return grpc.aio.EOF


async def _close_channel(client: SubscriberAsyncClient) -> None:
    transport: Any = client.transport  # its close() is not annotated
    await transport.close()
