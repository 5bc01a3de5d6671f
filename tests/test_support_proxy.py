"""The test proxy's faults behave as the fault tests assume: a black hole keeps the socket open
and silent, and new connections through it still work."""

from __future__ import annotations

import anyio
import anyio.abc
import pytest

from tests.support.proxy import open_proxy

pytestmark = pytest.mark.anyio


async def _echo_server() -> tuple[anyio.abc.Listener[anyio.abc.SocketStream], int]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    return listener, port


async def _echo(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        async for chunk in stream:
            await stream.send(chunk)


async def test_black_hole_silences_existing_links_and_not_new_ones() -> None:
    listener, port = await _echo_server()
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, _echo)
        async with open_proxy(port) as proxy:
            old = await anyio.connect_tcp("127.0.0.1", proxy.port)
            await old.send(b"ping")
            assert await old.receive() == b"ping"
            assert proxy.black_hole() == 1
            await old.send(b"lost")
            with anyio.fail_after(10):  # the proxy read the bytes and dropped them
                while proxy.dropped_bytes < len(b"lost"):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            with anyio.move_on_after(0.2) as scope:
                await old.receive()
            assert scope.cancelled_caught, "a black-holed link delivered bytes"
            new = await anyio.connect_tcp("127.0.0.1", proxy.port)
            await new.send(b"fresh")
            assert await new.receive() == b"fresh"
            assert proxy.dropped_bytes >= len(b"lost")
            assert proxy.open_links == 1
            await old.aclose()
            await new.aclose()
        tg.cancel_scope.cancel()


async def test_refuse_closes_new_connections_until_accept() -> None:
    listener, port = await _echo_server()
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, _echo)
        async with open_proxy(port) as proxy:
            proxy.refuse()
            refused = await anyio.connect_tcp("127.0.0.1", proxy.port)
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await refused.send(b"x")
                await refused.receive()
            proxy.accept()
            ok = await anyio.connect_tcp("127.0.0.1", proxy.port)
            await ok.send(b"y")
            assert await ok.receive() == b"y"
            await ok.aclose()
            await refused.aclose()
        tg.cancel_scope.cancel()
