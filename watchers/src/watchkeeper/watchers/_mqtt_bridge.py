"""``MqttWatcher``'s side of paho: its client and network thread, and what they hand over."""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectSendStream
from watchkeeper.store.protocols import get_logger

from ._broker import redact_url

if TYPE_CHECKING:
    import paho.mqtt.client as paho

    from .mqtt import MqttParams, MqttWatcher

__all__ = ["Bridge", "Delivery", "Refused", "receive_maximum"]

log = get_logger("watchkeeper.watchers.mqtt")

_FATAL_CONNACK = frozenset({0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C})
"""CONNACK reason codes retrying cannot fix: protocol, client id, credentials, ban, auth."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message from the network thread, stamped with the connection it came on."""

    connection: int
    message: paho.MQTTMessage


@dataclass(frozen=True, slots=True)
class Refused:
    """The broker refused the connection for a reason retrying cannot fix."""

    reason: str


def receive_maximum(params: MqttParams) -> int:
    """The Receive Maximum asked of the broker: ``max_in_flight``, raised to two batches when
    lower (the next batch arrives while one commits)."""
    if params.batch_size == 1:
        return params.max_in_flight
    return min(65535, max(params.max_in_flight, 2 * params.batch_size))


class Bridge:
    """paho's client and network thread, and what they hand to the event loop.

    Runs in three places: ``start``/``stop`` in a worker thread (they block), the ``_on_*``
    callbacks in paho's network thread, ``ack`` on the event loop. ``connection`` counts the
    connects and disconnects; a message may be acknowledged only on the connection it came
    on, because after a reconnect the broker resends it under the same packet id, which the
    acknowledgement of the resent copy frees for reuse: acknowledging the old copy too could
    acknowledge another message that took the id.
    """

    def __init__(
        self,
        watcher: MqttWatcher,
        client_id: str,
        send: MemoryObjectSendStream[Delivery | Refused],
        token: anyio.lowlevel.EventLoopToken,
    ) -> None:
        self.watcher = watcher
        self.watcher_name = watcher.watcher_name
        self.client_id = client_id
        self.send = send
        self.token = token
        self.settled = anyio.Event()
        """Set once the first connect succeeded, or the broker refused the watcher for good."""
        self.refused: str | None = None
        self.lock = threading.Lock()
        self.connection = 0
        parts = urlsplit(watcher.params.url)
        self.secrets = [unquote(parts.password)] if parts.password else []
        self.client: paho.Client | None = None
        self.stopping = False

    # -- worker thread -------------------------------------------------------------------------

    def start(self) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        watcher = self.watcher
        parts = urlsplit(watcher.params.url)
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=paho.MQTTv5,
            manual_ack=True,
        )
        if parts.username is not None:
            client.username_pw_set(
                unquote(parts.username), None if parts.password is None else unquote(parts.password)
            )
        if parts.scheme == "mqtts":
            client.tls_set_context(ssl.create_default_context())
        client.reconnect_delay_set(1, watcher.params.reconnect_max)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = watcher.params.session_expiry
        properties.ReceiveMaximum = receive_maximum(watcher.params)
        port = parts.port or (8883 if parts.scheme == "mqtts" else 1883)
        client.connect_async(
            parts.hostname or "",
            port,
            keepalive=watcher.params.keepalive,
            clean_start=False,
            properties=properties,
        )
        self.client = client
        client.loop_start()

    def stop(self) -> None:
        self.stopping = True
        client = self.client
        if client is None:
            return
        client.disconnect()  # the session stays: its expiry was set at connect
        client.loop_stop()

    # -- event loop ----------------------------------------------------------------------------

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery`` if its connection is still the current one."""
        client = self.client
        if client is None:
            return
        with self.lock:
            if delivery.connection == self.connection:
                client.ack(delivery.message.mid, delivery.message.qos)

    # -- paho's network thread -----------------------------------------------------------------

    def _hand_over(self, item: Delivery | Refused) -> bool:
        """Send ``item`` to the event loop, waiting for room; False once the run is over."""
        try:
            anyio.from_thread.run(self.send.send, item, token=self.token)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
            return False  # the run ended; the broker resends what was not acknowledged
        return True

    def _on_connect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        if reason.is_failure:
            text = f"the broker refused the connection: {reason}"
            log.warning("mqtt_refused", watcher=self.watcher_name, reason=str(reason))
            if reason.value in _FATAL_CONNACK:
                self.refused = text
                self.stopping = True
                client.disconnect()
                self._settle()
                self._hand_over(Refused(text))
            return
        with self.lock:
            self.connection += 1
        log.info(
            "mqtt_connected",
            watcher=self.watcher_name,
            client_id=self.client_id,
            session_present=bool(getattr(flags, "session_present", False)),
        )
        options = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
        client.subscribe([(topic, options) for topic in self.watcher.params.topics])
        self._settle()
        self._report(None)

    def _settle(self) -> None:
        if not self.settled.is_set():
            try:
                anyio.from_thread.run_sync(self.settled.set, token=self.token)
            except RuntimeError:
                pass  # the event loop is gone

    def _on_disconnect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        with self.lock:
            self.connection += 1
        if not self.stopping:
            log.warning("mqtt_disconnected", watcher=self.watcher_name, reason=str(reason))
            url = redact_url(self.watcher.params.url)
            self._report(f"{self.watcher._name}: connection to {url} lost ({reason}), reconnecting")

    def _report(self, trouble: str | None) -> None:
        """The watcher's report_source, called on the event loop."""
        try:
            anyio.from_thread.run_sync(self.watcher.report_source, trouble, token=self.token)
        except RuntimeError:
            pass  # the event loop is gone

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        with self.lock:
            connection = self.connection
        self._hand_over(Delivery(connection, message))
