"""Slow clients: a connection must send its headers in time, and a full server makes room by
closing the connection idle longest, so ``/healthz`` answers and the process keeps descriptors
for its store and its watchers.

The reproduction runs a real daemon with a lowered open-file limit against more slow clients
than that limit; the smaller tests serve the app in-process.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import httpx
import pytest
from watchkeeper.store import SqliteStateBackend
from watchkeeper.triggerer.api import api_context, serve_app
from watchkeeper.triggerer.settings import ApiSettings

from tests.support.daemons import (
    append_lines,
    asset_file,
    log_events,
    payloads,
    reap,
    wait_for_api,
    wait_until,
    watchkeeper_command,
)

OPEN_FILES = 256
"""The daemon's open-file limit (soft and hard) in the reproduction."""
SLOW_CLIENTS = 320
"""More slow clients than that limit."""

_WITH_LIMIT = (
    "import os, resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class SlowClients:
    """Clients that send one header line every ``pace`` seconds and never finish; each one
    reconnects when the server closes it."""

    def __init__(self, port: int, count: int, pace: float) -> None:
        self.port, self.count, self.pace = port, count, pace
        self.connected = 0
        self.closed_by_server = 0

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(self.count):
                tg.start_soon(self._one)

    async def _one(self) -> None:
        while True:
            try:
                async with await anyio.connect_tcp("127.0.0.1", self.port) as stream:
                    self.connected += 1
                    await stream.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    while True:
                        await anyio.sleep(self.pace)
                        await stream.send(b"X-Slow: 1\r\n")
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.closed_by_server += 1
                await anyio.sleep(self.pace)


async def answers(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


class TestDaemonUnderSlowClients:
    async def test_healthz_and_reloads_work_past_the_open_file_limit(
        self,
        tmp_path: Path,
        watchers: Path,
        db_path: Path,
        env: dict[str, str],
        log_file: IO[bytes],
    ) -> None:
        """A daemon limited to 256 open files, against 320 clients dribbling headers: its
        ``/healthz`` keeps answering, a watcher file added meanwhile is loaded and commits its
        events, and nothing runs out of descriptors."""
        orders, bills = tmp_path / "orders.txt", tmp_path / "bills.txt"
        append_lines(orders, 1, 2)
        (watchers / "orders.py").write_text(asset_file("orders", orders))
        command = [
            sys.executable,
            "-c",
            _WITH_LIMIT,
            str(OPEN_FILES),
            *watchkeeper_command(
                "triggerer", "--watchers-path", str(watchers), "--reload-interval", "0.2"
            ),
        ]
        port = int(env["WATCHKEEPER__API__PORT"])
        process = await anyio.open_process(
            command, stdout=log_file, stderr=log_file, cwd=tmp_path, env=env
        )
        try:
            async with (
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client,
                SqliteStateBackend(db_path) as backend,
                anyio.create_task_group() as tg,
            ):
                await wait_for_api(client, process)
                attack = SlowClients(port, SLOW_CLIENTS, pace=1.0)
                tg.start_soon(attack.run)
                await wait_until(
                    lambda: attack.connected >= SLOW_CLIENTS, "every slow client to connect"
                )
                await wait_until(functools.partial(answers, client), "/healthz", process)
                append_lines(bills, 1, 3)
                (watchers / "bills.py").write_text(asset_file("bills", bills))

                async def loaded() -> bool:
                    return await payloads(backend, "bills") == [1, 2, 3]

                await wait_until(loaded, "the new watcher's events", process)
                append_lines(orders, 3, 4)

                async def more() -> bool:
                    return await payloads(backend, "orders") == [1, 2, 3, 4]

                await wait_until(more, "the first watcher's new events", process)
                # The attack went on for longer than the header timeout: healthz still answers.
                await wait_until(lambda: attack.closed_by_server > 0, "slow clients to be cut")
                await wait_until(functools.partial(answers, client), "/healthz", process)
                tg.cancel_scope.cancel()
        finally:
            await reap(process)
        log_file.flush()
        text = (tmp_path / "daemon.log").read_text()
        assert "Too many open files" not in text
        listening = [e for e in log_events(tmp_path) if e.get("event") == "api_listening"]
        assert listening and listening[0]["max_connections"] < OPEN_FILES


@asynccontextmanager
async def served(tmp_path: Path, settings: ApiSettings) -> AsyncIterator[int]:
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        ctx = api_context(backend, settings)
        async with anyio.create_task_group() as tg:
            port = await tg.start(
                functools.partial(serve_app, ctx, host="127.0.0.1", port=0, settings=settings)
            )
            yield port
            tg.cancel_scope.cancel()


async def closed_by_server(stream: anyio.abc.SocketStream) -> bool:
    """Whether the server closes ``stream`` (bounded wait)."""
    with anyio.fail_after(15):
        try:
            data = await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return True
    pytest.fail(f"the server answered instead of closing: {data!r}")


class TestConnectionLimits:
    async def test_headers_too_slow_close_the_connection(self, tmp_path: Path) -> None:
        """A connection that has not finished its headers within ``header_timeout`` is closed;
        one that sends them in time is answered."""
        async with served(tmp_path, ApiSettings(port=0, header_timeout=0.5)) as port:
            async with await anyio.connect_tcp("127.0.0.1", port) as slow:
                await slow.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                assert await closed_by_server(slow)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                assert (await client.get("/healthz")).status_code == 200

    async def test_a_full_server_closes_the_idle_longest(self, tmp_path: Path) -> None:
        """With every place taken by connections that send nothing, a new client is served
        and the oldest idle connection is the one closed."""
        settings = ApiSettings(port=0, max_connections=8, header_timeout=60)
        async with served(tmp_path, settings) as port:
            idle = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(8)]
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                    assert (await client.get("/healthz")).status_code == 200
                assert await closed_by_server(idle[0])
            finally:
                for stream in idle:
                    await stream.aclose()
