"""``NatsJetStreamWatcher``: one event per message of a NATS JetStream stream, exactly once.

The watcher reads through a *durable pull consumer*: the server keeps its position (the
consumer's ack floor), so a restarted watcher, on this daemon or another, gets every message
it had not acknowledged. It acknowledges a message only after the message's event committed
(the generator resumes after the commit; the messages of one fetch commit together), and gives each event the ``dedup_key``
``<watcher name>:nats:<stream>:<stream sequence>``. A crash between the commit and the ack makes
the server redeliver that message (after ``ack_wait``); its event is then suppressed, writing
nothing, and the redelivery is acknowledged. Nothing is lost and nothing is emitted twice.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import anyio
from pydantic import Field, ValidationInfo, field_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import (
    BrokerSourceError,
    decode_body,
    make_dedup_key,
    redact_url,
    scrub,
    url_secrets,
)
from ._common import CLOSE_TIMEOUT, close_bounded, import_off_loop
from ._params import (
    Count,
    OptionalText,
    ReadyMadeWatcher,
    Seconds,
    SecondsOrZero,
    Text,
    WatcherParams,
    text_list,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

__all__ = ["NatsJetStreamParams", "NatsJetStreamWatcher"]

log = get_logger(__name__)

Deliver = Literal["all", "new"]

_NAME = re.compile(r"[^A-Za-z0-9_-]")


def durable_name_for(watcher_name: str) -> str:
    """A JetStream consumer name from a watcher name: no ``.``, ``*``, ``>`` or whitespace."""
    return "watchkeeper-" + _NAME.sub("_", watcher_name)[:200]


class NatsJetStreamParams(WatcherParams):
    """The parameters of :class:`NatsJetStreamWatcher`."""

    stream: Text
    """The JetStream stream."""
    servers: list[str] = Field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    """The server URL, or a list of them (``nats://``, ``tls://``, ``ws://``, ``wss://``);
    passwords and tokens are never shown."""
    subject: OptionalText = None
    """Only the subjects matching this filter (default: all of the stream's)."""
    durable: OptionalText = None
    """The durable consumer's name (default ``watchkeeper-<watcher name>``): letters, digits,
    ``_`` and ``-``."""
    batch_size: Count = 100
    """At most this many messages per fetch, committed together in one transaction and then
    acknowledged; ``1`` commits and acknowledges each message alone."""
    fetch_timeout: Seconds = 5.0
    """The longest a fetch waits for its first message, in seconds."""
    ack_wait: Seconds = 30.0
    """Seconds before an unacknowledged message is redelivered (for a consumer created by
    the watcher)."""
    max_ack_pending: Count = 1000
    """At most this many messages in flight (for a consumer created by the watcher)."""
    deliver: Deliver = "all"
    """A new consumer starts at the stream's first message (``"all"``) or with messages
    published after it was created (``"new"``)."""
    reconnect_attempts: Count = 60
    """Reconnection tries (2 s apart) after a lost connection before ``run()`` raises."""
    connect_timeout: Seconds = 30.0
    """Seconds the first connect may take."""
    ping_interval: Seconds = 10.0
    """Seconds between two pings; a connection with two unanswered pings is dropped."""
    batch_linger: SecondsOrZero = 0.0
    """Seconds a fetch that came back short of ``batch_size`` waits for more messages before
    its batch commits (``0``: commit what one fetch brought)."""

    added_later: ClassVar[frozenset[str]] = frozenset({"batch_linger"})

    @field_validator("servers", mode="before")
    @classmethod
    def _server_list(cls, value: object, info: ValidationInfo) -> object:
        value = text_list(
            value,
            info,
            whole="servers must be a URL or a non-empty list of URLs",
            each="a server URL",
        )
        for url in value:
            if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(
                    f"server {redact_url(url)!r} must start with nats://, tls://, ws:// or wss://"
                )
        return value

    @field_validator("durable")
    @classmethod
    def _durable_name(cls, value: str | None) -> str | None:
        if value is not None and _NAME.search(value):
            raise ValueError(f"durable {value!r} may hold only letters, digits, '_' and '-'")
        return value


class NatsJetStreamWatcher(ReadyMadeWatcher[NatsJetStreamParams]):
    """Yields one event per message of a JetStream stream, through a durable consumer.

    The payload is ``{"stream", "subject", "sequence", "published", "headers", "data"}``:
    the stream sequence, the publish time (ISO 8601), the headers (or null) and the body as
    JSON when it is UTF-8 JSON, else its text, else ``{"base64": ...}``.

    The durable consumer ``durable`` (default ``watchkeeper-<watcher name>``) is created on
    the first start if missing: explicit acks, ``ack_wait`` seconds before an unacknowledged
    message is redelivered, at most ``max_ack_pending`` messages in flight, only the subjects
    matching ``subject`` (default: all of the stream's), from the stream's first message
    (``deliver="all"``) or only those published after it was created (``"new"``). An existing
    consumer is used as it is. Messages are fetched ``batch_size`` at a time, waiting up to
    ``fetch_timeout`` seconds for the first; a fetch that came back short waits up to
    ``batch_linger`` seconds for more. The messages of a fetch commit together, as one
    :class:`~watchkeeper.triggerer.TriggerEventBatch`, and are acknowledged after the commit
    (each one, or only the last when the consumer's ack policy is ``all``); ``batch_size=1``
    commits and acknowledges each message alone.

    Connection: the first connect must succeed within ``connect_timeout`` seconds. The
    client pings the server every ``ping_interval`` seconds and gives up on a connection that
    left two pings unanswered (a server gone silent behind a network path that drops every
    packet), each fetch waits at most ``fetch_timeout`` seconds, each JetStream request the
    client's 5 s. After a lost connection nats-py reconnects by itself (``reconnect_attempts``
    tries, 2 s apart, logged as ``nats_disconnected``/``nats_reconnected``; the watcher's
    status is ``backing_off`` meanwhile); the consumer and this watcher's pending
    acknowledgements survive it, and messages the server sent into the dead connection are
    redelivered after ``ack_wait``. When the first connect fails or the client gives up,
    ``run()`` raises :class:`BrokerSourceError` and the daemon restarts the watcher with its
    backoff. Messages
    fetched but not yet acknowledged when the watcher stops are released (``nak``) for
    redelivery at once. Messages come in stream order, except that one redelivered after a
    crash (once ``ack_wait`` passed) comes after those delivered in the meantime.

    State key (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name):

    - ``<name>.sequence``: the highest stream sequence whose event committed. It is for
      people and ``watchkeeper status``: the position the watcher resumes from is the
      consumer's, kept by the server.

    How to rewind it: stop the watcher, delete the consumer (``nats consumer rm STREAM
    DURABLE``), and start it with ``deliver="all"`` (or create the consumer yourself with a
    start sequence). Messages whose events are still remembered by their ``dedup_key`` (for
    ``[events] dedup_retention_days``) are suppressed again; to emit them anew, run the
    watcher under a new name (the keys start with it).

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = NatsJetStreamParams
    client = ("nats", "nats")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: Client | None = None
        self._closing = False
        self._name = f"{type(self).__name__}({self.params.stream!r})"

    def __repr__(self) -> str:
        servers = ", ".join(redact_url(url) for url in self.params.servers)
        return (
            f"<{type(self).__name__} servers=[{servers}] stream={self.params.stream!r} "
            f"durable={self.params.durable!r} connected={self._client is not None}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        await import_off_loop("nats", "nats.errors", "nats.js.errors", "nats.js.api")
        import nats.errors

        key = f"{self.watcher_name}.sequence"
        highest = await _highest(self.asset_state_store, key, self._name)
        durable = self.params.durable or durable_name_for(self.watcher_name)
        secrets = url_secrets(*self.params.servers)
        self._closing = False
        client = await self._connect(secrets)
        self._client = client
        pending: list[Msg] = []
        try:
            subscription, ack_all = await self._subscribe(client.jetstream(), durable, secrets)
            size, linger = self.params.batch_size, self.params.batch_linger
            while True:
                try:
                    pending = await subscription.fetch(
                        self.params.batch_size, timeout=self.params.fetch_timeout
                    )
                except (nats.errors.TimeoutError, TimeoutError):
                    # Nothing within fetch_timeout (nats-py raises either type, the plain one
                    # when a reconnect swallowed the pull request).
                    pending = []
                except nats.errors.Error as exc:
                    raise BrokerSourceError(
                        self._name, f"fetching from consumer {durable!r}", exc, secrets
                    ) from exc
                if client.is_closed:
                    raise BrokerSourceError(
                        self._name,
                        "staying connected",
                        ConnectionError(
                            f"gave up after {self.params.reconnect_attempts} reconnects"
                        ),
                        secrets,
                    )
                if pending and size > 1 and len(pending) < size and linger > 0:
                    pending += await _top_up(subscription, size - len(pending), linger)
                if size > 1 and pending:
                    # One commit for the batch, then the acks: a kill in between makes the
                    # server redeliver the batch after ack_wait, and each message's dedup_key
                    # suppresses it then. Until acked, the batch is ``pending``: if the run
                    # ends at the yield, it is released for redelivery.
                    events = []
                    for message in pending:
                        sequence = message.metadata.sequence.stream
                        highest = max(highest, sequence)
                        events.append(
                            TriggerEvent(
                                self._payload(message, sequence),
                                dedup_key=make_dedup_key(
                                    self.watcher_name, "nats", self.params.stream, str(sequence)
                                ),
                            )
                        )
                    yield TriggerEventBatch(events, state={key: highest})
                    batch, pending = pending, []
                    await self._ack_batch(batch, ack_all, secrets)
                while pending:
                    # Stays first in ``pending`` until acked: if the run ends at its yield, it
                    # is released with the rest (committed or not; a committed one comes back
                    # as a suppressed duplicate).
                    message = pending[0]
                    sequence = message.metadata.sequence.stream
                    highest = max(highest, sequence)
                    yield TriggerEvent(
                        self._payload(message, sequence),
                        state={key: highest},
                        dedup_key=make_dedup_key(
                            self.watcher_name, "nats", self.params.stream, str(sequence)
                        ),
                    )
                    # Committed (or suppressed as a redelivery): now the server may forget it.
                    pending.pop(0)
                    try:
                        await message.ack()
                    except nats.errors.Error as exc:
                        # Not acknowledged: the server redelivers it after ack_wait, and its
                        # dedup_key suppresses it then.
                        log.warning(
                            "nats_ack_failed",
                            stream=self.params.stream,
                            sequence=sequence,
                            error=scrub(f"{type(exc).__name__}: {exc}", secrets),
                        )
        finally:
            self._client = None
            self._closing = True
            with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await _release(pending)
                await client.close()

    async def _ack_batch(self, batch: list[Msg], ack_all: bool, secrets: list[str]) -> None:
        """Acknowledge a committed batch: its last message alone when the consumer's policy
        is ``all`` (which acknowledges everything before it), else each message."""
        import nats.errors

        try:
            if ack_all:
                await batch[-1].ack()
            else:
                for message in batch:
                    await message.ack()
        except nats.errors.Error as exc:
            # Not acknowledged: the server redelivers after ack_wait, the dedup_keys suppress.
            log.warning(
                "nats_ack_failed",
                stream=self.params.stream,
                sequence=batch[-1].metadata.sequence.stream,
                error=scrub(f"{type(exc).__name__}: {exc}", secrets),
            )

    async def cleanup(self) -> None:
        """Close the connection if ``run()`` was abandoned without being finalized."""
        client, self._client = self._client, None
        if client is not None:
            await close_bounded(client.close)

    async def _connect(self, secrets: list[str]) -> Client:
        import nats
        import nats.errors

        watcher = self.watcher_name

        async def on_error(exc: Exception) -> None:
            log.warning(
                "nats_error",
                watcher=watcher,
                error=scrub(f"{type(exc).__name__}: {exc}", secrets),
            )

        servers = ", ".join(redact_url(url) for url in self.params.servers)

        async def on_disconnected() -> None:
            if not self._closing:
                log.warning("nats_disconnected", watcher=watcher)
                self.report_source(f"{self._name}: disconnected from {servers}, reconnecting")

        async def on_reconnected() -> None:
            log.info("nats_reconnected", watcher=watcher)
            self.report_source(None)

        try:
            # nats-py retries a first connect as it retries reconnects; bound it, so a wrong
            # address shows up as this run's error instead of a silent wait.
            with anyio.fail_after(self.params.connect_timeout):
                client: Client = await nats.connect(
                    servers=list(self.params.servers),
                    name=f"watchkeeper:{watcher}",
                    allow_reconnect=True,
                    max_reconnect_attempts=self.params.reconnect_attempts,
                    reconnect_time_wait=2,
                    connect_timeout=min(5.0, self.params.connect_timeout),
                    # A server that stops answering (a network path dropping every packet)
                    # is found by its missing PONGs: after 2 unanswered pings, reconnect.
                    ping_interval=self.params.ping_interval,
                    max_outstanding_pings=2,
                    error_cb=on_error,
                    disconnected_cb=on_disconnected,
                    reconnected_cb=on_reconnected,
                )
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BrokerSourceError(self._name, f"connecting to {servers}", exc, secrets) from exc
        return client

    async def _subscribe(
        self, js: JetStreamContext, durable: str, secrets: list[str]
    ) -> tuple[JetStreamContext.PullSubscription, bool]:
        """Bind to the durable consumer, creating it first when the stream has none; also
        say whether its ack policy is ``all`` (one ack covers every earlier message)."""
        import nats.errors
        import nats.js.errors
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        ack_all = False
        try:
            try:
                info = await js.consumer_info(self.params.stream, durable)
                ack_all = info.config.ack_policy == AckPolicy.ALL
            except nats.js.errors.NotFoundError:
                config = ConsumerConfig(
                    durable_name=durable,
                    name=durable,
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=self.params.ack_wait,
                    max_ack_pending=self.params.max_ack_pending,
                    deliver_policy=DeliverPolicy.ALL
                    if self.params.deliver == "all"
                    else DeliverPolicy.NEW,
                    filter_subject=self.params.subject,
                )
                await js.add_consumer(self.params.stream, config=config)
                log.info("nats_consumer_created", stream=self.params.stream, durable=durable)
            subscription = await js.pull_subscribe_bind(durable=durable, stream=self.params.stream)
        except nats.errors.Error as exc:
            raise BrokerSourceError(
                self._name,
                f"binding consumer {durable!r} of stream {self.params.stream!r}",
                exc,
                secrets,
            ) from exc
        return subscription, ack_all

    def _payload(self, message: Msg, sequence: int) -> dict[str, Any]:
        metadata = message.metadata
        published = metadata.timestamp
        return {
            "stream": self.params.stream,
            "subject": message.subject,
            "sequence": sequence,
            "published": None if published is None else published.isoformat(),
            "headers": dict(message.headers) if message.headers else None,
            "data": decode_body(message.data),
        }


async def _top_up(
    subscription: JetStreamContext.PullSubscription, wanted: int, linger: float
) -> list[Msg]:
    """Up to ``wanted`` more messages, those arriving within ``linger`` seconds."""
    import nats.errors

    try:
        return await subscription.fetch(wanted, timeout=linger)
    except (nats.errors.Error, TimeoutError):
        return []  # nothing more within linger; a lost connection shows in the next fetch


async def _release(messages: list[Msg]) -> None:
    """Ask the server to redeliver now the fetched messages that were never emitted."""
    import nats.errors

    for message in messages:
        try:
            await message.nak()
        except nats.errors.Error:
            return  # the connection is gone: ack_wait redelivers them


async def _highest(store: Any, key: str, owner: str) -> int:
    highest = 0
    for asset in store:
        value = await store[asset].aget(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"{owner}: the asset state {key!r} is not a stream sequence ({value!r})"
            )
        highest = max(highest, value)
    return highest
