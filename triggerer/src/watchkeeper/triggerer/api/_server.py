"""Serving the app with uvicorn inside the caller's task group: no second loop, no signals.

``uvicorn.Server.serve`` installs its own SIGINT/SIGTERM handlers (``capture_signals``); the
daemon owns the signals, so :class:`_EmbeddedServer` replaces that with a no-op, and stopping
is ``should_exit = True`` followed by uvicorn's graceful shutdown (bounded). The listening
socket is bound here first, so a busy port is an :class:`ApiListenError` naming it instead of
uvicorn's ``sys.exit``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import uvicorn
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import get_logger

from ..errors import TriggererError
from ..settings import ApiSettings
from ._app import ApiContext, create_app
from ._guard import descriptor_budget, guarded_protocol
from ._metrics import LoopLagProbe, Metrics
from ._rates import RunnerRates
from ._series import WatcherSeries
from ._signatures import Hook

if TYPE_CHECKING:
    from ..daemon import Daemon
    from ..runtime import TriggerRunner

__all__ = ["ApiListenError", "api_context", "serve_api", "serve_app"]

log = get_logger(__name__)

_SHUTDOWN_TIMEOUT = 5.0


class ApiListenError(TriggererError, OSError):
    """Raised when the API cannot listen on its address (a busy port, a wrong host)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        self.host, self.port = host, port
        super().__init__(f"the API cannot listen on {host}:{port}: {reason}")

    def __str__(self) -> str:
        return str(self.args[0])


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without signal handlers, telling when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the embedding process owns SIGINT and SIGTERM

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise ApiListenError(host, port, exc.strerror or str(exc)) from exc


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to any interface


def _check_tls(api: ApiSettings, host: str, port: int) -> bool:
    """Whether the API serves HTTPS; a certificate or key that cannot be loaded is an
    :class:`ApiListenError` naming the file and the reason."""
    if api.tls_certfile is None or api.tls_keyfile is None:
        return False
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(api.tls_certfile, api.tls_keyfile)
    except OSError as exc:  # a missing file, or an ssl.SSLError (not PEM, a key of another)
        reason = exc.strerror or str(exc)
        raise ApiListenError(
            host,
            port,
            f"cannot load the TLS certificate {str(api.tls_certfile)!r} with the key "
            f"{str(api.tls_keyfile)!r}: {reason}",
        ) from exc
    return True


def api_context(
    backend: BaseStateBackend,
    api: ApiSettings,
    *,
    daemon: Daemon | None = None,
    runner: TriggerRunner | None = None,
) -> ApiContext:
    """The context the routes work on.

    :param backend: the open store the routes read and write.
    :param api: the API's settings (series cap, stream and token limits).
    :param daemon: the daemon serving the API, if any: its runner and placement are reported.
    :param runner: a runner to report without a daemon (default: the daemon's).
    :returns: the context; with a runner, the watchers' rates come from its counters.
    """
    if runner is None and daemon is not None:
        runner = daemon.runner
    rates = None if runner is None else RunnerRates.of_runner(runner)
    metrics = Metrics(
        backend,
        runner=runner,
        daemon=daemon,
        max_watcher_series=api.max_watcher_series,
        lag=LoopLagProbe(),
    )
    return ApiContext(
        backend=backend,
        metrics=metrics,
        daemon=daemon,
        runner=runner,
        rates=rates,
        max_streams_per_token=api.max_streams_per_token,
        metrics_token_required=api.metrics_token_required,
        series=WatcherSeries(backend, interval=api.watcher_sample_seconds, rates=rates),
        hooks={
            asset: Hook(
                hook.provider,
                hook.secret_bytes(),
                tolerance=hook.tolerance,
                signature_header=hook.signature_header,
                delivery_header=hook.delivery_header,
            )
            for asset, hook in api.hooks.items()
        },
    )


async def serve_app(
    ctx: ApiContext,
    *,
    host: str,
    port: int,
    settings: ApiSettings | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API over ``ctx`` until cancelled, then shut it down gracefully.

    :param ctx: what the routes work on (see :func:`api_context`).
    :param host: the address to listen on (used instead of ``settings.host``).
    :param port: the port to listen on, 0 for a free one (used instead of ``settings.port``).
    :param settings: the connection limits (``max_connections``, ``header_timeout``) and TLS.
    :param task_status: given the bound port once the server listens.
    :raises ApiListenError: the address cannot be bound, or the TLS files cannot be loaded.
    """
    api = settings if settings is not None else ApiSettings()
    tls = _check_tls(api, host, port)
    connections, accept_batch, nofile = descriptor_budget(api.max_connections)
    sock = _bind(host, port)
    server = _EmbeddedServer(_uvicorn_config(ctx, api, tls, connections, accept_batch))
    stopped = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            ctx.task_group = tg
            if ctx.metrics.lag is not None:
                tg.start_soon(ctx.metrics.lag.run)
            if ctx.rates is not None:
                tg.start_soon(ctx.rates.run)
            if ctx.series is not None:
                tg.start_soon(ctx.series.run)
            tg.start_soon(_serve_until_stopped, server, sock, stopped)
            await server.ready.wait()
            bound = sock.getsockname()[1]
            _log_listening(host, bound, connections, nofile, tls)
            task_status.started(bound)
            try:
                await anyio.sleep_forever()
            finally:
                ctx.closing.set()
                await _shut_down(server, stopped)
                tg.cancel_scope.cancel()
    finally:
        ctx.task_group = None
        sock.close()


def _uvicorn_config(
    ctx: ApiContext, api: ApiSettings, tls: bool, connections: int, accept_batch: int
) -> uvicorn.Config:
    """uvicorn serving the app over ``ctx``: no logging or lifespan of its own, the guarded
    protocol (connection and header-time limits), TLS when configured."""
    return uvicorn.Config(
        create_app(ctx),
        log_config=None,
        access_log=False,
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=2,
        http=guarded_protocol(connections, api.header_timeout),
        backlog=accept_batch,
        ssl_certfile=api.tls_certfile if tls else None,
        ssl_keyfile=api.tls_keyfile if tls else None,
    )


async def _serve_until_stopped(
    server: _EmbeddedServer, sock: socket.socket, stopped: anyio.Event
) -> None:
    """Run ``server`` on ``sock``; set ``stopped`` when it ends."""
    # Shielded: on cancellation the server shuts down gracefully (should_exit) instead of
    # being torn down mid-request with its socket left open.
    try:
        with anyio.CancelScope(shield=True):
            await server.serve([sock])
    finally:
        stopped.set()


async def _shut_down(server: _EmbeddedServer, stopped: anyio.Event) -> None:
    """Ask ``server`` to finish its requests; force it after :data:`_SHUTDOWN_TIMEOUT`."""
    server.should_exit = True
    with anyio.move_on_after(_SHUTDOWN_TIMEOUT, shield=True):
        await stopped.wait()
    server.force_exit = True


def _log_listening(host: str, port: int, connections: int, nofile: int, tls: bool) -> None:
    log.info(
        "api_listening",
        host=host,
        port=port,
        max_connections=connections,
        open_file_limit=nofile,
        tls=tls,
    )
    if not tls and not _is_loopback(host):
        log.warning(
            "api_plain_http",
            host=host,
            risk="bearer tokens and data cross the network unencrypted: anyone on "
            "the path can read and reuse them",
            fix="set [api] tls_certfile and tls_keyfile, serve behind a TLS proxy "
            "on 127.0.0.1, or listen on 127.0.0.1",
        )


async def serve_api(
    backend: BaseStateBackend,
    api: ApiSettings,
    *,
    daemon: Daemon | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API on ``api.host:api.port`` inside the caller's task group.

    ``await tg.start(serve_api, backend, settings.api, daemon=daemon)`` returns the port once
    it listens; cancelling the group stops it gracefully.

    :param backend: the open store.
    :param api: the ``[api]`` settings: address, limits, TLS.
    :param daemon: the daemon in this process; without one (``watchkeeper api``) the watcher
        figures come from the status rows the daemons save and the event log.
    :param task_status: given the bound port once the server listens.
    :raises ApiListenError: the address cannot be bound, or the TLS files cannot be loaded.
    """
    ctx = api_context(backend, api, daemon=daemon)
    await serve_app(ctx, host=api.host, port=api.port, settings=api, task_status=task_status)
