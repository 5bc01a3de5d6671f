"""The group-commit queue's linger: a write that expects company waits briefly for it."""

from __future__ import annotations

import anyio
from watchkeeper.store._commit_queue import CommitQueue, QueuedWrite


def _queue(batches: list[list[str]], linger: float) -> CommitQueue[QueuedWrite]:
    async def run_batch(batch: list[QueuedWrite]) -> None:
        batches.append([w.result for w in batch])
        for write in batch:
            write.ran = True

    return CommitQueue(
        "test",
        run_batch,
        in_flight_error=lambda: RuntimeError("in flight"),
        max_batch=100,
        linger=linger,
    )


def _write(name: str, company: int = 0) -> QueuedWrite:
    write = QueuedWrite()
    write.result, write.company = name, company
    return write


async def _send_apart(queue: CommitQueue[QueuedWrite], first: QueuedWrite) -> None:
    """``first``, then (once the writer has it) two more writes; wait for all three."""
    later = [_write("b"), _write("c")]
    async with anyio.create_task_group() as tg:
        await tg.start(queue.run)
        queue.put(first)
        await anyio.sleep(0.05)  # the writer took ``first`` and found the queue empty
        for write in later:
            queue.put(write)
        for write in (first, *later):
            await write.done
        queue.close()


async def test_a_write_waits_for_the_company_it_expects() -> None:
    """Two more writes expected, and both come while it lingers: one batch of three. (The
    linger is long, so the test would hang past its deadline if the writer did not stop
    waiting as soon as they were queued.)"""
    batches: list[list[str]] = []
    with anyio.fail_after(5):
        await _send_apart(_queue(batches, linger=30), _write("a", company=2))
    assert batches == [["a", "b", "c"]]


async def test_without_company_or_linger_a_write_goes_alone() -> None:
    """A write that expects nobody, or a queue without a linger, does not wait."""
    for first, linger in ((_write("a"), 30.0), (_write("a", company=2), 0.0)):
        batches: list[list[str]] = []
        with anyio.fail_after(5):
            await _send_apart(_queue(batches, linger), first)
        assert batches == [["a"], ["b", "c"]]


async def test_company_that_never_comes_is_waited_for_only_the_linger() -> None:
    batches: list[list[str]] = []
    queue = _queue(batches, linger=0.01)
    lone = _write("a", company=5)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(queue.run)
            queue.put(lone)
            await lone.done
            queue.close()
    assert batches == [["a"]]
