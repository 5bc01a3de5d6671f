"""``RabbitMQWatcher``: one event per message of a RabbitMQ queue, exactly once.

A classic (or quorum) queue forgets a message once it is acknowledged, so the watcher
acknowledges each message manually, only after its event committed (the generator resumes
after the commit), and gives the event a ``dedup_key`` from the message's identity. A crash
between the commit and the ack makes the broker redeliver the message to the next consumer;
its event is then suppressed, writing nothing, and the redelivery is acknowledged.

**The identity of a message.** The AMQP ``message_id`` property, when the publisher set one:
the key is ``<watcher name>:amqp:<queue>:<message_id>``, so the publisher decides what "the
same message" means (a retried publish with the same id is one event). Note that aio-pika
(through aiormq) gives a message published without an id a random one, so a publish retried
through it is a new message. Many other publishers set none; ``missing_id`` says what happens
then:

- ``"hash"`` (the default): the key is a SHA-256 of the body and the headers. Exactly once
  across crashes, but two messages with the same body and headers are one event while the
  first is remembered (``[events] dedup_retention_days``): give such messages an id;
- ``"emit"``: no key; at least once: a crash between the commit and the ack repeats it;
- ``"reject"``: the message is rejected without requeueing (the queue's dead-letter exchange
  gets it, when it has one) and logged as ``rabbitmq_message_rejected``; no event.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import decimal
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import anyio
from pydantic import field_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import (
    BrokerSourceError,
    content_hash,
    decode_body,
    make_dedup_key,
    receive_batch,
    reconnect_delay,
    redact_url,
    scrub,
    url_secrets,
)
from ._common import import_off_loop
from ._params import Count, ReadyMadeWatcher, SecondsOrZero, Text, WatcherParams

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection, AbstractIncomingMessage, AbstractQueue
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["RabbitMQParams", "RabbitMQWatcher"]

log = get_logger(__name__)

MissingId = Literal["hash", "emit", "reject"]

_CLOSE_TIMEOUT = 5.0


class RabbitMQParams(WatcherParams):
    """The parameters of :class:`RabbitMQWatcher`."""

    queue: Text
    """The queue to consume."""
    url: Text = "amqp://guest:guest@127.0.0.1:5672/"
    """The broker: ``amqp://`` or ``amqps://``; its password is never shown."""
    prefetch: Count = 100
    """At most this many messages delivered and not yet acknowledged (``basic.qos``; raised
    to twice ``batch_size`` when lower)."""
    declare: bool = False
    """Declare the queue (durable) when missing; otherwise it must exist."""
    missing_id: MissingId = "hash"
    """What a message without ``message_id`` becomes: ``"hash"`` (keyed by a hash of body and
    headers), ``"emit"`` (no key, at least once) or ``"reject"`` (dead-lettered, no event)."""
    reconnect_attempts: Count = 10
    """Failed reconnections in a row before ``run()`` raises :class:`BrokerSourceError`."""
    heartbeat: Count = 10
    """Seconds between heartbeats both ways; a broker silent for about three is lost."""
    batch_size: Count = 100
    """At most this many messages committed together in one transaction, then acknowledged
    with one ``basic.ack`` (``multiple``); ``1`` commits and acknowledges each alone."""
    batch_linger: SecondsOrZero = 0.0
    """Seconds a batch waits, after its first message, for more (``0``: what has arrived)."""

    added_later: ClassVar[frozenset[str]] = frozenset({"batch_size", "batch_linger"})

    @field_validator("url")
    @classmethod
    def _amqp_url(cls, value: str) -> str:
        if not value.startswith(("amqp://", "amqps://")):
            raise ValueError(f"url must start with amqp:// or amqps://, got {redact_url(value)!r}")
        return value


class RabbitMQWatcher(ReadyMadeWatcher[RabbitMQParams]):
    """Yields one event per message of a RabbitMQ queue, acknowledged after its commit.

    The payload is ``{"queue", "message_id", "exchange", "routing_key", "content_type",
    "headers", "timestamp", "data"}``: ``data`` is the body as JSON when it is UTF-8 JSON,
    else its text, else ``{"base64": ...}``; header values that JSON cannot hold become text
    (bytes: UTF-8 or base64; times: ISO 8601; decimals: their digits).

    The queue must exist, unless ``declare`` is true (then a durable queue of that name is
    declared). At most ``prefetch`` messages are delivered and not yet acknowledged at a
    time (``basic.qos``). ``missing_id`` is the rule for messages without a ``message_id``
    (see the module's documentation).

    Connection: connecting must succeed within 10 s; heartbeats go both ways every
    ``heartbeat`` seconds and a broker silent for about three of them counts as lost (a network
    path that drops every packet). When the connection or channel is lost (also a broker
    restart, a connection closed by an operator), ``run()`` reconnects by itself, with
    exponential backoff (the watcher's status is ``backing_off`` with the reason meanwhile), up
    to ``reconnect_attempts`` consecutive failures, then raises :class:`BrokerSourceError` and the
    daemon restarts the watcher with its own backoff. The broker redelivers what the lost
    channel had not acknowledged; an ack that could not be sent is logged
    (``rabbitmq_ack_lost``) and its redelivery is suppressed by the ``dedup_key``. A missing
    queue or refused credentials raise at once. The connection is named
    ``watchkeeper:<watcher name>`` in the management UI and ``rabbitmqctl list_connections``.

    State keys: none. The queue is the position: an acknowledged message is gone from it.

    How to rewind it: a queue cannot be rewound; publish the messages again (to emit ones
    whose ``message_id`` is still remembered, run the watcher under a new name: the keys
    start with it). For a replayable log, use a RabbitMQ stream.

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = RabbitMQParams
    client = ("aio_pika", "rabbitmq")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connection: AbstractConnection | None = None
        self._consuming = False
        self._name = f"{type(self).__name__}({self.params.queue!r})"

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} url={redact_url(self.params.url)!r} queue={self.params.queue!r} "
            f"connected={self._connection is not None}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        await import_off_loop("aio_pika", "aio_pika.exceptions", "aiormq.exceptions")
        from aio_pika.exceptions import (
            AMQPConnectionError,
            AMQPError,
            AuthenticationError,
            ChannelInvalidStateError,
            ProbableAuthenticationError,
        )
        from aiormq.exceptions import ChannelClosed, ConnectionClosed

        secrets = url_secrets(self.params.url)
        fatal = (AuthenticationError, ProbableAuthenticationError)
        # A connection or channel closed under us (ChannelClosed covers a queue deleted while
        # consumed); a missing queue is caught where the queue is declared.
        transient = (
            AMQPConnectionError,
            ConnectionClosed,
            ChannelClosed,
            ChannelInvalidStateError,
            ConnectionError,
            OSError,
        )
        failures = 0
        while True:
            error: BaseException | None = None
            self._consuming = False
            try:
                async with contextlib.aclosing(self._consume(secrets)) as events:
                    async for event in events:
                        yield event
            except BrokerSourceError:
                raise
            except fatal as exc:
                raise BrokerSourceError(self._name, "logging in", exc, secrets) from exc
            except transient as exc:
                error = exc
            except AMQPError as exc:
                raise BrokerSourceError(self._name, "consuming", exc, secrets) from exc
            # A connection that got as far as consuming starts the count again.
            failures = 1 if self._consuming else failures + 1
            reason = "the channel closed" if error is None else f"{type(error).__name__}"
            if failures > self.params.reconnect_attempts:
                cause = error or ConnectionError("the channel closed")
                raise BrokerSourceError(
                    self._name,
                    f"reconnecting ({failures - 1} attempts)",
                    cause,
                    secrets,
                ) from error
            delay = reconnect_delay(failures)
            reason = scrub(f"{reason}: {error}" if error else reason, secrets)
            self.report_source(
                f"{self._name}: connection to {redact_url(self.params.url)} lost: {reason}"
            )
            log.warning(
                "rabbitmq_reconnecting",
                queue=self.params.queue,
                watcher=self.watcher_name,
                reason=reason,
                attempt=failures,
                delay=round(delay, 3),
            )
            await anyio.sleep(delay)

    async def cleanup(self) -> None:
        """Close the connection if ``run()`` was abandoned without being finalized."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await connection.close()

    async def _consume(
        self, secrets: list[str]
    ) -> AsyncGenerator[TriggerEvent | TriggerEventBatch, None]:
        """One connection's life: the events of its deliveries, acked after each commit.

        Returns when the channel closed (the caller reconnects); raises the client's errors.
        """
        import aio_pika
        from aiormq.exceptions import ChannelNotFoundEntity

        connection = await aio_pika.connect(
            self.params.url,
            timeout=10,
            # Heartbeats both ways: a broker silent for about three of them (a network path
            # that drops every packet) closes the connection, and run() reconnects.
            heartbeat=self.params.heartbeat,
            client_properties={"connection_name": f"watchkeeper:{self.watcher_name}"},
        )
        self._connection = connection
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self._window())
            try:
                queue = await channel.declare_queue(
                    self.params.queue, passive=not self.params.declare, durable=True
                )
            except ChannelNotFoundEntity as exc:
                raise BrokerSourceError(
                    self._name, f"finding queue {self.params.queue!r}", exc, secrets
                ) from exc
            log.info("rabbitmq_consuming", queue=self.params.queue, watcher=self.watcher_name)
            self._consuming = True
            self.report_source(None)
            size, linger = self.params.batch_size, self.params.batch_linger
            if size == 1:
                async with contextlib.aclosing(self._one_by_one(queue, secrets)) as events:
                    async for event in events:
                        yield event
                return
            # Deliveries go into a stream as they come (in order: each callback puts its
            # message before its first await); qos keeps at most ``room`` of them unacked.
            room = self._window()
            send: MemoryObjectSendStream[AbstractIncomingMessage]
            receive: MemoryObjectReceiveStream[AbstractIncomingMessage]
            send, receive = anyio.create_memory_object_stream(room)

            async def deliver(message: AbstractIncomingMessage) -> None:
                try:
                    send.send_nowait(message)
                except anyio.WouldBlock:
                    await send.send(message)  # past qos: cannot happen, but never drop one
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass  # this consumer is over: the broker redelivers it

            def on_closed(future: asyncio.Future[Any]) -> None:
                if not future.cancelled():
                    future.exception()  # seen: the reconnect reports why
                send.close()

            closed = cast("asyncio.Future[Any]", channel.closed())
            closed.add_done_callback(on_closed)
            with receive:
                await queue.consume(deliver)
                while True:
                    try:
                        messages = await receive_batch(receive, size, linger)
                    except anyio.EndOfStream:
                        return  # the channel closed: the caller reconnects
                    if channel.is_closed:
                        return  # their delivery tags died with it: they come again
                    batch: list[TriggerEvent] = []
                    for message in messages:
                        key = self._dedup_key(message)
                        if key is None and self.params.missing_id == "reject":
                            await self._reject(message)
                            continue
                        batch.append(TriggerEvent(self._payload(message), dedup_key=key))
                    if batch:
                        yield TriggerEventBatch(batch) if len(batch) > 1 else batch[0]
                    # Committed: one ack for the whole batch, up to its last delivery tag
                    # (the rejected ones among them are no longer outstanding).
                    unsettled = [message for message in messages if not message.processed]
                    if unsettled:
                        await self._ack(unsettled[-1], secrets, multiple=True)
        finally:
            self._connection = None
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await connection.close()

    async def _one_by_one(
        self, queue: AbstractQueue, secrets: list[str]
    ) -> AsyncGenerator[TriggerEvent, None]:
        """``batch_size=1``: each delivery committed alone, then acknowledged alone."""
        async with queue.iterator() as messages:
            async for message in messages:
                key = self._dedup_key(message)
                if key is None and self.params.missing_id == "reject":
                    await self._reject(message)
                    continue
                yield TriggerEvent(self._payload(message), dedup_key=key)
                await self._ack(message, secrets, multiple=False)

    async def _reject(self, message: AbstractIncomingMessage) -> None:
        log.warning(
            "rabbitmq_message_rejected",
            queue=self.params.queue,
            delivery_tag=message.delivery_tag,
            reason="no message_id (missing_id='reject')",
        )
        await message.reject(requeue=False)

    async def _ack(
        self, message: AbstractIncomingMessage, secrets: list[str], *, multiple: bool
    ) -> None:
        """Acknowledge a committed ``message`` (and, with ``multiple``, every earlier one)."""
        from aio_pika.exceptions import AMQPError, ChannelInvalidStateError

        try:
            await message.ack(multiple=multiple)
        except (AMQPError, ChannelInvalidStateError, ConnectionError) as exc:
            # The channel died after the commit: the broker redelivers the unacknowledged
            # messages, and their dedup_keys suppress the repeats.
            log.warning(
                "rabbitmq_ack_lost",
                queue=self.params.queue,
                message_id=message.message_id,
                error=scrub(f"{type(exc).__name__}: {exc}", secrets),
            )

    def _window(self) -> int:
        """The ``prefetch_count``: ``prefetch``, raised to two batches when lower (the next
        batch arrives while one commits; a batch of its own would wait for the ack)."""
        size = self.params.batch_size
        return self.params.prefetch if size == 1 else max(self.params.prefetch, 2 * size)

    def _dedup_key(self, message: AbstractIncomingMessage) -> str | None:
        if message.message_id:
            return make_dedup_key(self.watcher_name, "amqp", self.params.queue, message.message_id)
        if self.params.missing_id != "hash":
            return None
        headers = json.dumps(_json_value(message.headers or {}), sort_keys=True).encode()
        return make_dedup_key(
            self.watcher_name, "amqp", self.params.queue, content_hash(message.body, headers)
        )

    def _payload(self, message: AbstractIncomingMessage) -> dict[str, Any]:
        timestamp = message.timestamp
        return {
            "queue": self.params.queue,
            "message_id": message.message_id,
            "exchange": message.exchange,
            "routing_key": message.routing_key,
            "content_type": message.content_type,
            "headers": _json_value(message.headers) if message.headers else None,
            "timestamp": None if timestamp is None else timestamp.isoformat(),
            "data": decode_body(message.body),
        }


def _json_value(value: Any) -> Any:
    """An AMQP field value (headers may hold bytes, times, decimals) as JSON."""
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
