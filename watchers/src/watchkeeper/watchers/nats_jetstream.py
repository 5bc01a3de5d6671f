"""``NatsJetStreamWatcher``: one event per message of a NATS JetStream stream, exactly once.

The watcher reads through a *durable pull consumer*: the server keeps its position (the
consumer's ack floor), so a restarted watcher, on this daemon or another, gets every message
it had not acknowledged. It acknowledges a message only after the message's event committed
(the generator resumes after the commit), and gives each event the ``dedup_key``
``<watcher name>:nats:<stream>:<stream sequence>``. A crash between the commit and the ack makes
the server redeliver that message (after ``ack_wait``); its event is then suppressed, writing
nothing, and the redelivery is acknowledged. Nothing is lost and nothing is emitted twice.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent

from ._broker import (
    BrokerSourceError,
    decode_body,
    make_dedup_key,
    redact_url,
    require_client,
    scrub,
    url_secrets,
)
from ._common import (
    SerializedEquality,
    check_positive,
    check_positive_int,
    check_str,
    import_off_loop,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

__all__ = ["NatsJetStreamWatcher"]

log = get_logger(__name__)

Deliver = Literal["all", "new"]

_CLOSE_TIMEOUT = 5.0
_NAME = re.compile(r"[^A-Za-z0-9_-]")


def durable_name_for(watcher_name: str) -> str:
    """A JetStream consumer name from a watcher name: no ``.``, ``*``, ``>`` or whitespace."""
    return "watchkeeper-" + _NAME.sub("_", watcher_name)[:200]


class NatsJetStreamWatcher(SerializedEquality):
    """Yields one event per message of the JetStream stream ``stream`` at ``servers``.

    The payload is ``{"stream", "subject", "sequence", "published", "headers", "data"}``:
    the stream sequence, the publish time (ISO 8601), the headers (or null) and the body as
    JSON when it is UTF-8 JSON, else its text, else ``{"base64": ...}``.

    The durable consumer ``durable`` (default ``watchkeeper-<watcher name>``) is created on
    the first start if missing: explicit acks, ``ack_wait`` seconds before an unacknowledged
    message is redelivered, at most ``max_ack_pending`` messages in flight, only the subjects
    matching ``subject`` (default: all of the stream's), from the stream's first message
    (``deliver="all"``) or only those published after it was created (``"new"``). An existing
    consumer is used as it is. Messages are fetched ``batch_size`` at a time, waiting up to
    ``fetch_timeout`` seconds for the first.

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
    """

    def __init__(
        self,
        stream: str,
        servers: str | Sequence[str] = "nats://127.0.0.1:4222",
        subject: str | None = None,
        durable: str | None = None,
        batch_size: int = 100,
        fetch_timeout: float = 5.0,
        ack_wait: float = 30.0,
        max_ack_pending: int = 1000,
        deliver: Deliver = "all",
        reconnect_attempts: int = 60,
        connect_timeout: float = 30.0,
        ping_interval: float = 10.0,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        require_client(owner, "nats", "nats")
        self.stream = check_str(owner, "stream", stream)
        if isinstance(servers, str):
            servers = [servers]
        if not isinstance(servers, Sequence) or not servers:
            raise TypeError(f"{owner}: servers must be a URL or a non-empty list of URLs")
        self.servers = [check_str(owner, "a server URL", url) for url in servers]
        for url in self.servers:
            if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(
                    f"{owner}: server {redact_url(url)!r} must start with nats://, tls://, "
                    "ws:// or wss://"
                )
        self.subject = None if subject is None else check_str(owner, "subject", subject)
        self.durable = None if durable is None else check_str(owner, "durable", durable)
        if durable is not None and _NAME.search(durable):
            raise ValueError(
                f"{owner}: durable {durable!r} may hold only letters, digits, '_' and '-'"
            )
        self.batch_size = check_positive_int(owner, "batch_size", batch_size)
        check_positive(owner, "fetch_timeout", fetch_timeout)
        check_positive(owner, "ack_wait", ack_wait)
        self.fetch_timeout = fetch_timeout
        self.ack_wait = ack_wait
        self.max_ack_pending = check_positive_int(owner, "max_ack_pending", max_ack_pending)
        if deliver not in ("all", "new"):
            raise ValueError(f"{owner}: deliver must be 'all' or 'new', got {deliver!r}")
        self.deliver: Deliver = deliver
        self.reconnect_attempts = check_positive_int(
            owner, "reconnect_attempts", reconnect_attempts
        )
        check_positive(owner, "connect_timeout", connect_timeout)
        self.connect_timeout = connect_timeout
        check_positive(owner, "ping_interval", ping_interval)
        self.ping_interval = ping_interval
        self._client: Client | None = None
        self._closing = False
        self._name = f"{owner}({stream!r})"

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "stream": self.stream,
            "servers": list(self.servers),
            "subject": self.subject,
            "durable": self.durable,
            "batch_size": self.batch_size,
            "fetch_timeout": self.fetch_timeout,
            "ack_wait": self.ack_wait,
            "max_ack_pending": self.max_ack_pending,
            "deliver": self.deliver,
            "reconnect_attempts": self.reconnect_attempts,
            "connect_timeout": self.connect_timeout,
            "ping_interval": self.ping_interval,
        }

    def __repr__(self) -> str:
        servers = ", ".join(redact_url(url) for url in self.servers)
        return (
            f"<{type(self).__name__} servers=[{servers}] stream={self.stream!r} "
            f"durable={self.durable!r} connected={self._client is not None}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await import_off_loop("nats", "nats.errors", "nats.js.errors", "nats.js.api")
        import nats.errors

        key = f"{self.watcher_name}.sequence"
        highest = await _highest(self.asset_state_store, key, self._name)
        durable = self.durable or durable_name_for(self.watcher_name)
        secrets = url_secrets(*self.servers)
        self._closing = False
        client = await self._connect(secrets)
        self._client = client
        pending: list[Msg] = []
        try:
            subscription = await self._subscribe(client.jetstream(), durable, secrets)
            while True:
                try:
                    pending = await subscription.fetch(self.batch_size, timeout=self.fetch_timeout)
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
                        ConnectionError(f"gave up after {self.reconnect_attempts} reconnects"),
                        secrets,
                    )
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
                            self.watcher_name, "nats", self.stream, str(sequence)
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
                            stream=self.stream,
                            sequence=sequence,
                            error=scrub(f"{type(exc).__name__}: {exc}", secrets),
                        )
        finally:
            self._client = None
            self._closing = True
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await _release(pending)
                await client.close()

    async def cleanup(self) -> None:
        """Close the connection if ``run()`` was abandoned without being finalized."""
        client, self._client = self._client, None
        if client is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await client.close()

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

        servers = ", ".join(redact_url(url) for url in self.servers)

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
            with anyio.fail_after(self.connect_timeout):
                client: Client = await nats.connect(
                    servers=list(self.servers),
                    name=f"watchkeeper:{watcher}",
                    allow_reconnect=True,
                    max_reconnect_attempts=self.reconnect_attempts,
                    reconnect_time_wait=2,
                    connect_timeout=min(5.0, self.connect_timeout),
                    # A server that stops answering (a network path dropping every packet)
                    # is found by its missing PONGs: after 2 unanswered pings, reconnect.
                    ping_interval=self.ping_interval,
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
    ) -> JetStreamContext.PullSubscription:
        """Bind to the durable consumer, creating it first when the stream has none."""
        import nats.errors
        import nats.js.errors
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        try:
            try:
                await js.consumer_info(self.stream, durable)
            except nats.js.errors.NotFoundError:
                config = ConsumerConfig(
                    durable_name=durable,
                    name=durable,
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=self.ack_wait,
                    max_ack_pending=self.max_ack_pending,
                    deliver_policy=DeliverPolicy.ALL
                    if self.deliver == "all"
                    else DeliverPolicy.NEW,
                    filter_subject=self.subject,
                )
                await js.add_consumer(self.stream, config=config)
                log.info("nats_consumer_created", stream=self.stream, durable=durable)
            return await js.pull_subscribe_bind(durable=durable, stream=self.stream)
        except nats.errors.Error as exc:
            raise BrokerSourceError(
                self._name, f"binding consumer {durable!r} of stream {self.stream!r}", exc, secrets
            ) from exc

    def _payload(self, message: Msg, sequence: int) -> dict[str, Any]:
        metadata = message.metadata
        published = metadata.timestamp
        return {
            "stream": self.stream,
            "subject": message.subject,
            "sequence": sequence,
            "published": None if published is None else published.isoformat(),
            "headers": dict(message.headers) if message.headers else None,
            "data": decode_body(message.data),
        }


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
