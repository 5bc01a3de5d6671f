"""A TCP proxy on 127.0.0.1 that a test puts between a client and its server (a broker, a
database) to break the network from the outside without touching the server, which other tests
share.

Two faults: :meth:`TcpProxy.drop` closes both ends of every link (a clean loss: the client sees
its connection end), and :meth:`TcpProxy.black_hole` keeps every current link's sockets open but
drops their bytes from then on (a half-dead connection: the client sees nothing at all, as
behind a firewall that discards packets or a peer that vanished). Connections made after a black
hole forward normally, so a client that gives up on a dead connection and reconnects recovers.
:meth:`TcpProxy.refuse` makes new connections fail for a while, for a black hole that also
swallows the reconnects.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import anyio.abc

__all__ = ["Link", "TcpProxy", "open_proxy"]


@dataclass
class Link:
    """One proxied connection: the client's socket, the server's, and whether it is holed."""

    client: anyio.abc.SocketStream
    server: anyio.abc.SocketStream
    holed: bool = False


@dataclass
class TcpProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target``."""

    target: int
    port: int = 0
    links: list[Link] = field(default_factory=list)
    accepted: int = 0
    """Connections accepted so far (a reconnect shows as one more)."""
    dropped_bytes: int = 0
    """Bytes swallowed by black-holed links so far."""
    _refuse_until: float = 0.0
    _accepted_event: anyio.Event = field(default_factory=anyio.Event)

    @property
    def dsn_host(self) -> str:
        """``127.0.0.1:PORT``, to put in a URL in place of the server's address."""
        return f"127.0.0.1:{self.port}"

    async def wait_accepted(self, count: int) -> None:
        """Return once ``count`` connections were accepted in all."""
        while self.accepted < count:
            await self._accepted_event.wait()

    async def drop(self) -> None:
        """Close both ends of every current link, as a lost connection does."""
        links, self.links = self.links, []
        for link in links:
            await link.client.aclose()
            await link.server.aclose()

    def black_hole(self) -> int:
        """Drop every byte of every current link from now on, in both directions, while keeping
        its sockets open (no FIN, no RST): the client's next read waits forever unless it has a
        timeout of its own. Returns how many links were holed. New connections still work."""
        holed = 0
        for link in self.links:
            if not link.holed:
                link.holed = True
                holed += 1
        return holed

    def refuse(self, seconds: float = math.inf) -> None:
        """Close each new connection at once for ``seconds`` (a server that cannot be reached);
        :meth:`accept` ends it early."""
        self._refuse_until = anyio.current_time() + seconds

    def accept(self) -> None:
        """Accept new connections again (ends :meth:`refuse`)."""
        self._refuse_until = 0.0

    @property
    def open_links(self) -> int:
        """Links whose bytes still flow."""
        return sum(1 for link in self.links if not link.holed)

    async def _serve(self, client: anyio.abc.SocketStream) -> None:
        if anyio.current_time() < self._refuse_until:
            await client.aclose()
            return
        try:
            server = await anyio.connect_tcp("127.0.0.1", self.target)
        except OSError:
            await client.aclose()
            return
        link = Link(client, server)
        self.links.append(link)
        self.accepted += 1
        self._accepted_event.set()
        self._accepted_event = anyio.Event()
        try:
            async with client, server, anyio.create_task_group() as tg:
                tg.start_soon(self._pump, link, client, server, tg.cancel_scope)
                tg.start_soon(self._pump, link, server, client, tg.cancel_scope)
        finally:
            with contextlib.suppress(ValueError):
                self.links.remove(link)

    async def _pump(
        self,
        link: Link,
        source: anyio.abc.SocketStream,
        sink: anyio.abc.SocketStream,
        scope: anyio.CancelScope,
    ) -> None:
        try:
            async for chunk in source:
                if link.holed:
                    self.dropped_bytes += len(chunk)
                    continue
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        if not link.holed:
            scope.cancel()
        else:
            # A holed link never closes on its own: the other side must not learn of it.
            await anyio.sleep_forever()


@contextlib.asynccontextmanager
async def open_proxy(target: int) -> AsyncIterator[TcpProxy]:
    """A running :class:`TcpProxy` to ``target``, stopped (links cut) on exit."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy = TcpProxy(target, port=listener.extra(anyio.abc.SocketAttribute.local_port))
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, proxy._serve)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()
            with anyio.move_on_after(5, shield=True):
                await proxy.drop()
