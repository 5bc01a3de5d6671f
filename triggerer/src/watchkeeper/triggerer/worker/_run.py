"""``run_worker``, the worker as the main of its process (signals, a graceful stop), and
``configure_connections``, the store's session settings for a worker."""

from __future__ import annotations

import signal
from collections.abc import Sequence

import anyio
from watchkeeper.store import BaseStateBackend
from watchkeeper.store.protocols import get_logger

from .._core import notify
from ..settings import Settings, WorkerSettings
from ._asset_task import AssetTask
from ._task_files import TaskFiles
from ._worker import Worker

__all__ = ["configure_connections", "run_worker"]

log = get_logger(__name__)


def configure_connections(backend: BaseStateBackend, settings: WorkerSettings, name: str) -> None:
    """Name the store's sessions ``name`` and bound their idle transactions by a run lease
    (:meth:`~watchkeeper.store.BaseStateBackend.configure_sessions`). Call before it opens.

    :param backend: the backend, not yet opened.
    :param settings: the ``[worker]`` settings whose lease bounds idle transactions.
    :param name: the session name the database shows (PostgreSQL's ``application_name``).
    """
    backend.configure_sessions(name, settings.lease_seconds)


async def run_worker(
    backend: BaseStateBackend,
    tasks: Sequence[AssetTask],
    settings: WorkerSettings,
    *,
    stop_grace: float = 10.0,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    process_settings: Settings | None = None,
    files: TaskFiles | None = None,
) -> None:
    """Run a :class:`Worker` on the opened ``backend`` until one of ``signals`` arrives, then
    stop claiming, give the runs in flight ``stop_grace`` seconds, and return.

    :param backend: an open backend with the tasks service.
    :param tasks: the tasks to run.
    :param settings: the ``[worker]`` settings.
    :param stop_grace: seconds the runs in flight get to finish after a signal.
    :param signals: the signals that stop the worker.
    :param process_settings: the whole configuration, for tasks run in child processes (see
        :class:`Worker`).
    :param files: the definition files ``tasks`` came from, followed while the worker runs.
    """
    worker = Worker(backend, tasks, settings, process_settings=process_settings, files=files)
    with anyio.open_signal_receiver(*signals) as received:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            notify(READY=1, STATUS=f"running {len(tasks)} task(s)")
            async for signum in received:
                log.info("worker_stopping", signal=signal.Signals(signum).name)
                notify(STOPPING=1)
                worker.stop_claiming()
                with anyio.move_on_after(stop_grace):
                    await worker.drained()
                tg.cancel_scope.cancel()
                break
