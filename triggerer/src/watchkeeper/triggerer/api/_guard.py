"""Connection limits the HTTP server keeps against slow or greedy clients.

uvicorn bounds neither the number of open connections nor the time a client may take to send
its request's headers, so clients that send one header line now and then would hold sockets
until the process runs out of file descriptors (and then the store and the watchers fail to
open files too). :func:`guarded_protocol` makes uvicorn's HTTP protocol class keep two rules:

- a connection must finish its request's headers within ``header_timeout`` seconds of opening
  (or of the end of its previous response); else it is closed;
- at most ``max_connections`` are open: one more closes the connection that has waited longest
  without a request in progress (a slow or idle one), or, when every one is serving a request
  (live streams), the new one.

:func:`descriptor_budget` raises the process's soft limit of open files to its hard limit and
says how many connections fit while a reserve stays for everything else the process opens.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["descriptor_budget", "guarded_protocol"]

_MIN_RESERVE = 128


def descriptor_budget(max_connections: int) -> tuple[int, int, int]:
    """``(connections, accept_batch, soft_limit)``: how many connections the server may hold,
    how many it may accept at once, and the process's open-file limit (raised to the hard
    limit first, the common practice for a server).

    A quarter of the limit (at least 128 descriptors) is kept for the store, the watchers and
    the process's own files; half of that reserve is the most connections accepted in one
    batch, which the limit of connections applies to only once they are made.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep the limit the process has
    limit = soft if soft != resource.RLIM_INFINITY else 1 << 16
    reserve = max(_MIN_RESERVE, limit // 4)
    connections = max(8, min(max_connections, limit - reserve))
    return connections, max(8, reserve // 2), limit


def guarded_protocol(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the two rules of this module (one class per server)."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _waiting_since = 0.0
        _dropped = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()
            if len(self.connections) <= max_connections:
                return  # the usual case: no scan
            open_now = [c for c in self.connections if not getattr(c, "_dropped", False)]
            if len(open_now) > max_connections:
                idle = [c for c in open_now if isinstance(c, GuardedH11Protocol) and c._idle()]
                victim = min(idle, key=lambda c: c._waiting_since) if idle else self
                victim._drop()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request's headers are due within the same time

        def _idle(self) -> bool:
            """No request in progress: reading headers, or between two requests."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._waiting_since = self.loop.time()
            self._header_timer = self.loop.call_later(header_timeout, self._on_header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if self._idle():
                self._drop()

        def _drop(self) -> None:
            self._dropped = True
            self._disarm()
            if not self.transport.is_closing():
                self.transport.abort()

    return GuardedH11Protocol
