"""Every ready-made watcher of a networked source survives a black hole on its connection.

A TCP proxy (:mod:`tests.support.proxy`) sits between the watcher and the real server. Once
the watcher has committed its first items, the proxy black-holes the link: its sockets stay
open and every byte is dropped, the server never learns of it and the watcher hears nothing.
Items added after that must still arrive, each exactly once: the watcher's bounded source
call fails, the daemon shows it ``backing_off`` with a reason naming the source, and it
reconnects (new connections through the proxy work).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

import aiomysql  # type: ignore[import-untyped] # no stubs published
import anyio
import anyio.to_thread
import asyncpg
import pytest
from watchkeeper.store import Asset, MemoryStateBackend
from watchkeeper.triggerer import BaseEventTrigger, RunnerConfig, TriggerRunner, WatchSpec
from watchkeeper.watchers import (
    HttpPollWatcher,
    KafkaWatcher,
    MqttWatcher,
    NatsJetStreamWatcher,
    RabbitMQWatcher,
    RedisStreamWatcher,
    SqlTableWatcher,
)

from tests.support.brokers import (
    MQTT_PORT,
    NATS_PORT,
    RABBITMQ_PORT,
    REDIS_PORT,
    require_server,
    unique,
)
from tests.support.daemons import free_port
from tests.support.kafka import create_topic, produce, tansu_broker
from tests.support.proxy import TcpProxy, open_proxy

ASSET = Asset("holed")
NAME = "holed_feed"
CONFIG = RunnerConfig(
    backoff_initial=0.2,
    backoff_max=1.0,
    max_failures=10,
    lag_threshold=0,
    status_interval=0,
    cleanup_timeout=5.0,
)
BEFORE = (1, 2)
AFTER = (3, 4, 5, 6, 7)


@dataclass
class Outcome:
    """What a run through a black hole showed."""

    numbers: list[int]
    backing_off: list[str | None] = field(default_factory=list)
    """The ``last_error`` of each ``backing_off`` status seen."""
    states: list[str] = field(default_factory=list)


async def through_a_black_hole(
    watcher: BaseEventTrigger,
    proxy: TcpProxy,
    send: Callable[[tuple[int, ...]], Awaitable[None]],
    number_of: Callable[[Any], int],
    *,
    timeout: float = 60,  # noqa: ASYNC109 - the bound of the whole run
) -> Outcome:
    """Send 1, 2; run ``watcher`` until both committed; black-hole its links; send 3..7; run
    until all seven committed. The numbers in commit order, and the statuses seen."""
    await send(BEFORE)
    outcome = Outcome([])
    async with MemoryStateBackend() as backend:
        await backend.events.aregister_assets([ASSET])
        async with TriggerRunner(backend, CONFIG) as runner:
            with runner.subscribe() as events:
                await runner.start_trigger(WatchSpec("holed", watcher, (ASSET,), (NAME,)))

                async def receive(count: int) -> None:
                    while len(outcome.numbers) < count:
                        event = await events.receive()
                        outcome.numbers.append(number_of(event.payload))

                async def watch_states(done: anyio.Event) -> None:
                    while not done.is_set():
                        for status in runner.statuses():
                            if not outcome.states or outcome.states[-1] != status.state:
                                outcome.states.append(status.state)
                            if status.state == "backing_off":
                                outcome.backing_off.append(status.last_error)
                        await anyio.sleep(0.01)

                with anyio.fail_after(timeout):
                    await receive(len(BEFORE))
                    holed = proxy.black_hole()
                    assert holed >= 1, "the watcher had no open link to black-hole"
                    await send(AFTER)
                    done = anyio.Event()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(watch_states, done)
                        await receive(len(BEFORE) + len(AFTER))
                        done.set()
    return outcome


def assert_survived(outcome: Outcome, proxy: TcpProxy, *source: str) -> None:
    """Each number once, in order; a backing_off status whose reason names the source."""
    assert outcome.numbers == [*BEFORE, *AFTER]
    assert proxy.accepted >= 2  # it reconnected
    reasons = [reason for reason in outcome.backing_off if reason]
    assert reasons, f"never backing_off with a reason (states seen: {outcome.states})"
    for part in source:
        assert part in reasons[0], reasons[0]


# -- SqlTableWatcher on MariaDB and PostgreSQL ------------------------------------------------


@pytest.fixture
async def mysql_table(mysql_dsn: str) -> AsyncIterator[str]:
    name = f"holed_{uuid.uuid4().hex[:12]}"
    await _mysql(mysql_dsn, f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, seq INTEGER)")
    try:
        yield name
    finally:
        await _mysql(mysql_dsn, f"DROP TABLE {name}")


async def _mysql(dsn: str, sql: str, rows: list[tuple[Any, ...]] | None = None) -> None:
    parts = urlsplit(dsn)
    db = await aiomysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username,
        password=parts.password or "",
        db=parts.path.lstrip("/"),
        autocommit=True,
    )
    try:
        async with db.cursor() as cursor:
            if rows is None:
                await cursor.execute(sql)
            else:
                await cursor.executemany(sql, rows)
    finally:
        await db.ensure_closed()


@pytest.fixture
async def pg_table(pg_dsn: str) -> AsyncIterator[str]:
    schema = f"wk_holed_{uuid.uuid4().hex[:12]}"
    pg = await asyncpg.connect(pg_dsn)
    try:
        await pg.execute(f'CREATE SCHEMA "{schema}"')
        await pg.execute(f'CREATE TABLE "{schema}".events (id INTEGER PRIMARY KEY, seq INTEGER)')
        yield f"{schema}.events"
    finally:
        await pg.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await pg.close()


def _via(dsn: str, proxy: TcpProxy) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rpartition("@")
    userinfo = netloc[0] + netloc[1]
    return parts._replace(netloc=f"{userinfo}{proxy.dsn_host}").geturl()


def _row_number(payload: Any) -> int:
    return int(payload["id"])


class TestSqlTableWatcher:
    async def test_mariadb_rows_after_a_black_hole_arrive_once(
        self, mysql_dsn: str, mysql_table: str
    ) -> None:
        async def insert(numbers: tuple[int, ...]) -> None:
            rows = [(n, n) for n in numbers]
            await _mysql(mysql_dsn, f"INSERT INTO {mysql_table} VALUES (%s, %s)", rows)

        async with open_proxy(urlsplit(mysql_dsn).port or 3306) as proxy:
            watcher = SqlTableWatcher(
                _via(mysql_dsn, proxy), mysql_table, "seq", "id", poll_interval=0.05, timeout=2
            )
            outcome = await through_a_black_hole(watcher, proxy, insert, _row_number)
        assert_survived(outcome, proxy, mysql_table, "TimeoutError", proxy.dsn_host)

    async def test_postgres_rows_after_a_black_hole_arrive_once(
        self, pg_dsn: str, pg_table: str
    ) -> None:
        async def insert(numbers: tuple[int, ...]) -> None:
            pg = await asyncpg.connect(pg_dsn)
            try:
                await pg.executemany(
                    f"INSERT INTO {pg_table} VALUES ($1, $2)", [(n, n) for n in numbers]
                )
            finally:
                await pg.close()

        async with open_proxy(urlsplit(pg_dsn).port or 5432) as proxy:
            watcher = SqlTableWatcher(
                _via(pg_dsn, proxy), pg_table, "seq", "id", poll_interval=0.05, timeout=2
            )
            outcome = await through_a_black_hole(watcher, proxy, insert, _row_number)
        assert_survived(outcome, proxy, pg_table, "TimeoutError", proxy.dsn_host)

    def test_the_default_bound_is_ten_seconds(self) -> None:
        watcher = SqlTableWatcher("postgresql://db/wk", "events", "seq", "id")
        assert watcher.params.timeout == 10.0
        assert watcher.serialize()[1]["timeout"] == 10.0


# -- HttpPollWatcher ----------------------------------------------------------------------------


class _Feed(BaseHTTPRequestHandler):
    """``GET /feed?cursor=N``: the items with an id above N and ``next``, the last id given.
    HTTP/1.1 with keep-alive, so the client reuses its connection (the one black-holed)."""

    protocol_version = "HTTP/1.1"
    ids: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        query = dict(parse_qsl(urlsplit(self.path).query))
        after = int(query.get("cursor", "0"))
        items = [{"id": n} for n in list(self.ids) if n > after]
        body = json.dumps({"items": items, "next": items[-1]["id"] if items else after}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def feed_server() -> Iterator[ThreadingHTTPServer]:
    handler = type("Feed", (_Feed,), {"ids": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class TestHttpPollWatcher:
    async def test_items_after_a_black_hole_arrive_once(
        self, feed_server: ThreadingHTTPServer
    ) -> None:
        ids: list[int] = feed_server.RequestHandlerClass.ids  # type: ignore[attr-defined]

        async def add(numbers: tuple[int, ...]) -> None:
            ids.extend(numbers)

        async with open_proxy(feed_server.server_address[1]) as proxy:
            watcher = HttpPollWatcher(
                f"http://{proxy.dsn_host}/feed?api_key=s3cr3t",
                items="items",
                item_key="id",
                cursor="next",
                poll_interval=0.05,
                timeout=1.0,
                backoff=0.1,
            )
            outcome = await through_a_black_hole(watcher, proxy, add, _item_number)
        assert_survived(outcome, proxy, f"{proxy.dsn_host}/feed", "ReadTimeout", "api_key=***")
        assert all("s3cr3t" not in (reason or "") for reason in outcome.backing_off)


def _item_number(payload: Any) -> int:
    return int(payload["id"])


# -- RedisStreamWatcher, without and with a consumer group -------------------------------------


@pytest.fixture
async def redis_stream() -> AsyncIterator[tuple[Any, str]]:
    import redis.asyncio as aioredis

    require_server("Redis", REDIS_PORT)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{REDIS_PORT}/0")
    name = unique("wk-holed-")
    try:
        yield client, name
    finally:
        await client.delete(name)
        await client.aclose()


def _field_number(payload: Any) -> int:
    return int(payload["fields"]["n"])


class TestRedisStreamWatcher:
    @pytest.mark.parametrize("group", [None, "holed"])
    async def test_entries_after_a_black_hole_arrive_once(
        self, redis_stream: tuple[Any, str], group: str | None
    ) -> None:
        client, stream = redis_stream

        async def add(numbers: tuple[int, ...]) -> None:
            for n in numbers:
                await client.xadd(stream, {"n": str(n)})

        async with open_proxy(REDIS_PORT) as proxy:
            watcher = RedisStreamWatcher(
                stream, f"redis://{proxy.dsn_host}/0", block=0.2, group=group
            )
            outcome = await through_a_black_hole(watcher, proxy, add, _field_number)
        assert_survived(outcome, proxy, stream, proxy.dsn_host, "TimeoutError")


# -- NatsJetStreamWatcher -----------------------------------------------------------------------


@pytest.fixture
async def jetstream() -> AsyncIterator[tuple[Any, str]]:
    import nats

    require_server("NATS", NATS_PORT)
    client = await nats.connect(f"nats://127.0.0.1:{NATS_PORT}")
    js = client.jetstream()
    name = unique("WK_HOLED_")
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        yield js, name
    finally:
        await js.delete_stream(name)
        await client.close()


def _data_number(payload: Any) -> int:
    return int(payload["data"]["n"])


class TestNatsJetStreamWatcher:
    async def test_messages_after_a_black_hole_arrive_once(
        self, jetstream: tuple[Any, str]
    ) -> None:
        js, stream = jetstream

        async def publish(numbers: tuple[int, ...]) -> None:
            for n in numbers:
                await js.publish(f"{stream}.items", json.dumps({"n": n}).encode())

        async with open_proxy(NATS_PORT) as proxy:
            watcher = NatsJetStreamWatcher(
                stream,
                f"nats://{proxy.dsn_host}",
                fetch_timeout=0.5,
                ack_wait=1.0,
                ping_interval=0.5,
            )
            outcome = await through_a_black_hole(watcher, proxy, publish, _data_number)
        assert sorted(outcome.numbers) == [*BEFORE, *AFTER]  # a redelivery may come later
        outcome.numbers.sort()
        assert_survived(outcome, proxy, stream, proxy.dsn_host, "disconnected")


# -- RabbitMQWatcher ----------------------------------------------------------------------------


@pytest.fixture
async def rabbit_queue() -> AsyncIterator[tuple[Any, str]]:
    import aio_pika

    require_server("RabbitMQ", RABBITMQ_PORT)
    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}/")
    async with connection:
        channel = await connection.channel()
        name = unique("wk-holed-")
        await channel.declare_queue(name, durable=True)
        try:
            yield channel, name
        finally:
            await channel.queue_delete(name)


class TestRabbitMQWatcher:
    async def test_messages_after_a_black_hole_arrive_once(
        self, rabbit_queue: tuple[Any, str]
    ) -> None:
        import aio_pika

        channel, queue = rabbit_queue

        async def publish(numbers: tuple[int, ...]) -> None:
            for n in numbers:
                body = json.dumps({"n": n}).encode()
                message = aio_pika.Message(body, message_id=f"m-{n}")
                await channel.default_exchange.publish(message, routing_key=queue)

        async with open_proxy(RABBITMQ_PORT) as proxy:
            watcher = RabbitMQWatcher(queue, f"amqp://guest:guest@{proxy.dsn_host}/", heartbeat=1)
            outcome = await through_a_black_hole(watcher, proxy, publish, _data_number)
        outcome.numbers.sort()  # the messages the dead channel held come back after the others
        assert_survived(outcome, proxy, queue, proxy.dsn_host, "guest:***@")


# -- MqttWatcher --------------------------------------------------------------------------------


def _mqtt_client(client_id: str = "") -> Any:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    return paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)


def _mqtt_session(client_id: str, topic: str) -> None:
    """Leave a session for ``client_id`` subscribed to ``topic``, so messages published
    before the watcher's first connect wait for it."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = _mqtt_client(client_id)
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    properties.SessionExpiryInterval = 120
    client.connect("127.0.0.1", MQTT_PORT, clean_start=True, properties=properties)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        assert subscribed.wait(10), "no SUBACK from the broker"
    finally:
        client.disconnect()
        client.loop_stop()


def _mqtt_publish(topic: str, numbers: tuple[int, ...]) -> None:
    client = _mqtt_client()
    client.connect("127.0.0.1", MQTT_PORT)
    client.loop_start()
    try:
        for n in numbers:
            body = json.dumps({"id": f"i-{n}", "n": n}).encode()
            client.publish(topic, body, qos=1).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


class TestMqttWatcher:
    async def test_messages_after_a_black_hole_arrive_once(self) -> None:
        require_server("Mosquitto", MQTT_PORT)
        topic = f"wk/holed/{uuid.uuid4().hex[:12]}"
        client_id = unique("wk-holed-")
        await anyio.to_thread.run_sync(_mqtt_session, client_id, topic)

        async def publish(numbers: tuple[int, ...]) -> None:
            await anyio.to_thread.run_sync(_mqtt_publish, topic, numbers)

        async with open_proxy(MQTT_PORT) as proxy:
            watcher = MqttWatcher(
                topic,
                f"mqtt://{proxy.dsn_host}",
                client_id=client_id,
                dedup_field="id",
                session_expiry=120,
                keepalive=1,
                reconnect_max=1,
            )
            outcome = await through_a_black_hole(watcher, proxy, publish, _data_number)
        outcome.numbers.sort()  # what the dead connection held is resent after the reconnect
        assert_survived(outcome, proxy, topic, proxy.dsn_host, "reconnecting")


class TestAnUnreachableSource:
    async def test_a_database_that_refuses_connections_is_waited_for(
        self, pg_dsn: str, pg_table: str
    ) -> None:
        """A server that cannot be reached at all is not a failure of the watcher (one failure
        would make it ``failed`` here): it shows ``backing_off`` naming the server, retries,
        and reads the rows once it can."""
        pg = await asyncpg.connect(pg_dsn)
        try:
            await pg.executemany(f"INSERT INTO {pg_table} VALUES ($1, $2)", [(1, 1), (2, 2)])
        finally:
            await pg.close()
        async with open_proxy(urlsplit(pg_dsn).port or 5432) as proxy:
            proxy.refuse()
            watcher = SqlTableWatcher(
                _via(pg_dsn, proxy), pg_table, "seq", "id", poll_interval=0.05, timeout=2
            )
            config = CONFIG.model_copy(update={"max_failures": 1})
            async with MemoryStateBackend() as backend:
                await backend.events.aregister_assets([ASSET])
                async with TriggerRunner(backend, config) as runner:
                    with runner.subscribe() as events:
                        await runner.start_trigger(WatchSpec("refused", watcher, (ASSET,), (NAME,)))
                        with anyio.fail_after(30):
                            while True:
                                (status,) = runner.statuses()
                                if status.state == "backing_off" and status.last_error:
                                    break
                                await anyio.sleep(0.01)
                            proxy.accept()
                            got = [(await events.receive()).payload["id"] for _ in range(2)]
                        (status,) = runner.statuses()
        assert got == [1, 2]
        assert proxy.dsn_host in (status.last_error or "")
        assert status.state == "running"


# -- KafkaWatcher --------------------------------------------------------------------------------


class TestKafkaWatcher:
    async def test_records_after_a_black_hole_arrive_once(self) -> None:
        """Tansu advertises the proxy's port, so every connection of the watcher (bootstrap
        and the partition leader's) goes through it and is black-holed."""
        port = free_port()
        async with open_proxy(port) as proxy, tansu_broker(port, advertised_port=proxy.port):
            topic = unique("wk-holed-")
            await create_topic(proxy.dsn_host, topic)

            async def send(numbers: tuple[int, ...]) -> None:
                values = [json.dumps({"n": n}).encode() for n in numbers]
                await produce(proxy.dsn_host, topic, values)

            watcher = KafkaWatcher(topic, proxy.dsn_host, poll_timeout=0.2, request_timeout=2)
            outcome = await through_a_black_hole(
                watcher, proxy, send, lambda payload: int(payload["data"]["n"])
            )
        assert_survived(outcome, proxy, topic, proxy.dsn_host)
