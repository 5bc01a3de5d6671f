"""The daemon as the main of its process: signals, and a shutdown that cannot hang.

:func:`run_daemon` is what ``watchkeeper triggerer`` runs: a :class:`~._daemon.Daemon` until
SIGTERM or SIGINT, then a clean stop (see :mod:`._daemon` for what stopping does), with the
HTTP API (:mod:`..api`) in the same process when ``[api] enabled``.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import threading
from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.abc
from watchkeeper.store.protocols import get_logger

from .._core import notify
from ..settings import Settings
from ._daemon import Daemon

__all__ = ["SHUTDOWN_STUCK_EXIT", "run_daemon", "start_api"]

log = get_logger(__name__)


async def run_daemon(
    settings: Settings,
    *,
    reload_interval: float | None = None,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """Run the daemon until one of ``signals`` arrives, then shut down cleanly and return.

    A signal that arrives while the daemon is still starting (reading the watcher files,
    opening the store) cancels the start-up, which undoes what it had done.

    Shutting down is bounded: a trigger that swallows every cancellation would otherwise keep
    the process alive forever, so a watchdog thread armed at the signal ends the process
    (exit status 70, log ``daemon_shutdown_stuck``) once ``stop_grace`` and a margin for
    flushing have passed. Whatever had committed stays committed; leases expire on their own.

    :param settings: the whole configuration (store, ``[triggerer]``, ``[api]``, logging).
    :param reload_interval: seconds between two looks at the watcher files (default:
        ``[triggerer] reload_interval``).
    :param signals: the signals that stop the daemon.
    """
    watchdog: list[threading.Timer] = []
    started = anyio.Event()
    stop = anyio.Event()
    starting = anyio.CancelScope()

    async def on_signal(received: AsyncIterator[int]) -> None:
        async for signum in received:
            log.info(
                "daemon_stopping", signal=signal.Signals(signum).name, starting=not started.is_set()
            )
            watchdog.append(_arm_shutdown_watchdog(settings.triggerer.stop_grace * 2 + 5))
            if not started.is_set():
                starting.cancel()
            stop.set()
            return

    if settings.api.enabled:
        # The web stack is imported now, before any trigger runs: imported once the daemon
        # runs, it would hold the loop long enough to let short leases lapse.
        importlib.import_module("watchkeeper.triggerer.api")
    error: Exception | None = None
    try:
        with anyio.open_signal_receiver(*signals) as received:
            async with anyio.create_task_group() as tg:
                tg.start_soon(on_signal, received)
                try:
                    with starting:
                        async with (
                            Daemon(settings, reload_interval=reload_interval, tune_gc=True) as d,
                            anyio.create_task_group() as api_tg,
                        ):
                            if settings.api.enabled:
                                await start_api(api_tg, d)
                            started.set()
                            notify(READY=1, STATUS=f"watching {d.watchers_path}")
                            await stop.wait()
                            notify(STOPPING=1)
                            api_tg.cancel_scope.cancel()  # the API stops first, then the daemon
                except Exception as exc:  # noqa: BLE001 - re-raised below, outside the group
                    error = exc
                finally:
                    tg.cancel_scope.cancel()
    finally:
        for timer in watchdog:
            timer.cancel()
    if error is not None:
        raise error


async def start_api(tg: anyio.abc.TaskGroup, daemon: Daemon) -> int | None:
    """Serve the HTTP API in the daemon's task group and return the port it listens on; a
    busy port is logged and None returned, and the watchers run without it (they matter more
    than the API)."""
    from ..api import ApiListenError, serve_api  # the web stack loads only when it serves

    try:
        port: int = await tg.start(
            functools.partial(serve_api, daemon.backend, daemon.settings.api, daemon=daemon)
        )
    except ApiListenError as exc:
        log.error("api_not_started", error=str(exc))
        return None
    return port


SHUTDOWN_STUCK_EXIT = 70  # EX_SOFTWARE


def _arm_shutdown_watchdog(timeout: float) -> threading.Timer:
    def stuck() -> None:
        log.error("daemon_shutdown_stuck", timeout=timeout, exit_status=SHUTDOWN_STUCK_EXIT)
        os._exit(SHUTDOWN_STUCK_EXIT)

    timer = threading.Timer(timeout, stuck)
    timer.daemon = True
    timer.start()
    return timer
