"""LoopThreads: results, errors, context, cancellation (abandoned or awaited), size."""

from __future__ import annotations

import contextvars
import threading
import time

import anyio
import pytest
from watchkeeper.store.protocols import LoopThreads

pytestmark = pytest.mark.anyio

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the pool hands results back with the asyncio loop's call_soon_threadsafe


async def test_result_error_and_context_come_back() -> None:
    threads = LoopThreads(2, name="t-result")
    try:
        VAR.set("from the caller")
        assert await threads.call(lambda: (VAR.get(), threading.current_thread().name)) == (
            "from the caller",
            "t-result-1",
        )

        def boom() -> None:
            raise LookupError("from the task")

        with pytest.raises(LookupError, match="from the task"):
            await threads.call(boom)
    finally:
        threads.close()


async def test_many_calls_at_once_use_at_most_size_threads() -> None:
    """Forty calls from forty tasks: each gets its own result; never more than ``size`` run
    at once, and the pool starts no more threads than that."""
    threads = LoopThreads(3, name="t-many")
    lock = threading.Lock()
    now = peak = 0

    def work(i: int) -> int:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.002)
        with lock:
            now -= 1
        return i * i

    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await threads.call(lambda: work(i))

    try:
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
        assert results == {i: i * i for i in range(40)}
        assert peak == 3
        names = {t.name for t in threading.enumerate() if t.name.startswith("t-many-")}
        assert names == {"t-many-1", "t-many-2", "t-many-3"}
    finally:
        threads.close()


async def test_cancelled_call_not_started_never_runs() -> None:
    threads = LoopThreads(1, name="t-queued")
    release = threading.Event()
    ran: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(threads.call, release.wait)  # occupies the only thread
            await anyio.sleep(0.05)
            with anyio.move_on_after(0.05):
                await threads.call(lambda: ran.append("queued"))
            release.set()
        assert await threads.call(lambda: "next") == "next"  # the pool still serves
        assert ran == []
    finally:
        threads.close()


async def test_abandoned_call_runs_on_and_a_thread_replaces_it() -> None:
    """A call cancelled while it runs finishes in its thread (its result dropped); meanwhile
    the pool starts another thread, so ``size`` calls can still run."""
    threads = LoopThreads(1, name="t-stuck")
    release = threading.Event()
    finished = threading.Event()

    def stuck() -> str:
        release.wait(10)
        finished.set()
        return "dropped"

    try:
        with anyio.move_on_after(0.1) as scope:
            await threads.call(stuck)
        assert scope.cancelled_caught
        with anyio.fail_after(5):
            assert await threads.call(lambda: threading.current_thread().name) == "t-stuck-2"
        assert not finished.is_set()
        release.set()
        assert await anyio.to_thread.run_sync(finished.wait, 5)
    finally:
        release.set()
        threads.close()


async def test_call_not_abandoned_is_awaited_through_a_cancellation() -> None:
    """``abandon=False``: the cancelled caller waits until the call has run (the SQLite
    writer must know what its batch did), then is cancelled."""
    threads = LoopThreads(1, name="t-awaited")
    done: list[str] = []

    def slow() -> None:
        time.sleep(0.3)
        done.append("ran")

    try:
        with anyio.move_on_after(0.05) as scope:
            await threads.call(slow, abandon=False)
            done.append("returned")  # never: the cancellation comes once it has run
        assert scope.cancelled_caught
        assert done == ["ran"]
        assert await threads.call(lambda: threading.current_thread().name) == "t-awaited-1"
    finally:
        threads.close()


async def test_close_stops_the_threads_and_refuses_calls() -> None:
    threads = LoopThreads(2, name="t-close")
    await threads.call(lambda: None)
    threads.close()
    with pytest.raises(RuntimeError, match="closed"):
        await threads.call(lambda: None)
    pool = [t for t in threading.enumerate() if t.name.startswith("t-close-")]
    assert pool
    for thread in pool:
        await anyio.to_thread.run_sync(thread.join, 5)
        assert not thread.is_alive()


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LoopThreads(0, name="t-none")
