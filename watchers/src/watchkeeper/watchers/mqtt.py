"""``MqttWatcher``: one event per MQTT message of some topics, acknowledged after its commit.

**Why paho-mqtt, in a thread.** QoS 1 is at-least-once only if the client sends its PUBACK after
the message is safe. aiomqtt (like paho's default mode) acknowledges as soon as the message is
handed to the application, before our commit, so a crash there loses it. paho-mqtt 2 has
``manual_ack=True`` and ``client.ack(mid, qos)``: this module runs paho's network loop in its
thread (``loop_start``), hands each message to the event loop through a bounded memory stream
(the network thread waits while the stream is full, so a slow store slows the broker down
instead of piling up messages), and acknowledges a message only after its event committed.

**What survives a crash** (a ``kill -9`` of the daemon at any point): everything the broker
still holds for the watcher's session. The watcher connects with MQTT 5, a fixed client id
and ``Clean Start = 0``, with a session expiry of ``session_expiry`` seconds, so after the
connection drops the broker keeps the subscriptions, every QoS 1 message sent but not yet
acknowledged, and the messages published meanwhile. On the next connect it resends the
unacknowledged ones: those whose events committed are suppressed by their ``dedup_key``
(nothing written) and acknowledged, the others become events. What does **not** survive:

- messages published with QoS 0 (delivered at most once whatever we do);
- messages published while the broker holds no session for the watcher: before its first
  connect, or after the session expired (down longer than ``session_expiry``);
- messages beyond the broker's per-client queue while the watcher is away or behind
  (Mosquitto's ``max_queued_messages``, 1000 by default, drops the excess: raise it for long
  outages or large bursts);
- a broker that loses its sessions (restarted without persistence, or killed before saving).

A packet id (``mid``) is a 16-bit number reused by the broker once acknowledged, not an
identity: the ``dedup_key`` comes from the message itself, see :class:`MqttWatcher`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from pydantic import Field, ValidationInfo, field_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import (
    BrokerSourceError,
    content_hash,
    decode_body,
    make_dedup_key,
    receive_batch,
    redact_url,
)
from ._mqtt_bridge import Bridge, Delivery, Refused, receive_maximum
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
    import paho.mqtt.client as paho

__all__ = ["MqttParams", "MqttWatcher"]

log = get_logger(__name__)

MissingId = Literal["hash", "emit"]

_STOP_TIMEOUT = 5.0
_CLIENT_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def client_id_for(watcher_name: str) -> str:
    """A stable MQTT client id from a watcher name (the session is found by it)."""
    if _CLIENT_ID.fullmatch(watcher_name):
        return f"watchkeeper-{watcher_name}"
    return "watchkeeper-" + hashlib.sha256(watcher_name.encode()).hexdigest()[:24]


class MqttParams(WatcherParams):
    """The parameters of :class:`MqttWatcher`."""

    topics: list[str]
    """A topic filter or a list of them (``+``/``#`` allowed)."""
    url: Text = "mqtt://127.0.0.1:1883"
    """``mqtt://[user[:password]@]host[:port]`` (``mqtts://`` for TLS, port 8883 by default);
    the password is never shown."""
    client_id: OptionalText = None
    """The MQTT client id, which names the session (default ``watchkeeper-<watcher name>``;
    two watchers must not share one)."""
    dedup_field: OptionalText = None
    """A dotted path to the message's identity in its JSON body (e.g. ``"meta.id"``)."""
    dedup_property: OptionalText = None
    """An MQTT 5 user property holding the message's identity (before ``dedup_field``)."""
    missing_id: MissingId = "hash"
    """What a message without an identity becomes: ``"hash"`` (keyed by a hash of topic and
    bytes) or ``"emit"`` (no key, at least once)."""
    max_in_flight: Annotated[int, Field(ge=1, le=65535)] = 100
    """At most this many unacknowledged messages at a time (the Receive Maximum)."""
    session_expiry: Count = 7 * 24 * 3600
    """Seconds the broker keeps the session after a disconnect."""
    keepalive: Count = 15
    """Seconds of silence before a ping; a ping unanswered as long drops the connection."""
    connect_timeout: Seconds = 30.0
    """Seconds the first connect may take."""
    reconnect_max: Count = 30
    """The longest wait between reconnections, in seconds (1 s, doubling)."""
    batch_size: Annotated[int, Field(ge=1, le=65535)] = 100
    """At most this many messages committed together in one transaction, then acknowledged
    (a PUBACK each, after the commit); ``1`` commits each alone. The Receive Maximum is raised
    to twice it when ``max_in_flight`` is lower."""
    batch_linger: SecondsOrZero = 0.0
    """Seconds a batch waits, after its first message, for more (``0``: what has arrived)."""

    added_later: ClassVar[frozenset[str]] = frozenset({"batch_size", "batch_linger"})

    @field_validator("topics", mode="before")
    @classmethod
    def _topic_list(cls, value: object, info: ValidationInfo) -> object:
        return text_list(
            value,
            info,
            whole="topics must be a topic filter or a non-empty list of them",
            each="a topic filter",
        )

    @field_validator("url")
    @classmethod
    def _mqtt_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError(
                f"url must be mqtt://host[:port] or mqtts://host[:port], got {redact_url(value)!r}"
            )
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise ValueError(f"url {redact_url(value)!r} has a bad port") from None
        return value


class MqttWatcher(ReadyMadeWatcher[MqttParams]):
    """Yields one event per QoS 1 message on some MQTT topics, acknowledged after its commit.

    ``url`` is ``mqtt://[user[:password]@]host[:port]`` (``mqtts://`` for TLS, port 8883 by
    default). The payload is ``{"topic", "qos", "retain", "content_type", "user_properties",
    "data"}``: ``data`` is the message as JSON when it is UTF-8 JSON, else its text, else
    ``{"base64": ...}``; ``user_properties`` the MQTT 5 user properties as an object.

    The identity of a message, for its ``dedup_key`` (``<watcher name>:mqtt:<topic>:<id>``):
    the MQTT 5 user property ``dedup_property`` when set and present, else the JSON field
    ``dedup_field`` of the message (a dotted path, e.g. ``"meta.id"``) when set and present.
    A message with neither follows ``missing_id``: ``"hash"`` (default) keys it by a SHA-256
    of its topic and bytes, so it is exactly once, but identical messages on one topic are one
    event while the first is remembered (``[events] dedup_retention_days``): sensors that
    repeat a reading need an id; ``"emit"`` gives no key, at least once (a crash between the
    commit and the ack repeats the message).

    The session: MQTT 5, client id ``client_id`` (default ``watchkeeper-<watcher name>``;
    two watchers must not share one), kept by the broker ``session_expiry`` seconds after a
    disconnect; at most ``max_in_flight`` unacknowledged messages at a time (the Receive
    Maximum the broker honours). Subscriptions are renewed on every connect without resending
    retained messages (retain handling 1).

    Connection: the client pings the broker when nothing else was sent for ``keepalive``
    seconds and drops a connection whose ping goes unanswered for as long (a broker gone
    silent behind a network path that drops every packet); paho then reconnects by itself
    (1 s, doubling up to ``reconnect_max`` seconds, logged as
    ``mqtt_disconnected``/``mqtt_connected``; the watcher's status is ``backing_off``
    meanwhile), for as long as it takes; messages of the lost connection that were not acknowledged yet are
    emitted but not acknowledged (the broker resends them on the new connection, and the
    resent copy is suppressed and acknowledged). ``run()`` raises
    :class:`BrokerSourceError` when the first connect does not succeed within
    ``connect_timeout`` seconds, or when the broker refuses the watcher (bad credentials, not
    authorized, client id rejected); the daemon then restarts it with its backoff.

    State keys: none; the broker's session is the position.

    How to rewind it: MQTT cannot replay; publish again (under a new watcher name to emit
    messages whose ids are still remembered).

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = MqttParams
    client = ("paho", "mqtt")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bridge: Bridge | None = None
        self._name = f"{type(self).__name__}({', '.join(self.params.topics)!r})"

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} url={redact_url(self.params.url)!r} topics={self.params.topics!r} "
            f"connected={self._bridge is not None}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        client_id = self.params.client_id or client_id_for(self.watcher_name)
        send, receive = anyio.create_memory_object_stream[Delivery | Refused](
            receive_maximum(self.params)
        )
        bridge = Bridge(self, client_id, send, anyio.lowlevel.current_token())
        self._bridge = bridge
        try:
            with receive:
                await anyio.to_thread.run_sync(bridge.start)
                with anyio.move_on_after(self.params.connect_timeout):
                    await bridge.settled.wait()
                if not bridge.settled.is_set() or bridge.refused:
                    reason = (
                        bridge.refused or f"no connection within {self.params.connect_timeout} s"
                    )
                    raise BrokerSourceError(
                        self._name,
                        f"connecting to {redact_url(self.params.url)}",
                        ConnectionRefusedError(reason),
                        bridge.secrets,
                    )
                size, linger = self.params.batch_size, self.params.batch_linger
                while True:
                    try:
                        items = await receive_batch(receive, size, linger)
                    except anyio.EndOfStream:
                        return
                    deliveries: list[Delivery] = []
                    for item in items:
                        if isinstance(item, Refused):
                            raise BrokerSourceError(
                                self._name,
                                f"connecting to {redact_url(self.params.url)}",
                                ConnectionRefusedError(item.reason),
                                bridge.secrets,
                            )
                        deliveries.append(item)
                    events = [
                        TriggerEvent(
                            self._payload(item.message), dedup_key=self._dedup_key(item.message)
                        )
                        for item in deliveries
                    ]
                    # One commit for the batch (batch_size=1: for each message alone).
                    yield TriggerEventBatch(events) if len(events) > 1 else events[0]
                    # Committed (or suppressed as resent copies): the broker may forget them.
                    for item in deliveries:
                        bridge.ack(item)
        finally:
            # The receive side is closed by now (a network thread waiting for room in the
            # stream gets BrokenResourceError); closing the send side too makes every later
            # hand-over fail at once. Both on the event loop: the streams are not thread-safe.
            send.close()
            self._bridge = None
            with anyio.move_on_after(_STOP_TIMEOUT, shield=True):
                await anyio.to_thread.run_sync(bridge.stop, abandon_on_cancel=True)

    async def cleanup(self) -> None:
        """Stop the network thread if ``run()`` was abandoned without being finalized."""
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            with anyio.move_on_after(_STOP_TIMEOUT, shield=True):
                await anyio.to_thread.run_sync(bridge.stop, abandon_on_cancel=True)

    def _dedup_key(self, message: paho.MQTTMessage) -> str | None:
        identity = self._identity(message)
        if identity is None:
            if self.params.missing_id == "emit":
                return None
            identity = content_hash(message.topic.encode(), bytes(message.payload))
        return make_dedup_key(self.watcher_name, "mqtt", message.topic, identity)

    def _identity(self, message: paho.MQTTMessage) -> str | None:
        if self.params.dedup_property is not None:
            for name, value in _user_properties(message):
                if name == self.params.dedup_property and value:
                    return value
        if self.params.dedup_field is not None:
            found: Any = decode_body(bytes(message.payload))
            for part in self.params.dedup_field.split("."):
                if not isinstance(found, dict) or part not in found:
                    return None
                found = found[part]
            if isinstance(found, str) and found:
                return found
            if isinstance(found, int) and not isinstance(found, bool):
                return str(found)
        return None

    def _payload(self, message: paho.MQTTMessage) -> dict[str, Any]:
        properties = message.properties
        content_type = getattr(properties, "ContentType", None) if properties else None
        user = _user_properties(message)
        return {
            "topic": message.topic,
            "qos": message.qos,
            "retain": bool(message.retain),
            "content_type": content_type,
            "user_properties": dict(user) if user else None,
            "data": decode_body(bytes(message.payload)),
        }


def _user_properties(message: paho.MQTTMessage) -> list[tuple[str, str]]:
    properties = message.properties
    found = getattr(properties, "UserProperty", None) if properties else None
    return [(str(name), str(value)) for name, value in found or []]
