"""Broker benchmark: each broker watcher in a daemon, beside a raw consumer loop on its client.

Not a test (CI does not run it). Run by hand from the repository root, with the brokers of this
machine up (Redis 6379, NATS 4222 with JetStream, RabbitMQ 5672, Mosquitto 1883):

    uv run python benchmarks/broker_bench.py [--messages N] [--only BROKER] [--no-postgres]
        [--batch-size B] [--latency SECONDS] [--linger S] [--backlog N]

Per broker (Redis stream, Redis stream through a consumer group, NATS JetStream, RabbitMQ,
MQTT) and per backend (SQLite, PostgreSQL), N messages ``{"id": "m-<n>", "n": n, "at": <unix
time>}`` are published first (a backlog), then drained two ways, in the same run:

- *raw loop* (the ceiling for this design): the same client library receives B messages at a
  time (``XREAD``/``XREADGROUP``, ``fetch``, a consumer with ``prefetch_count=2B``, paho with
  ``manual_ack`` and a Receive Maximum of 2B: two batches in flight, as the watchers ask), turns each into the JSON payload the watcher would emit, inserts them with
  their dedup keys into tables shaped like the store's (same columns and indexes; WAL and
  ``synchronous=FULL`` on SQLite through ``sqlite3`` in a worker thread, ``executemany`` on
  asyncpg) in one transaction per batch, then acknowledges them (one ``XACK``, one ack per
  message, ``multiple=True``, one PUBACK per message);
- *ours*: a ``watchkeeper triggerer`` subprocess (the daemon, default settings, API off) running
  the ready-made watcher with ``batch_size=B`` on its own database.

The figure is messages committed per second from the first commit to the last (the daemon's
start-up, seconds on a loaded machine, is left out the same way: the raw loop's clock starts
at its first commit too); the ratio is ours ÷ raw. ``--latency S`` also publishes 100
messages per second for S seconds to the raw loop, then to an idle daemon, and reports the
percentiles of ``created_at`` (the commit's time in the store) minus the time in the message
for both. ``--backlog N``
drains N NATS messages through the daemon on SQLite and reports the time. Writes
``benchmarks/results/broker.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import asyncpg
from _raw_tables import pg_tables, sqlite_tables
from anyio.abc import Process

PG_ADMIN = os.environ.get(
    "WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
RESULTS = Path(__file__).parent / "results" / "broker.json"
BROKERS = ("redis", "redis-group", "nats", "rabbitmq", "mqtt")
WATCHER = "bench"
ASSET = "bench-asset"


def body(n: int) -> bytes:
    return json.dumps({"id": f"m-{n}", "n": n, "at": time.time()}).encode()


# -- the raw sinks: tables shaped like the store's ------------------------------------------------

_SQLITE_EVENT = (
    "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, created_at) "
    "VALUES (1, ?, ?, ?, ?, ?)"
)
_SQLITE_STATE = (
    "INSERT INTO asset_state (asset_id, key, value, version, updated_at) VALUES (1, ?, ?, 1, ?) "
    "ON CONFLICT (asset_id, key) DO UPDATE SET value = excluded.value, "
    "version = asset_state.version + 1, updated_at = excluded.updated_at"
)

Row = tuple[str, str | None]
"""``(payload_json, dedup_key)`` of one message."""


class Sink:
    """Commits one batch of rows (and a watermark, for a replayable source) per call."""

    first: float | None = None
    last: float = 0.0
    count: int = 0

    async def commit(self, rows: list[Row], watermark: str | None = None) -> None:
        await self._commit(rows, watermark)
        now = time.perf_counter()
        if self.first is None:
            self.first, self.first_count = now, len(rows)
        self.last = now
        self.count += len(rows)

    async def _commit(self, rows: list[Row], watermark: str | None) -> None:
        raise NotImplementedError

    def rate(self) -> float:
        if self.first is None or self.last <= self.first:
            return 0.0
        return (self.count - self.first_count) / (self.last - self.first)


class SqliteSink(Sink):
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for statement in sqlite_tables():
            self.conn.execute(statement)

    def _write(self, rows: list[Row], watermark: str | None) -> None:
        now = datetime.now(UTC).isoformat()
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(
            _SQLITE_EVENT, [(ASSET, WATCHER, payload, key, now) for payload, key in rows]
        )
        if watermark is not None:
            self.conn.execute(_SQLITE_STATE, (f"{WATCHER}.watermark", watermark, now))
        self.conn.execute("COMMIT")

    async def _commit(self, rows: list[Row], watermark: str | None) -> None:
        await anyio.to_thread.run_sync(self._write, rows, watermark)

    def close(self) -> None:
        self.conn.close()


class PostgresSink(Sink):
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def _commit(self, rows: list[Row], watermark: str | None) -> None:
        now = datetime.now(UTC)
        async with self.conn.transaction():
            await self.conn.executemany(
                "INSERT INTO asset_events (asset_id, asset_name, watcher, payload, dedup_key, "
                "created_at) VALUES (1, $1, $2, $3, $4, $5)",
                [(ASSET, WATCHER, payload, key, now) for payload, key in rows],
            )
            if watermark is not None:
                await self.conn.execute(
                    "INSERT INTO asset_state AS t (asset_id, key, value, version, updated_at) "
                    "VALUES (1, $1, $2, 1, $3) ON CONFLICT (asset_id, key) DO UPDATE SET "
                    "value = excluded.value, version = t.version + 1, updated_at = excluded.updated_at",
                    f"{WATCHER}.watermark",
                    watermark,
                    now,
                )


@contextlib.asynccontextmanager
async def fresh_database(backend: str, root: Path) -> AsyncIterator[str]:
    """A database URL of its own (a new SQLite file, or a new PostgreSQL database)."""
    if backend == "sqlite":
        yield f"sqlite:///{root / f'{uuid.uuid4().hex[:8]}.db'}"
        return
    name = f"wk_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(PG_ADMIN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@contextlib.asynccontextmanager
async def raw_sink(url: str) -> AsyncIterator[Sink]:
    if url.startswith("sqlite:///"):
        sink = SqliteSink(Path(url.removeprefix("sqlite:///")))
        try:
            yield sink
        finally:
            sink.close()
        return
    conn = await asyncpg.connect(url)
    try:
        for statement in pg_tables():
            await conn.execute(statement)
        yield PostgresSink(conn)
    finally:
        await conn.close()


def payload_of(fields: dict[str, Any]) -> str:
    return json.dumps(fields, separators=(",", ":"))


# -- one broker: publish, the raw loop, the watcher ----------------------------------------------


class Broker:
    """One broker's names, publisher, raw loop and watcher source for one measurement."""

    linger: float | None = None
    """``--linger``: the watchers' ``batch_linger`` (their default when ``None``)."""

    def __init__(self, kind: str, batch: int) -> None:
        self.kind = kind
        self.batch = batch
        self.tag = uuid.uuid4().hex[:10]

    def watcher(self, batch: int) -> str:
        source = self._watcher(batch)
        if self.linger is None:
            return source
        return f"{source[:-1]}, batch_linger={self.linger!r})"

    def _watcher(self, batch: int) -> str:
        t = self.tag
        if self.kind == "redis":
            return f"RedisStreamWatcher('wk-bench-{t}', block=1.0, batch_size={batch})"
        if self.kind == "redis-group":
            return f"RedisStreamWatcher('wk-bench-{t}', block=1.0, group='g', batch_size={batch})"
        if self.kind == "nats":
            return (
                f"NatsJetStreamWatcher('WKB_{t}', subject='WKB_{t}.items', fetch_timeout=1.0, "
                f"batch_size={batch}, "
                f"max_ack_pending={max(1000, 2 * batch)})"
            )
        if self.kind == "rabbitmq":
            return f"RabbitMQWatcher('wk-bench-{t}', batch_size={batch}, prefetch={batch})"
        return (
            f"MqttWatcher('wk-bench/{t}/items', client_id='wkb-{t}', dedup_field='id', "
            f"batch_size={batch}, max_in_flight={batch})"
        )

    # setting up and publishing

    async def setup(self) -> None:
        if self.kind == "nats":
            import nats

            client = await nats.connect("nats://127.0.0.1:4222")
            await client.jetstream().add_stream(
                name=f"WKB_{self.tag}", subjects=[f"WKB_{self.tag}.>"]
            )
            await client.close()
        elif self.kind == "rabbitmq":
            import aio_pika

            async with await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/") as connection:
                channel = await connection.channel()
                await channel.declare_queue(f"wk-bench-{self.tag}", durable=True)
        elif self.kind == "mqtt":
            await anyio.to_thread.run_sync(self._mqtt_session, f"wkb-{self.tag}", 3600, "items")
            await anyio.to_thread.run_sync(self._mqtt_session, f"wkr-{self.tag}", 3600, "raw")

    async def teardown(self) -> None:
        with contextlib.suppress(Exception):
            if self.kind.startswith("redis"):
                import redis.asyncio as aioredis

                client = aioredis.Redis()
                await client.delete(f"wk-bench-{self.tag}", f"wk-bench-{self.tag}-raw")
                await client.aclose()
            elif self.kind == "nats":
                import nats

                client = await nats.connect("nats://127.0.0.1:4222")
                await client.jetstream().delete_stream(f"WKB_{self.tag}")
                await client.close()
            elif self.kind == "rabbitmq":
                import aio_pika

                async with await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/") as conn:
                    channel = await conn.channel()
                    await channel.queue_delete(f"wk-bench-{self.tag}")
            elif self.kind == "mqtt":
                for client_id in (f"wkb-{self.tag}", f"wkr-{self.tag}"):
                    await anyio.to_thread.run_sync(self._mqtt_session, client_id, 0, "")

    def _mqtt_session(self, client_id: str, expiry: int, topic: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        subscribed = threading.Event()
        client.on_subscribe = lambda *_: subscribed.set()
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = expiry
        client.connect("127.0.0.1", 1883, clean_start=expiry == 0, properties=properties)
        client.loop_start()
        try:
            if expiry:
                client.subscribe(f"wk-bench/{self.tag}/{topic}", qos=1)
                subscribed.wait(10)
        finally:
            client.disconnect()
            client.loop_stop()

    async def publish(self, numbers: range, raw: bool = False, rate: float | None = None) -> None:
        """Publish ``numbers`` (to the raw loop's copy of the source when ``raw``)."""
        suffix = "-raw" if raw else ""
        interval = None if rate is None else 1.0 / rate
        start = time.perf_counter()
        if self.kind.startswith("redis"):
            import redis.asyncio as aioredis

            client = aioredis.Redis()
            for chunk in _chunks(numbers, 1 if interval else 500):
                pipe = client.pipeline(transaction=False)
                for n in chunk:
                    pipe.xadd(f"wk-bench-{self.tag}{suffix}", {"body": body(n)})
                await pipe.execute()
                await _pace(start, chunk[-1] - numbers[0] + 1, interval)
            await client.aclose()
        elif self.kind == "nats":
            import nats

            client = await nats.connect("nats://127.0.0.1:4222")
            js = client.jetstream()
            subject = f"WKB_{self.tag}.{'raw' if raw else 'items'}"
            for chunk in _chunks(numbers, 1 if interval else 500):
                acks = [await js.publish_async(subject, body(n)) for n in chunk]
                await asyncio.gather(*acks)
                await _pace(start, chunk[-1] - numbers[0] + 1, interval)
            await client.close()
        elif self.kind == "rabbitmq":
            import aio_pika

            queue = f"wk-bench-{self.tag}{suffix}"
            async with await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/") as conn:
                channel = await conn.channel()
                if raw:
                    await channel.declare_queue(queue, durable=True)
                for n in numbers:
                    message = aio_pika.Message(
                        body(n), message_id=f"m-{n}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                    )
                    await channel.default_exchange.publish(message, routing_key=queue)
                    await _pace(start, n - numbers[0] + 1, interval)
        else:
            await anyio.to_thread.run_sync(self._mqtt_publish, numbers, raw, interval)

    def _mqtt_publish(self, numbers: range, raw: bool, interval: float | None) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        publisher = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        publisher.max_inflight_messages_set(1000)
        publisher.max_queued_messages_set(0)
        publisher.connect("127.0.0.1", 1883)
        publisher.loop_start()
        topic = f"wk-bench/{self.tag}/{'raw' if raw else 'items'}"
        start = time.perf_counter()
        infos = []
        for n in numbers:
            infos.append(publisher.publish(topic, body(n), qos=1))
            if interval:
                delay = start + (n - numbers[0] + 1) * interval - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
        for info in infos:
            info.wait_for_publish(60)
        publisher.disconnect()
        publisher.loop_stop()

    # the raw loops

    async def raw(self, sink: Sink, count: int) -> None:
        """Receive ``count`` messages from the raw copy, commit ``batch`` at a time, ack."""
        await getattr(self, "_raw_" + self.kind.replace("-", "_"))(sink, count)

    async def _raw_redis(self, sink: Sink, count: int) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis()
        stream, last = f"wk-bench-{self.tag}-raw", "0-0"
        while sink.count < count:
            read = await client.xread({stream: last}, count=self.batch, block=1000)
            if not read:
                continue
            rows = []
            for raw_id, fields in read[0][1]:
                last = raw_id.decode()
                data = json.loads(fields[b"body"])
                rows.append(
                    (payload_of({"stream": stream, "id": last, "fields": {"body": data}}), None)
                )
            await sink.commit(rows, json.dumps({"id": last}))
        await client.aclose()

    async def _raw_redis_group(self, sink: Sink, count: int) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis()
        stream = f"wk-bench-{self.tag}-raw"
        await client.xgroup_create(stream, "g", id="0-0", mkstream=True)
        while sink.count < count:
            read = await client.xreadgroup("g", "raw", {stream: ">"}, count=self.batch, block=1000)
            if not read:
                continue
            rows, ids = [], []
            for raw_id, fields in read[0][1]:
                ids.append(raw_id)
                data = json.loads(fields[b"body"])
                rows.append(
                    (
                        payload_of(
                            {"stream": stream, "id": raw_id.decode(), "fields": {"body": data}}
                        ),
                        None,
                    )
                )
            await sink.commit(rows, json.dumps({"id": ids[-1].decode()}))
            await client.xack(stream, "g", *ids)
        await client.aclose()

    async def _raw_nats(self, sink: Sink, count: int) -> None:
        import nats
        import nats.errors

        client = await nats.connect("nats://127.0.0.1:4222")
        js = client.jetstream()
        sub = await js.pull_subscribe(
            f"WKB_{self.tag}.raw", durable=f"raw_{self.tag}", stream=f"WKB_{self.tag}"
        )
        while sink.count < count:
            try:
                messages = await sub.fetch(self.batch, timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            rows = []
            for message in messages:
                sequence = message.metadata.sequence.stream
                fields = {
                    "stream": f"WKB_{self.tag}",
                    "sequence": sequence,
                    "data": json.loads(message.data),
                }
                rows.append((payload_of(fields), f"{WATCHER}:nats:WKB_{self.tag}:{sequence}"))
            await sink.commit(rows)
            for message in messages:
                await message.ack()
        await client.close()

    async def _raw_rabbitmq(self, sink: Sink, count: int) -> None:
        import aio_pika

        queue_name = f"wk-bench-{self.tag}-raw"
        send, receive = anyio.create_memory_object_stream[Any](2 * self.batch)
        async with await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/") as conn:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=2 * self.batch)  # as the watcher asks
            queue = await channel.declare_queue(queue_name, durable=True)
            await queue.consume(send.send)
            while sink.count < count:
                # What has arrived, up to a batch: a backlog fills it, a trickle does not wait.
                batch = [await receive.receive()]
                while len(batch) < self.batch:
                    try:
                        batch.append(receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                rows = [
                    (
                        payload_of(
                            {
                                "queue": queue_name,
                                "message_id": m.message_id,
                                "data": json.loads(m.body),
                            }
                        ),
                        f"{WATCHER}:amqp:{queue_name}:{m.message_id}",
                    )
                    for m in batch
                ]
                await sink.commit(rows)
                await batch[-1].ack(multiple=True)

    async def _raw_mqtt(self, sink: Sink, count: int) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        send, receive = anyio.create_memory_object_stream[Any](2 * self.batch)
        token = anyio.lowlevel.current_token()
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"wkr-{self.tag}",
            protocol=paho.MQTTv5,
            manual_ack=True,
        )

        def on_message(_c: Any, _u: Any, message: Any) -> None:
            anyio.from_thread.run(send.send, message, token=token)

        client.on_message = on_message
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = 3600
        properties.ReceiveMaximum = 2 * self.batch  # as the watcher asks
        client.connect("127.0.0.1", 1883, clean_start=False, properties=properties)
        client.loop_start()
        try:
            while sink.count < count:
                messages = [await receive.receive()]
                while len(messages) < self.batch:
                    try:
                        messages.append(receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                rows = [
                    (
                        payload_of({"topic": m.topic, "data": json.loads(m.payload)}),
                        f"{WATCHER}:mqtt:{m.topic}:{json.loads(m.payload)['id']}",
                    )
                    for m in messages
                ]
                await sink.commit(rows)
                for m in messages:
                    client.ack(m.mid, m.qos)
        finally:
            await anyio.to_thread.run_sync(client.disconnect)
            client.loop_stop()


def _chunks(numbers: range, size: int) -> list[range]:
    return [numbers[i : i + size] for i in range(0, len(numbers), size)]


async def _pace(start: float, done: int, interval: float | None) -> None:
    if interval:
        delay = start + done * interval - time.perf_counter()
        if delay > 0:
            await anyio.sleep(delay)


# -- the daemon -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def daemon(root: Path, url: str, watcher: str) -> AsyncIterator[Process]:
    """A ``watchkeeper triggerer`` running ``watcher`` on ``url``; stopped with SIGTERM."""
    work = root / uuid.uuid4().hex[:8]
    (work / "watchers").mkdir(parents=True)
    (work / "watchers" / "bench.py").write_text(
        textwrap.dedent(
            f"""
            from watchkeeper.triggerer import Asset, AssetWatcher
            from watchkeeper.watchers import *  # noqa: F403

            bench = Asset({ASSET!r}, watchers=[AssetWatcher({WATCHER!r}, {watcher})])
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        {
            "WATCHKEEPER__DATABASE__URL": url,
            "WATCHKEEPER__API__ENABLED": "false",
            "WATCHKEEPER__LOGGING__FORMAT": "json",
        }
    )
    script = Path(sys.executable).parent / "watchkeeper"
    log = await anyio.to_thread.run_sync(lambda: (work / "daemon.log").open("wb"))
    process = await anyio.open_process(
        [str(script), "triggerer", "--watchers-path", str(work / "watchers")],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    try:
        yield process
    finally:
        process.terminate()
        with anyio.move_on_after(60, shield=True):
            await process.wait()
        if process.returncode is None:
            process.kill()
            with anyio.move_on_after(10, shield=True):
                await process.wait()
        log.close()


async def committed(url: str) -> list[tuple[str, datetime]]:
    """``(payload, created_at)`` of the daemon's events, in commit order."""
    if url.startswith("sqlite:///"):

        def read() -> list[tuple[str, datetime]]:
            path = url.removeprefix("sqlite:///")
            if not Path(path).exists():
                return []
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
                    rows = conn.execute(
                        "SELECT payload, created_at FROM asset_events ORDER BY id"
                    ).fetchall()
            except sqlite3.OperationalError:
                return []
            return [(p, _when(c)) for p, c in rows]

        return await anyio.to_thread.run_sync(read)
    try:
        conn = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresError):
        return []
    try:
        rows = await conn.fetch("SELECT payload, created_at FROM asset_events ORDER BY id")
    except asyncpg.UndefinedTableError:
        return []
    finally:
        await conn.close()
    return [(r["payload"], r["created_at"]) for r in rows]


async def count_committed(url: str) -> int:
    if url.startswith("sqlite:///"):

        def read() -> int:
            path = url.removeprefix("sqlite:///")
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
                    return int(conn.execute("SELECT count(*) FROM asset_events").fetchone()[0])
            except sqlite3.OperationalError:
                return 0

        return await anyio.to_thread.run_sync(read)
    try:
        conn = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresError):
        return 0
    try:
        return int(await conn.fetchval("SELECT count(*) FROM asset_events"))
    except asyncpg.UndefinedTableError:
        return 0
    finally:
        await conn.close()


def _when(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    return datetime.fromisoformat(str(value))


async def wait_for(url: str, count: int, process: Process, limit: float) -> None:
    with anyio.fail_after(limit):
        while await count_committed(url) < count:
            if process.returncode is not None:
                raise RuntimeError(f"the daemon exited with {process.returncode}")
            await anyio.sleep(0.5)


def drain_rate(rows: list[tuple[str, datetime]]) -> tuple[float, float]:
    """``(messages per second, seconds)`` from the first commit to the last."""
    times = sorted(created for _, created in rows)
    first = [t for t in times if t == times[0]]
    seconds = (times[-1] - times[0]).total_seconds()
    return ((len(times) - len(first)) / seconds if seconds > 0 else 0.0), seconds


# -- measurements ---------------------------------------------------------------------------------


async def measure_throughput(
    kind: str, backend: str, messages: int, batch: int, root: Path
) -> dict[str, Any]:
    broker = Broker(kind, batch)
    await broker.setup()
    live = kind == "mqtt"
    try:
        # The raw loop first, on its own copy of the backlog.
        async with fresh_database(backend, root) as url, raw_sink(url) as sink:
            if live:
                await live_drain(broker, messages, broker.raw(sink, messages), sink)
            else:
                await broker.publish(range(1, messages + 1), raw=True)
                with anyio.fail_after(900):
                    await broker.raw(sink, messages)
            raw_rate = sink.rate()
        async with fresh_database(backend, root) as url:
            if not live:
                await broker.publish(range(1, messages + 1))
            async with daemon(root, url, broker.watcher(batch)) as process:
                if live:
                    await broker.publish(range(1))  # once it runs, publish the rest
                    await wait_for(url, 1, process, 300)
                    await publish_windowed(
                        broker, range(1, messages + 1), lambda: count_committed(url)
                    )
                    messages += 1
                await wait_for(url, messages, process, 900)
            rows = (await committed(url))[1:] if live else await committed(url)
            messages -= live
        ours, seconds = drain_rate(rows)
        if len(rows) != messages:
            raise RuntimeError(f"{kind}: {len(rows)} events for {messages} messages")
    finally:
        await broker.teardown()
    return {
        "broker": kind,
        "backend": backend,
        "messages": messages,
        "batch_size": batch,
        "raw_per_s": round(raw_rate),
        "ours_per_s": round(ours),
        "ratio": round(ours / raw_rate, 2) if raw_rate else None,
        "ours_seconds": round(seconds, 2),
    }


_WINDOW = 800
"""MQTT: at most this many messages published and not yet committed (Mosquitto drops what is
past ``max_queued_messages``, 1000 by default, for a slow subscriber)."""


async def publish_windowed(
    broker: Broker, numbers: range, count: Callable[[], Awaitable[int]], raw: bool = False
) -> None:
    for chunk in _chunks(numbers, 200):
        while True:  # the count is in the database: polled
            if chunk[-1] - await count() <= _WINDOW:
                break
            await anyio.sleep(0.02)
        await broker.publish(chunk, raw=raw)


async def live_drain(broker: Broker, messages: int, loop: Awaitable[None], sink: Sink) -> None:
    """MQTT's raw loop: running while the messages are published (a broker without a backlog
    beyond its queue limit); the first message only starts it, as for the daemon."""

    async def count() -> int:
        return sink.count

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: loop)
        await broker.publish(range(1), raw=True)
        while True:
            if sink.count >= 1:
                break
            await anyio.sleep(0.01)
        sink.first = None
        sink.count = 0
        await publish_windowed(broker, range(1, messages + 1), count, raw=True)


async def measure_latency(kind: str, seconds: float, batch: int, root: Path) -> dict[str, Any]:
    """p50/p99 of commit time minus publish time, 100 messages per second, SQLite: the raw
    loop first (its rows' ``created_at`` is its commit's start, as the store's is), then ours."""
    broker = Broker(kind, batch)
    await broker.setup()
    count = int(seconds * 100)
    try:
        async with fresh_database("sqlite", root) as url, raw_sink(url) as sink:
            async with anyio.create_task_group() as tg:
                tg.start_soon(broker.raw, sink, count + 1)
                await broker.publish(range(1), raw=True)
                with anyio.fail_after(60):
                    while True:  # the first commit: the loop runs
                        if sink.count >= 1:
                            break
                        await anyio.sleep(0.01)
                await broker.publish(range(1, count + 1), raw=True, rate=100.0)
            raw = _delays(kind, (await committed(url))[1:])
        async with fresh_database("sqlite", root) as url:
            async with daemon(root, url, broker.watcher(batch)) as process:
                # Once it runs (one message committed), publish at 100 per second.
                await broker.publish(range(1))
                await wait_for(url, 1, process, 300)
                await broker.publish(range(1, count + 1), rate=100.0)
                await wait_for(url, count + 1, process, 120)
            ours = _delays(kind, (await committed(url))[1:])
    finally:
        await broker.teardown()
    return {
        "broker": kind,
        "messages": len(ours),
        **_percentiles(ours),
        **{f"raw_{k}": v for k, v in _percentiles(raw).items()},
        "load": loadavg(),
    }


def _delays(kind: str, rows: list[tuple[str, datetime]]) -> list[float]:
    """Each row's commit time minus the publish time its message carries, in ms, sorted."""
    delays = []
    for payload, created in rows:
        data = json.loads(payload)
        sent = data["fields"]["body"] if kind.startswith("redis") else data["data"]
        if isinstance(sent, str):
            sent = json.loads(sent)
        delays.append((created.timestamp() - sent["at"]) * 1000)
    return sorted(delays)


def _percentiles(delays: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(delays[len(delays) // 2], 1),
        "p99_ms": round(delays[int(len(delays) * 0.99) - 1], 1),
        "max_ms": round(delays[-1], 1),
    }


async def measure_backlog(messages: int, batch: int, root: Path) -> dict[str, Any]:
    broker = Broker("nats", batch)
    await broker.setup()
    try:
        async with fresh_database("sqlite", root) as url:
            await broker.publish(range(1, messages + 1))
            async with daemon(root, url, broker.watcher(batch)) as process:
                await wait_for(url, messages, process, 3600)
            rows = await committed(url)
    finally:
        await broker.teardown()
    rate, seconds = drain_rate(rows)
    return {
        "broker": "nats",
        "messages": len(rows),
        "seconds": round(seconds, 1),
        "per_s": round(rate),
    }


def loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"load_before": loadavg(), "throughput": [], "latency": []}
    backends = ["sqlite"] if args.no_postgres else ["sqlite", "postgres"]
    brokers = [args.only] if args.only else list(BROKERS)
    with tempfile.TemporaryDirectory(prefix="wk-broker-") as tmp:
        root = Path(tmp)
        for backend in backends if args.messages else ():  # --messages 0: no throughput run
            for kind in brokers:
                row = await measure_throughput(kind, backend, args.messages, args.batch_size, root)
                print(json.dumps(row), flush=True)
                results["throughput"].append(row)
        if args.latency:
            for kind in brokers:
                row = await measure_latency(kind, args.latency, args.batch_size, root)
                print(json.dumps(row), flush=True)
                results["latency"].append(row)
        if args.backlog:
            row = await measure_backlog(args.backlog, args.batch_size, root)
            print(json.dumps(row), flush=True)
            results["backlog"] = row
    results["load_after"] = loadavg()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--only", choices=BROKERS)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--linger", type=float, default=None, help="the watchers' batch_linger")
    parser.add_argument("--backlog", type=int, default=0)
    args = parser.parse_args()
    Broker.linger = args.linger
    results = anyio.run(run, args, backend="asyncio")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
