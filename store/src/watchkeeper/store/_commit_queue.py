"""The group-commit core both SQL backends share: a queue of writes, batches, and the fan-out
of each write's outcome to its caller.

Callers :meth:`CommitQueue.submit` a :class:`QueuedWrite` and wait for it; one writer task
(:meth:`CommitQueue.run`, started in the backend's task group) takes everything queued, up to
``max_batch`` writes and ``max_batch_bytes`` of their :meth:`~QueuedWrite.weight`, and hands
the batch to the backend's ``run_batch``. That gives each write its outcome (a result or an
error of its own: each backend's writer replays a failed batch so only the culprit fails, the
SQLite one by savepoints inside the transaction, the PostgreSQL one one write per
transaction); when it returns, the queue wakes every caller of the batch. So an awaited write has committed when it
returns, and many concurrent writers share one commit.

With ``concurrency`` above 1 (PostgreSQL: one connection per batch in flight), the next batch
is handed over while earlier ones are still running, as long as it shares no key with any of
them (``keys_of``: the rows a batch writes, or None for a batch that must run alone); a batch
that does waits for them to finish, and nothing behind it starts first. So two writes to the
same key still commit in the order they were queued, and concurrent batches never contend for
the same rows. A batch of fewer than ``_MIN_OVERLAP`` writes is not sent beside others: it
waits for one in flight to land and takes what arrived meanwhile.

A write may say that others are about to follow it (:attr:`QueuedWrite.company`: a worker's
slot finishing while its other slots are running a task): when the writer takes it first and
fewer than that many are queued behind it, the writer waits up to ``linger`` seconds
(:data:`LINGER`), or until they are, before it takes the batch, so they share its transaction
instead of each going alone. The slots of a worker running short tasks do not finish at once:
without it, the first found the queue idle and went alone, and the rest went together behind
it. Waiting a fraction of a millisecond is cheap against the transaction each lone step costs
(the measured gain is in ``BENCHMARKS.md``).

Cancellation: handing a write over has no checkpoint, so a caller cancelled in ``submit``
only stops waiting, and its write may still commit. When the
writer task stops (the backend closes, or it is cancelled), the writes of a batch whose
``run_batch`` did not return and that it did not :meth:`~QueuedWrite.settle` get
``in_flight_error()``, and the queued ones :class:`StoreClosedError`: nobody waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, NamedTuple, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from ._batch_sizes import BatchSizes
from .errors import StoreClosedError

__all__ = ["WRITE_OVERHEAD", "CommitQueue", "CommitStats", "QueuedWrite"]

W = TypeVar("W", bound="QueuedWrite")

_MIN_OVERLAP: Final = 32
"""The fewest writes an overlapping queue sends beside batches already in flight."""

WRITE_OVERHEAD: Final = 256
"""What a write costs towards ``max_batch_bytes`` beyond its values (a guess at the overhead)."""


class CommitStats(NamedTuple):
    """Group-commit counters of one opening: ``writes / batches`` is the mean batch size."""

    batches: int
    writes: int


LINGER: Final = 0.0003
"""Seconds at most that the writer waits for the company a batch's first write expects."""


class QueuedWrite:
    """One write waiting for the writer: its outcome, and the future its caller awaits.

    A bare asyncio future rather than an ``anyio.Event``: cheaper per write, which a large
    batch pays once per write (both drivers tie their backend to asyncio anyway).
    """

    __slots__ = ("company", "done", "error", "ran", "result", "settled")

    def __init__(self) -> None:
        self.company = 0
        """How many more writes are likely to be queued right after this one (a hint)."""
        # The C constructor takes the running loop itself; loop.create_future() is one
        # Python frame more per write.
        self.done: asyncio.Future[None] = asyncio.Future()
        self.result: Any = None
        self.error: BaseException | None = None
        self.ran = False
        """Whether an attempt reached this write."""
        self.settled = False
        """Whether its outcome is final and its caller woken."""

    def weight(self) -> int:
        """Bytes this write counts towards the batch size limit."""
        return WRITE_OVERHEAD

    def reset(self) -> None:
        """Forget the outcome of an earlier attempt (the batch or the write runs again)."""
        self.ran, self.result, self.error = True, None, None

    def fail(self, error: BaseException) -> None:
        """Record ``error`` as the outcome (the caller raises it); safe from any thread."""
        self.ran, self.result, self.error = True, None, error

    def settle(self) -> None:
        """The outcome is final: wake the caller (on the loop's thread; a caller that was
        cancelled has left, and its future is already done)."""
        self.settled = True
        if not self.done.done():
            self.done.set_result(None)

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class CommitQueue(Generic[W]):
    """The queue of one backend's writes and the loop that batches them; see the module."""

    def __init__(
        self,
        owner: object,
        run_batch: Callable[[list[W]], Awaitable[None]],
        *,
        in_flight_error: Callable[[], BaseException],
        max_batch: int,
        max_batch_bytes: int | None = None,
        concurrency: int = 1,
        keys_of: Callable[[list[W]], frozenset[object] | None] | None = None,
        linger: float = LINGER,
    ) -> None:
        self._owner = owner
        self._linger = linger
        self._concurrency = concurrency
        self._keys_of = keys_of
        self._flying: list[frozenset[object] | None] = []
        """The keys of each batch in flight (None: a batch that runs alone)."""
        self._landed = anyio.Event()
        """Set (and replaced) each time a batch in flight finishes."""
        self._run_batch = run_batch
        self._in_flight_error = in_flight_error
        self._max_batch = max_batch
        self._max_bytes = max_batch_bytes
        # A plain deque, not bounded: every caller waits for its own write, so it holds at
        # most one write per waiting caller. (A bounded stream parked the callers beyond its
        # size, and waking them one by one was a large share of the loop with many writers.)
        self._queue: deque[W] = deque()
        self._closed = False
        self._wakeup: anyio.Event | None = None
        """Set when the writer waits for the first write of its next batch."""
        self._stopped = anyio.Event()
        self.batches = 0
        """Batches run so far (a replayed batch counts once)."""
        self.writes = 0
        """Writes those batches carried."""
        self.batch_sizes = BatchSizes()
        """How many writes each of those batches carried (a histogram)."""
        self.held = 0
        """Writes of the next batch while it waits for batches in flight to land (it shares a
        key with one, every connection is busy, or it is too small to go beside them)."""
        self._held_changed = anyio.Event()

    @property
    def stats(self) -> CommitStats:
        return CommitStats(self.batches, self.writes)

    async def wait_held(self, writes: int = 1) -> None:
        """Return once at least ``writes`` writes wait behind the batches in flight: what is
        queued behind a batch that the server holds up can be seen, not guessed at."""
        while self.held < writes:
            await self._held_changed.wait()

    def _hold(self, writes: int) -> None:
        if writes != self.held:
            self.held = writes
            changed, self._held_changed = self._held_changed, anyio.Event()
            changed.set()

    async def submit(self, write: W) -> Any:
        """Queue ``write``, wait until its batch has run, and return its result (or raise)."""
        self.put(write)
        # Cancelling this await cancels only the waiting: the write stays queued.
        await write.done
        return write.outcome()

    def put(self, write: W) -> None:
        """Queue ``write`` without waiting: the caller awaits ``write.done``, then takes
        :meth:`~QueuedWrite.outcome` (what :meth:`submit` does, one coroutine fewer on a hot
        path). Raises :class:`StoreClosedError` once the queue is closed, queueing nothing."""
        if self._closed:
            raise StoreClosedError(self._owner)
        self._queue.append(write)  # no checkpoint: nothing can interrupt the hand-over
        wakeup = self._wakeup
        if wakeup is not None:
            wakeup.set()

    def close(self) -> None:
        """Accept no more writes; :meth:`run` returns once the queue is drained."""
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.set()

    def discard(self) -> None:
        """Close the queue of a writer that never ran (failing anything queued)."""
        self._closed = True
        self._fail_unsettled(list(self._queue), lambda: StoreClosedError(self._owner))
        self._queue.clear()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run batch after batch until :meth:`close` and an empty queue.

        One loop for both modes: with ``concurrency`` 1 each batch runs in this task, the
        next one taken only once it has landed (so it holds what the callers of the last one
        queued meanwhile); above 1, batches run in a task group beside each other, as long as
        no two in flight share a key.
        """
        task_status.started()
        batch: list[W] = []
        carry: W | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                tg: anyio.abc.TaskGroup | None = None
                if self._concurrency > 1:
                    tg = await stack.enter_async_context(anyio.create_task_group())
                while True:
                    # Let the callers of the last batch run first: most queue their next
                    # write at once, so the next batch is larger (BENCHMARKS.md) for one pass
                    # of the loop.
                    await anyio.lowlevel.checkpoint()
                    if carry is None:
                        carry = await self._next()
                        if carry is None:
                            break
                        if carry.company and self._linger:
                            await self._wait_for_company(carry.company)
                    # Everything queued, as one batch: splitting it over the free connections
                    # cost more CPU per event (each batch has a fixed cost of a few round
                    # trips; BENCHMARKS.md), and the machine is more often short of CPU than
                    # of round trips.
                    batch, carry = self._take(carry)
                    if self._flying and carry is None and len(batch) < _MIN_OVERLAP:
                        # A few writes are not worth a transaction beside the ones in flight:
                        # wait for one to land, and take what arrived meanwhile with them.
                        self._hold(len(batch))
                        await self._landed.wait()
                        self._hold(0)
                        carry = self._fill(batch)
                    keys = None if self._keys_of is None else self._keys_of(batch)
                    while self._flying and (
                        len(self._flying) >= self._concurrency
                        or keys is None
                        or any(k is None or not k.isdisjoint(keys) for k in self._flying)
                    ):
                        self._hold(len(batch))
                        await self._landed.wait()
                    self._hold(0)
                    self._flying.append(keys)
                    if tg is None:
                        await self._run_one(batch, keys)
                    else:
                        tg.start_soon(self._run_one, batch, keys)
                    batch = []
        finally:
            self._hold(0)
            self._fail_unsettled(batch, self._in_flight_error)
            self._closed = True
            leftovers: list[W] = [] if carry is None else [carry]
            leftovers.extend(self._queue)
            self._queue.clear()
            self._fail_unsettled(leftovers, lambda: StoreClosedError(self._owner))
            self._stopped.set()

    async def _run_one(self, batch: list[W], keys: frozenset[object] | None) -> None:
        try:
            await self._run_batch(batch)
        except BaseException:
            self._fail_unsettled(batch, self._in_flight_error)
            raise
        finally:
            self._flying.remove(keys)
            landed, self._landed = self._landed, anyio.Event()
            landed.set()
        self.batches += 1
        self.writes += len(batch)
        self.batch_sizes.observe(len(batch))
        _settle_all(batch)

    async def _next(self) -> W | None:
        """The first write of the next batch, once there is one; None once closed and empty."""
        while not self._queue:
            if self._closed:
                return None
            await self._wait_for_put()
        return self._queue.popleft()

    async def _wait_for_company(self, company: int) -> None:
        """Wait until ``company`` writes are queued, or ``linger`` seconds have passed."""
        with anyio.move_on_after(self._linger):
            while len(self._queue) < company and not self._closed:
                await self._wait_for_put()

    async def _wait_for_put(self) -> None:
        """Wait for the next :meth:`put` (or :meth:`close`)."""
        self._wakeup = wakeup = anyio.Event()
        try:
            await wakeup.wait()
        finally:
            self._wakeup = None

    def _take(self, first: W) -> tuple[list[W], W | None]:
        """``first`` and what else is queued, up to the limits; the write that would overflow
        ``max_batch_bytes`` is carried to the next batch."""
        batch = [first]
        return batch, self._fill(batch)

    def _fill(self, batch: list[W]) -> W | None:
        """Add what is queued to ``batch``, up to the limits; return the write that would
        overflow ``max_batch_bytes`` (carried to the next batch)."""
        size = sum(write.weight() for write in batch)
        queue = self._queue
        while queue and len(batch) < self._max_batch:
            write = queue.popleft()
            if self._max_bytes is not None:
                size += write.weight()
                if size > self._max_bytes:
                    return write
            batch.append(write)
        return None

    @staticmethod
    def _fail_unsettled(writes: list[W], error: Callable[[], BaseException]) -> None:
        """Fail and wake each write of ``writes`` whose outcome is not final yet."""
        for write in writes:
            if not write.settled:
                write.fail(error())
                write.settle()


def _settle_all(batch: list[W]) -> None:
    """:meth:`QueuedWrite.settle` of every write of a landed batch, in one pass: each future
    set here schedules its caller's wake-up, and all of them run in the loop's next pass."""
    for write in batch:
        write.settled = True
        done = write.done
        if not done.done():
            done.set_result(None)
