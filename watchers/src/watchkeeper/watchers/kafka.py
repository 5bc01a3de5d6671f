"""``KafkaWatcher``: one event per record of some Kafka topics, exactly once.

Kafka is a replayable source: every record keeps its offset in its partition, so the watcher
keeps its own position, the next offset of each partition, in the asset state and commits it
with each batch of events (a :class:`~watchkeeper.triggerer.TriggerEventBatch`: the events and
the offsets after them in one transaction). On start it seeks each partition to the stored
offset, so a restarted watcher reads on after the last batch that committed: nothing is lost
and nothing is emitted twice, without Kafka transactions and without trusting the broker's
consumer-group offsets. Each event also carries the ``dedup_key``
``<watcher name>:<topic>:<partition>:<offset>``, so a record read again (after a rewind of the
offsets by hand, say) writes nothing.

The partitions are *assigned* to the watcher (``assign``), never balanced by a consumer group:
the daemon's lease on the watcher already makes one process its only reader. With ``group_id``
set, the offsets are also committed to that group, after our own commit, so Kafka's tools show
the watcher's lag; that commit is for display only and the watcher never reads it back.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

import anyio
from pydantic import Field, ValidationInfo, field_validator, model_validator
from watchkeeper.store.protocols import get_logger
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch

from ._broker import BrokerSourceError, decode_body, make_dedup_key, retry_delay, scrub
from ._common import close_bounded, import_off_loop
from ._params import Count, OptionalText, ReadyMadeWatcher, Seconds, WatcherParams, text_list

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import ConsumerRecord, TopicPartition

__all__ = ["KafkaParams", "KafkaWatcher"]

log = get_logger(__name__)

Start = Literal["earliest", "latest"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

Offsets = dict[str, dict[str, int]]
"""``{topic: {partition (as text): next offset}}``: the watermark, as stored."""

_CLIENT_MODULES = ("aiokafka", "aiokafka.errors", "aiokafka.structs", "aiokafka.helpers")
_CLIENT_MARGIN = 5.0
"""Seconds the client's own request timeout exceeds ``request_timeout``."""


def _text_list(name: str, value: object, info: ValidationInfo) -> object:
    value = text_list(
        value,
        info,
        whole=f"{name} must be a str or a non-empty list of str",
        each=f"each of {name}",
    )
    if len(set(value)) != len(value):
        raise ValueError(f"{name} lists a name twice")
    return value


class KafkaParams(WatcherParams):
    """The parameters of :class:`KafkaWatcher`."""

    topics: list[str]
    """The topic, or a list of them; every partition of each is read."""
    bootstrap_servers: list[str] = Field(default_factory=lambda: ["127.0.0.1:9092"])
    """The brokers to bootstrap from, ``host:port`` or a list of them."""
    start: Start = "earliest"
    """Where a partition without stored offset begins: ``"earliest"`` (its first record
    still kept) or ``"latest"`` (records produced after the watcher's first start)."""
    batch_size: Count = 500
    """At most this many records per batch (one transaction)."""
    poll_timeout: Seconds = 1.0
    """The longest one fetch waits for records, in seconds; an idle fetch then checks that
    the brokers still answer."""
    group_id: OptionalText = None
    """A consumer group to which the offsets are also committed after each batch committed
    (for Kafka's tools only; the watcher never reads them)."""
    security_protocol: SecurityProtocol = "PLAINTEXT"
    """``"PLAINTEXT"``, ``"SSL"``, ``"SASL_PLAINTEXT"`` or ``"SASL_SSL"`` (SSL with the
    system's certificate authorities)."""
    sasl_mechanism: SaslMechanism = "PLAIN"
    """``"PLAIN"``, ``"SCRAM-SHA-256"`` or ``"SCRAM-SHA-512"`` (with a SASL protocol)."""
    sasl_username: OptionalText = None
    """The SASL user name."""
    sasl_password: OptionalText = None
    """The SASL password; never shown in a ``repr``, an error or the watcher's status."""
    request_timeout: Seconds = 30.0
    """Seconds each request to a broker may take (connecting included) before the
    connection counts as lost."""
    reconnect_attempts: Count = 10
    """Failed reconnections in a row before ``run()`` raises :class:`BrokerSourceError`."""

    @field_validator("topics", mode="before")
    @classmethod
    def _topic_list(cls, value: object, info: ValidationInfo) -> object:
        return _text_list("topics", value, info)

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _server_list(cls, value: object, info: ValidationInfo) -> object:
        value = _text_list("bootstrap_servers", value, info)
        assert isinstance(value, list)
        for server in value:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit() or "/" in server or "@" in server:
                raise ValueError(f"bootstrap server {server!r} must be host:port")
        return value

    @model_validator(mode="after")
    def _sasl_needs_protocol(self) -> KafkaParams:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and (self.sasl_username is None or self.sasl_password is None):
            raise ValueError(f"{self.security_protocol} needs sasl_username and sasl_password")
        if not sasl and (self.sasl_username is not None or self.sasl_password is not None):
            raise ValueError("sasl_username and sasl_password need a SASL_ security_protocol")
        return self


def _key(partition: int) -> str:
    return str(partition)


def _header(value: bytes | None) -> Any:
    return None if value is None else decode_body(value)


class KafkaWatcher(ReadyMadeWatcher[KafkaParams]):
    """Yields one event per record of some Kafka topics, a batch per fetch.

    The payload is ``{"topic", "partition", "offset", "timestamp", "key", "headers",
    "data"}``: the record's timestamp in milliseconds since the epoch, its key and header
    values as text (``{"base64": ...}`` when not UTF-8, null when absent), the headers as a
    list of ``[name, value]`` pairs (or null), and the value as JSON when it is UTF-8 JSON,
    else its text, else ``{"base64": ...}`` (null for a tombstone). Records of one partition
    come in offset order; of a transactional producer, only committed ones
    (``read_committed``).

    Exactly once: the offsets after each fetch (the next offset of every partition) are the
    state of the batch of its records, committed with them in one transaction; on start each
    partition is sought to its stored offset, or to ``start`` (``"earliest"``/``"latest"``)
    when it has none. A crash before the commit reads the batch again; after it, reads on.
    Every event also has the ``dedup_key`` ``<watcher name>:<topic>:<partition>:<offset>``.
    With ``start="latest"``, records produced before the first batch commits but after a
    crash of the first run are not read (no offset was stored yet). When a stored offset is
    older than the partition's retention, the partition restarts at its earliest record (what
    was deleted is gone). Partitions added to a topic are read from the next start of the
    watcher.

    With ``group_id`` the same offsets are committed to that consumer group once the batch
    committed (a failure there is logged as ``kafka_group_commit_failed`` and changes
    nothing else): Kafka's tools then show the watcher's lag. The group never assigns
    partitions: the watcher reads every partition of its topics itself.

    Connection: each call to the brokers (connecting, a fetch, a seek) must answer within
    ``request_timeout`` + ``poll_timeout`` seconds; a fetch waits at most ``poll_timeout``
    seconds for records and an idle one is followed by a request for the partitions' end
    offsets, so a broker that stopped answering (behind a network path that drops every
    packet, say) is found within that time rather than retried quietly inside the client. A lost or unreachable broker is retried on a new
    client with exponential backoff, ``reconnect_attempts`` times in a row, meanwhile the
    watcher's status is ``backing_off`` with the reason (logged as ``kafka_reconnecting``);
    then ``run()`` raises :class:`BrokerSourceError` and the daemon restarts the watcher with
    its own backoff. The new client seeks to the committed offsets, so nothing is skipped or
    repeated across a reconnect. ``sasl_password`` never appears in a ``repr``, an error or
    the status.

    State key (in each watched asset, ``<name>`` being the ``AssetWatcher``'s name):

    - ``<name>.offsets``: ``{"<topic>": {"<partition>": <next offset>}}``.

    How to rewind it: stop the watcher, set a partition's next offset in ``<name>.offsets``
    (or delete the key to start over from ``start``) and start it again.

    :raises ImportError: the client library is missing (naming the extra to install).
    :raises TypeError: a parameter of the wrong type, naming it.
    :raises ValueError: a parameter out of its bounds, naming it.
    """

    params_model = KafkaParams
    positional = 2
    client = ("aiokafka", "kafka")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._consumer: AIOKafkaConsumer | None = None
        self._troubled = False
        self._name = f"{type(self).__name__}({', '.join(self.params.topics)!r})"
        self._secrets = [self.params.sasl_password] if self.params.sasl_password else []
        self._prefixes: dict[Any, str] = {}

    def __repr__(self) -> str:
        user = "" if self.params.sasl_username is None else f" user={self.params.sasl_username!r}"
        return (
            f"<{type(self).__name__} topics={self.params.topics!r} "
            f"servers={self.params.bootstrap_servers!r}{user} "
            f"connected={self._consumer is not None}>"
        )

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[TriggerEvent | TriggerEventBatch]:
        await import_off_loop(*_CLIENT_MODULES)
        from aiokafka.errors import KafkaError

        key = f"{self.watcher_name}.offsets"
        self._prefixes = {}  # dedup key prefixes hold the watcher's name: worked out per run
        offsets = await _stored(self.asset_state_store, key, self._name)
        failures = 0
        while True:
            consumer = self._new_consumer()
            self._consumer = consumer
            try:
                partitions = await self._open(consumer, offsets)
                while True:
                    batch = await self._call(
                        "fetching records",
                        consumer.getmany(
                            timeout_ms=round(self.params.poll_timeout * 1000),
                            max_records=self.params.batch_size,
                        ),
                    )
                    failures = 0
                    if not batch:
                        # Idle: make sure a broker still answers (a dead one leaves getmany
                        # returning nothing forever while the client retries inside).
                        await self._call(
                            "checking the end offsets", consumer.end_offsets(partitions)
                        )
                        continue
                    events, after = self._events(batch, offsets)
                    yield TriggerEventBatch(events, state={key: after})
                    offsets = after  # committed
                    if self.params.group_id is not None:
                        await self._commit_group(consumer, batch)
            except (BrokerSourceError, KafkaError, OSError) as exc:
                error = (
                    exc
                    if isinstance(exc, BrokerSourceError)
                    else BrokerSourceError(self._name, "reading", exc, self._secrets)
                )
                failures += 1
                if failures > self.params.reconnect_attempts:
                    if error is exc:
                        raise
                    raise error from exc
                self._troubled = True
                delay = retry_delay(
                    self,
                    log,
                    "kafka_reconnecting",
                    str(error),
                    failures,
                    topics=self.params.topics,
                    watcher=self.watcher_name,
                )
            finally:
                self._consumer = None
                await close_bounded(consumer.stop)
            await anyio.sleep(delay)

    async def cleanup(self) -> None:
        """Close the client if ``run()`` was abandoned without being finalized."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await close_bounded(consumer.stop)

    def _new_consumer(self) -> AIOKafkaConsumer:
        from aiokafka import AIOKafkaConsumer

        # The client's own request timeout is longer than each call's bound here, so a broker
        # that stops answering fails our call (and shows as backing_off) rather than being
        # retried quietly inside the client.
        timeout_ms = round((self.params.request_timeout + _CLIENT_MARGIN) * 1000)
        options: dict[str, Any] = {}
        if "SSL" in self.params.security_protocol:
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context()
        if self.params.security_protocol.startswith("SASL_"):
            options.update(
                sasl_mechanism=self.params.sasl_mechanism,
                sasl_plain_username=self.params.sasl_username,
                sasl_plain_password=self.params.sasl_password,
            )
        return AIOKafkaConsumer(
            bootstrap_servers=self.params.bootstrap_servers,
            client_id=f"watchkeeper-{self.watcher_name}"[:200],
            group_id=self.params.group_id,
            enable_auto_commit=False,
            # A stored offset past the retention restarts at the earliest record kept.
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            request_timeout_ms=timeout_ms,
            security_protocol=self.params.security_protocol,
            **options,
        )

    async def _call(self, action: str, awaitable: Any) -> Any:
        """Await one client call, bounded by the request timeout (plus the fetch's wait)."""
        from aiokafka.errors import KafkaError

        limit = self.params.request_timeout + self.params.poll_timeout
        try:
            with anyio.fail_after(limit):
                result = await awaitable
        except (KafkaError, OSError, TimeoutError) as exc:
            cause: BaseException = exc
            if isinstance(exc, TimeoutError) and not str(exc):
                cause = TimeoutError(f"no answer within {limit:g} s")
            raise BrokerSourceError(
                self._name,
                f"{action} ({', '.join(self.params.bootstrap_servers)})",
                cause,
                self._secrets,
            ) from exc
        if self._troubled:
            self._troubled = False
            self.report_source(None)  # it answers again
        return result

    async def _open(self, consumer: AIOKafkaConsumer, offsets: Offsets) -> list[TopicPartition]:
        """Start the client, assign every partition of the topics, seek each to its offset."""
        from aiokafka.structs import TopicPartition

        await self._call("connecting", consumer.start())
        known = await self._call("reading the topics", consumer.topics())
        missing = [topic for topic in self.params.topics if topic not in known]
        if missing:
            raise BrokerSourceError(
                self._name,
                "reading the topics",
                LookupError(f"no topic {', '.join(map(repr, missing))} on the brokers"),
                self._secrets,
            )
        partitions = [
            TopicPartition(topic, number)
            for topic in self.params.topics
            for number in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(partitions)
        fresh = []
        for tp in partitions:
            stored = offsets.get(tp.topic, {}).get(_key(tp.partition))
            if stored is None:
                fresh.append(tp)
            else:
                consumer.seek(tp, stored)
        if fresh:
            if self.params.start == "earliest":
                await self._call("seeking", consumer.seek_to_beginning(*fresh))
            else:
                # Resolved now, not at the first fetch: "latest" is where the watcher started.
                ends = await self._call("reading the end offsets", consumer.end_offsets(fresh))
                for tp in fresh:
                    consumer.seek(tp, ends[tp])
        return partitions

    def _events(
        self, batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]], offsets: Offsets
    ) -> tuple[list[TriggerEvent], Offsets]:
        """The events of one fetch, and the offsets after it (a new mapping)."""
        after = {topic: dict(partitions) for topic, partitions in offsets.items()}
        events = []
        name = self.watcher_name
        for tp, records in batch.items():
            # The key of each record is this prefix and its offset (a short, safe part):
            # worked out once per partition rather than checked again per record.
            prefix = self._prefixes.get(tp)
            if prefix is None:
                prefix = make_dedup_key(name, tp.topic, str(tp.partition)) + ":"
                self._prefixes[tp] = prefix
            for record in records:
                headers = record.headers
                events.append(
                    TriggerEvent(
                        {
                            "topic": tp.topic,
                            "partition": tp.partition,
                            "offset": record.offset,
                            "timestamp": record.timestamp,
                            "key": _header(record.key),
                            "headers": [[k, _header(v)] for k, v in headers] if headers else None,
                            "data": None if record.value is None else decode_body(record.value),
                        },
                        dedup_key=f"{prefix}{record.offset}",
                    )
                )
            if records:
                after.setdefault(tp.topic, {})[_key(tp.partition)] = records[-1].offset + 1
        return events, after

    async def _commit_group(
        self, consumer: AIOKafkaConsumer, batch: dict[TopicPartition, list[Any]]
    ) -> None:
        """Tell the group the offsets we committed (for Kafka's tools); a failure only logs."""
        from aiokafka.errors import KafkaError

        positions = {tp: records[-1].offset + 1 for tp, records in batch.items() if records}
        try:
            with anyio.fail_after(self.params.request_timeout):
                await consumer.commit(positions)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning(
                "kafka_group_commit_failed",
                watcher=self.watcher_name,
                group=self.params.group_id,
                reason=scrub(f"{type(exc).__name__}: {exc}", self._secrets),
            )


async def _stored(store: Any, key: str, owner: str) -> Offsets:
    """The offsets stored on the watched assets, the furthest of each partition."""
    merged: Offsets = {}
    for asset in store:
        value = await store[asset].aget(key)
        if value is None:
            continue
        with contextlib.suppress(AttributeError):
            if isinstance(value, dict) and all(
                isinstance(topic, str)
                and isinstance(partitions, dict)
                and all(
                    part.isdigit() and type(offset) is int and offset >= 0
                    for part, offset in partitions.items()
                )
                for topic, partitions in value.items()
            ):
                for topic, partitions in value.items():
                    mine = merged.setdefault(topic, {})
                    for part, offset in partitions.items():
                        mine[part] = max(offset, mine.get(part, 0))
                continue
        raise ValueError(
            f"{owner}: the asset state {key!r} is not Kafka offsets "
            f'({{"<topic>": {{"<partition>": <next offset>}}}}): {value!r}'
        )
    return merged
