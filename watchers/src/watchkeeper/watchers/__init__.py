"""watchkeeper.watchers: ready-made watchers, each a ``BaseEventTrigger``.

- :class:`DirectoryWatcher`: one event per new file in a directory.
- :class:`SqlTableWatcher`: one event per new row of a SQLite, PostgreSQL or MySQL/MariaDB
  table.
- :class:`HttpPollWatcher`: one event per new item of a JSON endpoint (cursor pagination,
  conditional requests, backoff); the ``http`` extra.
- :class:`RedisStreamWatcher`: one event per entry of a Redis stream (extra ``redis``).
- :class:`NatsJetStreamWatcher`: one event per message of a JetStream stream (extra ``nats``).
- :class:`RabbitMQWatcher`: one event per message of a RabbitMQ queue (extra ``rabbitmq``).
- :class:`MqttWatcher`: one event per MQTT message of some topics (extra ``mqtt``).
- :class:`KafkaWatcher`: one event per record of some Kafka topics, a batch per fetch
  (extra ``kafka``).
- :class:`SqsWatcher`: one event per message of an Amazon SQS queue, a batch per receive
  (extra ``sqs``).
- :class:`PubSubWatcher`: one event per message of a Google Cloud Pub/Sub subscription, a
  batch per pull (extra ``pubsub``).
- :class:`S3PrefixWatcher`: one event per new object under a prefix of an S3 bucket, a batch
  per listed page (extra ``s3``).
- :class:`PostgresChangesWatcher`: one event per row change of PostgreSQL tables, through
  logical decoding, a batch of whole source transactions at a time (extra ``postgres-cdc``).

The watchers of replayable sources (files, tables, HTTP cursors, Redis streams, Kafka,
PostgreSQL's logical replication slots) commit their
position with their events (the directory and table watchers a batch at a time, with
``TriggerEventBatch``, and catching items that arrive late inside a bounded lag window); those
of acknowledged sources (JetStream, RabbitMQ, MQTT, SQS, Pub/Sub) acknowledge a message only after its event
committed and give the event a ``dedup_key``, so a redelivered message writes nothing. Either
way a restarted watcher neither loses nor repeats an item. Their state keys and dedup keys
start with the watcher's name (``<name>.watermark``, ``<name>.cursor``, ...), so several
watchers share an asset; each class's docstring lists its keys and how to rewind it. The
client libraries are imported only when such a watcher runs: this package imports without any
extra installed.
"""

from __future__ import annotations

from ._broker import BrokerSourceError
from ._sql import SqlSourceError
from .directory import DirectoryWatcher
from .http_poll import HttpPollWatcher, HttpSourceError
from .kafka import KafkaWatcher
from .mqtt import MqttWatcher
from .nats_jetstream import NatsJetStreamWatcher
from .postgres_changes import PostgresChangesError, PostgresChangesWatcher
from .pubsub import PubSubWatcher
from .rabbitmq import RabbitMQWatcher
from .redis_stream import RedisStreamWatcher
from .s3_prefix import S3PrefixWatcher
from .sql_table import SqlTableWatcher
from .sqs import SqsWatcher

__all__ = [
    "BrokerSourceError",
    "DirectoryWatcher",
    "HttpPollWatcher",
    "HttpSourceError",
    "KafkaWatcher",
    "MqttWatcher",
    "NatsJetStreamWatcher",
    "PostgresChangesError",
    "PostgresChangesWatcher",
    "PubSubWatcher",
    "RabbitMQWatcher",
    "RedisStreamWatcher",
    "S3PrefixWatcher",
    "SqlSourceError",
    "SqlTableWatcher",
    "SqsWatcher",
]
