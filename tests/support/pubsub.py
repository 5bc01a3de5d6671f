"""A real Google Cloud Pub/Sub endpoint for the tests: the emulator of Google's Cloud SDK (Debian's
``google-cloud-cli-pubsub-emulator``, a Java server) on a free port of 127.0.0.1, started once
per test session and stopped after it.

The emulator speaks the service's gRPC API in plain text and checks no credentials; it keeps
everything in memory. Leases, acknowledgements, ``ModifyAckDeadline`` (0 gives a message back
at once) and redelivery with the same message id behave as the service's; it hands out more
than a streaming pull's ``max_outstanding_messages`` asks, it answers an empty ``Pull`` at
once, and it never notices that a client with a streaming pull was killed (it goes on
sending to that stream). Each test makes a topic and a
subscription of its own names (:func:`make_subscription`), so tests sharing the emulator never
see each other's messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.daemons import free_port
from tests.support.requires import unavailable

if TYPE_CHECKING:
    from google.pubsub_v1 import PublisherAsyncClient, SubscriberAsyncClient

__all__ = [
    "PROJECT",
    "emulator_launcher",
    "make_subscription",
    "publish",
    "publisher",
    "pubsub_emulator",
    "subscriber",
]

PROJECT = "wk-test"
DEBIAN_LAUNCHER = Path(
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
)
_READY_TIMEOUT = 60.0


def emulator_launcher() -> str:
    """The emulator's launcher: ``WATCHKEEPER_TEST_PUBSUB_EMULATOR``, else Debian's, else
    ``cloud-pubsub-emulator`` on PATH; skips (fails in CI) when there is none, or no Java."""
    configured = os.environ.get("WATCHKEEPER_TEST_PUBSUB_EMULATOR")
    if configured:
        return configured
    if DEBIAN_LAUNCHER.exists():
        launcher = str(DEBIAN_LAUNCHER)
    else:
        found = shutil.which("cloud-pubsub-emulator")
        if found is None:
            unavailable(
                "the Pub/Sub emulator is not installed "
                "(Debian's google-cloud-cli-pubsub-emulator package)"
            )
        launcher = found
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        unavailable("the Pub/Sub emulator needs Java (Debian's openjdk-17-jre-headless)")
    return launcher


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def pubsub_emulator() -> Iterator[str]:
    """Start the emulator on a free port, wait until it accepts connections, yield its
    ``host:port``, and stop it (SIGTERM, then SIGKILL) however the block ends."""
    launcher = emulator_launcher()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PUBSUB_EMULATOR_HOST"}
    process = subprocess.Popen(
        [launcher, "--host=127.0.0.1", f"--port={port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + _READY_TIMEOUT
        while not _accepts(port):
            if process.poll() is not None:
                unavailable(f"the Pub/Sub emulator exited with {process.returncode} at start")
            if time.monotonic() > deadline:
                unavailable(f"the Pub/Sub emulator did not listen on {port} in {_READY_TIMEOUT} s")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextlib.asynccontextmanager
async def publisher(host: str) -> AsyncIterator[PublisherAsyncClient]:
    """A publisher client of the emulator at ``host``, closed at the end."""
    import grpc
    from google.pubsub_v1 import PublisherAsyncClient
    from google.pubsub_v1.services.publisher.transports.grpc_asyncio import (
        PublisherGrpcAsyncIOTransport,
    )

    channel = grpc.aio.insecure_channel(host)
    client = PublisherAsyncClient(transport=PublisherGrpcAsyncIOTransport(channel=channel))
    try:
        yield client
    finally:
        await channel.close()


@contextlib.asynccontextmanager
async def subscriber(host: str) -> AsyncIterator[SubscriberAsyncClient]:
    """A subscriber client of the emulator at ``host`` (to make subscriptions, to look at
    what is left in one), closed at the end."""
    import grpc
    from google.pubsub_v1 import SubscriberAsyncClient
    from google.pubsub_v1.services.subscriber.transports.grpc_asyncio import (
        SubscriberGrpcAsyncIOTransport,
    )

    channel = grpc.aio.insecure_channel(host)
    client = SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))
    try:
        yield client
    finally:
        await channel.close()


async def make_subscription(
    host: str, *, ordering: bool = False, ack_deadline: int = 10
) -> tuple[str, str]:
    """A new topic and a subscription to it: ``(topic path, subscription path)``."""
    name = f"wk-test-{uuid.uuid4().hex[:12]}"
    topic = f"projects/{PROJECT}/topics/{name}"
    subscription = f"projects/{PROJECT}/subscriptions/{name}"
    async with publisher(host) as client:
        await client.create_topic(name=topic)
    async with subscriber(host) as client:
        await client.create_subscription(
            request={
                "name": subscription,
                "topic": topic,
                "ack_deadline_seconds": ack_deadline,
                "enable_message_ordering": ordering,
            }
        )
    return topic, subscription


async def publish(
    host: str,
    topic: str,
    bodies: Sequence[bytes],
    *,
    ordering_key: str = "",
    attributes: dict[str, str] | None = None,
) -> list[str]:
    """Publish ``bodies`` to ``topic`` in one request; their message ids, in order."""
    from google.pubsub_v1.types import PubsubMessage

    messages = [
        PubsubMessage(data=body, ordering_key=ordering_key, attributes=attributes or {})
        for body in bodies
    ]
    async with publisher(host) as client:
        answer = await client.publish(topic=topic, messages=messages)
    return list(answer.message_ids)
