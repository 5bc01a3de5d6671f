"""What the broker tests (the watchers' and the chaos runs') share: the servers of this
machine, unique names, a TCP proxy.

Every test talks to the real server (Redis, NATS with JetStream, RabbitMQ, Mosquitto on
127.0.0.1): :func:`require_server` skips the test with a reason when the server is down, and
fails it under ``CI=true`` (as ``pg_dsn`` does for PostgreSQL). Each test uses names of its own
(:func:`unique`), so tests running in parallel on one broker never see each other's messages.

:class:`TcpProxy` (from :mod:`tests.support.proxy`) sits between a watcher and its broker so a
test can cut or black-hole the watcher's connection from the outside without touching the
broker, which other tests share.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
import structlog
from structlog.typing import EventDict
from watchkeeper.store import Asset
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
from watchkeeper.triggerer.testing import CrashPoint, HarnessRun, WatcherHarness

from tests.support.requires import unavailable

REDIS_PORT = 6379
NATS_PORT = 4222
RABBITMQ_PORT = 5672
MQTT_PORT = 1883


def require_server(name: str, port: int) -> None:
    """Skip (or, under ``CI=true``, fail) unless something listens on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return
    except OSError as exc:
        reason = f"{name} is not reachable on 127.0.0.1:{port} ({exc})"
    unavailable(reason)


def numbers(payloads: list[Any]) -> list[int]:
    """The ``n`` of each message body (``{"data": {"n": ...}}``), in order."""
    return [int(p["data"]["n"]) for p in payloads]


def unique(prefix: str) -> str:
    """A name no other test uses: ``prefix`` and 12 random hex digits."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


class Observed(BaseEventTrigger):
    """Runs ``inner`` and sets ``marks[n]`` once its ``n``-th event committed.

    The code after a ``yield`` runs only after the event committed, so the mark says the
    event is durable; the inner watcher acknowledges it when it is asked for the next one,
    which waits for ``holds[n]`` when given. ``serialize()`` is the inner watcher's, so the
    run is the same watcher as far as the runtime can tell.
    """

    def __init__(
        self,
        inner: BaseEventTrigger,
        marks: dict[int, anyio.Event],
        holds: dict[int, anyio.Event] | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.marks = marks
        self.holds = holds or {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.inner.serialize()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.inner.bind_asset_state_store(self.asset_state_store)
        self.inner.bind_watcher_name(self.watcher_name)
        count = 0
        try:
            events = self.inner.run()
            assert isinstance(events, AsyncGenerator)
            async with contextlib.aclosing(events):
                async for event in events:
                    yield event
                    count += 1
                    mark = self.marks.get(count)
                    if mark is not None:
                        mark.set()
                    hold = self.holds.get(count)
                    if hold is not None:
                        await hold.wait()
        finally:
            self.inner.bind_asset_state_store(None)
            self.inner.bind_watcher_name(None)

    async def cleanup(self) -> None:
        await self.inner.cleanup()


async def publish_without_message_id(queue: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` to ``queue`` on RabbitMQ with no ``message_id`` property at all.

    aio-pika (through aiormq) gives every message it publishes a random ``message_id``, so a
    publisher that sets none is played here by a few raw AMQP 0-9-1 frames (pamqp encodes
    them), on a connection of its own, with publisher confirms.
    """
    from pamqp import commands, exceptions, frame, header
    from pamqp.body import ContentBody

    async with await anyio.connect_tcp("127.0.0.1", RABBITMQ_PORT) as stream:
        buffer = b""

        async def receive(kind: type[Any]) -> Any:
            nonlocal buffer
            while True:
                try:
                    consumed, _channel, value = frame.unmarshal(buffer)
                except exceptions.UnmarshalingException:
                    buffer += await stream.receive()
                    continue
                buffer = buffer[consumed:]
                if isinstance(value, kind):
                    return value

        await stream.send(header.ProtocolHeader().marshal())
        await receive(commands.Connection.Start)
        await stream.send(
            frame.marshal(
                commands.Connection.StartOk(
                    client_properties={}, mechanism="PLAIN", response="\0guest\0guest"
                ),
                0,
            )
        )
        tune = await receive(commands.Connection.Tune)
        await stream.send(
            frame.marshal(
                commands.Connection.TuneOk(
                    channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
                ),
                0,
            )
        )
        await stream.send(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        await receive(commands.Connection.OpenOk)
        await stream.send(frame.marshal(commands.Channel.Open(), 1))
        await receive(commands.Channel.OpenOk)
        await stream.send(frame.marshal(commands.Confirm.Select(), 1))
        await receive(commands.Confirm.SelectOk)
        for body in bodies:
            properties = commands.Basic.Properties(content_type="application/json", delivery_mode=2)
            await stream.send(
                frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
                + frame.marshal(header.ContentHeader(0, len(body), properties), 1)
                + frame.marshal(ContentBody(body), 1)
            )
            await receive(commands.Basic.Ack)
        await stream.send(frame.marshal(commands.Connection.Close(200, "bye", 0, 0), 0))
        await receive(commands.Connection.CloseOk)


async def run_through_a_break(
    harness: WatcherHarness,
    watcher: BaseEventTrigger,
    break_then_publish: Callable[[], Awaitable[None]],
    *,
    asset: Asset,
    watcher_name: str,
    after: int = 2,
    events: int = 4,
    timeout: float = 30,  # noqa: ASYNC109 - the bound of the whole run, passed to the harness
) -> HarnessRun:
    """Run ``watcher`` until ``events`` events; once its ``after``-th event committed, call
    ``break_then_publish`` (cut its link to the broker, publish the rest) beside it."""
    reached = anyio.Event()

    async def interrupt() -> None:
        await reached.wait()
        await break_then_publish()

    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            tg.start_soon(interrupt)
            run = await harness.run(
                Observed(watcher, {after: reached}),
                assets=asset,
                max_events=events,
                timeout=timeout,
                watcher_name=watcher_name,
            )
    return run


async def crash_then_restart(
    harness: WatcherHarness,
    watcher: BaseEventTrigger,
    point: CrashPoint,
    *,
    asset: Asset,
    watcher_name: str,
    messages: int = 5,
    at: int = 3,
) -> tuple[HarnessRun, list[EventDict]]:
    """Crash ``watcher`` at ``point`` of its ``at``-th message, restart it until the
    ``messages`` published are all events; the restarted run and the logs of the restart."""
    crashed = await harness.crash(
        watcher, assets=asset, at=point, event=at, watcher_name=watcher_name
    )
    rest = messages - len(crashed.all_events)
    with structlog.testing.capture_logs() as logs:
        after = await harness.restart(
            watcher, assets=asset, max_events=rest, watcher_name=watcher_name
        )
    return after, logs


async def crash_in_a_batch(
    harness: WatcherHarness,
    watcher: BaseEventTrigger,
    point: CrashPoint,
    publish_more: Callable[[], Awaitable[None]],
    *,
    asset: Asset,
    watcher_name: str,
    total: int,
) -> tuple[HarnessRun, HarnessRun, int]:
    """Crash ``watcher`` at ``point`` of its first yield (a batch of what was published),
    publish more, restart it until all ``total`` messages are events; the crashed run, the
    restarted one and how many redelivered events the restart suppressed."""
    crashed = await harness.crash(
        watcher, assets=asset, at=point, event=1, watcher_name=watcher_name
    )
    await publish_more()
    rest = total - len(crashed.all_events)
    with structlog.testing.capture_logs() as logs:
        after = await harness.restart(
            watcher, assets=asset, max_events=rest, watcher_name=watcher_name
        )
    return crashed, after, suppressed_count(logs)


def suppressed_count(logs: Sequence[Mapping[str, Any]]) -> int:
    """How many redelivered events the logs say their dedup_keys suppressed: one per
    ``event_deduplicated``, a batch's count per ``batch_deduplicated`` and
    ``batch_partly_deduplicated``."""
    total = 0
    for record in logs:
        event = record.get("event")
        if event == "event_deduplicated":
            total += 1
        elif event == "batch_deduplicated":
            total += int(str(record["count"]))
        elif event == "batch_partly_deduplicated":
            total += int(str(record["suppressed"]))
    return total
