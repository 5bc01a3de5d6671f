"""AsyncService, the lifecycle the runner, the daemon and the test kit's sources share."""

from __future__ import annotations

import contextlib

import anyio
import anyio.abc
import pytest
from watchkeeper.triggerer._core import AsyncService


class Recorder(AsyncService):
    """A service that notes each step of its lifecycle in ``steps``."""

    def __init__(self, *, fail_in: str | None = None) -> None:
        self.steps: list[str] = []
        self.fail_in = fail_in

    async def _aopen(self, resources: contextlib.AsyncExitStack) -> None:
        self.steps.append("open")
        resources.callback(self.steps.append, "release first resource")
        resources.callback(self.steps.append, "release second resource")
        if self.fail_in == "open":
            raise ValueError("open failed")

    async def _astart(self, task_group: anyio.abc.TaskGroup) -> None:
        self.steps.append("start")
        await task_group.start(self._task)
        if self.fail_in == "start":
            raise ValueError("start failed")

    async def _task(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await anyio.sleep_forever()
        finally:
            self.steps.append("task ended")

    async def _astop(self) -> None:
        self.steps.append("stop")


class TestAsyncService:
    async def test_close_stops_then_cancels_then_releases(self) -> None:
        """Closing winds down first, then ends the tasks, then releases resources in reverse."""
        service = Recorder()
        async with service:
            running = [service.is_running]
            assert service.steps == ["open", "start"]
        running.append(service.is_running)
        assert running == [True, False]
        assert service.steps == [
            "open",
            "start",
            "stop",
            "task ended",
            "release second resource",
            "release first resource",
        ]

    @pytest.mark.parametrize("where", ["open", "start"])
    async def test_a_failed_start_undoes_what_it_did(self, where: str) -> None:
        """A start that fails ends the tasks it started and releases what it held, re-raising."""
        service = Recorder(fail_in=where)
        with pytest.raises(ValueError, match=f"{where} failed"):
            await service.start()
        assert not service.is_running
        assert service.steps[-2:] == ["release second resource", "release first resource"]
        assert ("task ended" in service.steps) == (where == "start")
        await service.aclose()  # closing a service that never ran is a no-op

    async def test_starts_only_once(self) -> None:
        """A second start, while running or after closing, raises RuntimeError."""
        service = Recorder()
        async with service:
            with pytest.raises(RuntimeError, match="only once"):
                await service.start()
        with pytest.raises(RuntimeError, match="only once"):
            await service.start()

    async def test_aclose_twice_is_a_no_op(self) -> None:
        """aclose() on a closed service changes nothing."""
        service = Recorder()
        await service.start()
        await service.aclose()
        steps = list(service.steps)
        await service.aclose()
        assert service.steps == steps

    async def test_dropped_while_running_warns(self) -> None:
        """A service finalized while running warns with ResourceWarning; a closed one does not."""
        service = Recorder()
        await service.start()
        with pytest.warns(ResourceWarning, match="Recorder was not closed"):
            service.__del__()
        await service.aclose()
        service.__del__()  # closed: silent (filterwarnings = error would fail the test)

    async def test_services_without_tasks_close_in_any_order(self) -> None:
        """Services that start no tasks hold no task group: opened in one order, they close in
        the same order (a task group would have to close last-opened first)."""

        class Holder(AsyncService):
            def __init__(self, log: list[str], name: str) -> None:
                self.log, self.name = log, name

            async def _aopen(self, resources: contextlib.AsyncExitStack) -> None:
                resources.callback(self.log.append, self.name)

        log: list[str] = []
        first, second = Holder(log, "first"), Holder(log, "second")
        await first.start()
        await second.start()
        await first.aclose()
        await second.aclose()
        assert log == ["first", "second"]
