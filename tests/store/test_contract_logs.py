"""The contract of the logs kept with each run, on memory, SQLite and PostgreSQL: appends in
order, the cap that keeps each try's tail, reads after a seq and of one try, unknown runs,
redaction, and retention with the run's events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from watchkeeper.store import (
    ArgumentTypeError,
    Asset,
    BaseStateBackend,
    InvalidArgumentError,
    LogChunk,
    RunNotFoundError,
)
from watchkeeper.store.protocols import EventCommit, TaskSpec, encode_json

from tests.support.clock import T0, Clock

TTL = timedelta(seconds=30)


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[Any]:
    """The backend on a settable clock, with a task ``t`` on asset ``a``."""
    backend.clock = Clock()
    await backend.events.aregister_assets([Asset("a")])
    await backend.tasks.async_tasks([TaskSpec("t", ("a",), max_events=1)])
    yield backend


async def make_run(store: Any) -> int:
    """A run of ``t``, claimed (its first try running)."""
    commit = EventCommit("w", ("a",), encode_json({"n": 1}, what="payload"))
    await store.events.acommit(commit)
    run = await store.tasks.acreate_run("t")
    assert run is not None
    (claimed,) = await store.tasks.aclaim_runs("w1", limit=1, ttl=TTL)
    assert claimed.id == run.id
    return int(run.id)


def texts(chunks: list[LogChunk]) -> list[tuple[int, str, str]]:
    return [(c.try_number, c.stream, c.text) for c in chunks]


class TestAppendAndList:
    async def test_chunks_come_back_in_order(self, store: Any) -> None:
        """Appended chunks are listed in order, each with its run, try, stream and a growing seq."""
        run_id = await make_run(store)
        await store.logs.aappend(run_id, 1, [("stdout", "one\n"), ("stderr", "two\n")])
        await store.logs.aappend(run_id, 1, [("log", "three\n")])
        chunks = await store.logs.alist(run_id)
        assert texts(chunks) == [
            (1, "stdout", "one\n"),
            (1, "stderr", "two\n"),
            (1, "log", "three\n"),
        ]
        assert all(c.run_id == run_id for c in chunks)
        seqs = [c.seq for c in chunks]
        assert seqs == sorted(set(seqs)) and seqs[0] >= 1
        assert chunks[0].created_at == T0

    async def test_after_seq_and_limit(self, store: Any) -> None:
        """``after_seq`` gives what came after a chunk already read; ``limit`` bounds a page."""
        run_id = await make_run(store)
        await store.logs.aappend(run_id, 1, [("stdout", f"{i}\n") for i in range(5)])
        first = await store.logs.alist(run_id, limit=2)
        assert [c.text for c in first] == ["0\n", "1\n"]
        rest = await store.logs.alist(run_id, after_seq=first[-1].seq)
        assert [c.text for c in rest] == ["2\n", "3\n", "4\n"]
        assert await store.logs.alist(run_id, after_seq=rest[-1].seq) == []

    async def test_one_try_or_all(self, store: Any) -> None:
        """Each try keeps its own chunks; a listing takes one try or all of them in order."""
        run_id = await make_run(store)
        await store.logs.aappend(run_id, 1, [("stdout", "first try\n")])
        await store.logs.aappend(run_id, 2, [("stdout", "second try\n")])
        assert texts(await store.logs.alist(run_id, try_number=2)) == [
            (2, "stdout", "second try\n")
        ]
        assert [c.try_number for c in await store.logs.alist(run_id)] == [1, 2]

    async def test_runs_do_not_mix(self, store: Any) -> None:
        """Two runs' chunks stay apart."""
        one, two = await make_run(store), await make_run(store)
        await store.logs.aappend(one, 1, [("stdout", "one\n")])
        await store.logs.aappend(two, 1, [("stdout", "two\n")])
        assert [c.text for c in await store.logs.alist(one)] == ["one\n"]
        assert [c.text for c in await store.logs.alist(two)] == ["two\n"]

    async def test_empty_texts_are_skipped(self, store: Any) -> None:
        """Empty texts store nothing."""
        run_id = await make_run(store)
        await store.logs.aappend(run_id, 1, [("stdout", ""), ("stderr", "x")])
        await store.logs.aappend(run_id, 1, [])
        assert texts(await store.logs.alist(run_id)) == [(1, "stderr", "x")]


class TestCap:
    async def test_the_tail_is_kept(self, store: Any) -> None:
        """Past the cap a try's oldest chunks go whole; the newest are kept, at most the cap."""
        run_id = await make_run(store)
        for i in range(10):
            await store.logs.aappend(run_id, 1, [("stdout", f"line {i}\n")], max_bytes=20)
        kept = await store.logs.alist(run_id)
        assert [c.text for c in kept] == ["line 8\n", "line 9\n"]
        assert sum(len(c.text.encode()) for c in kept) <= 20

    async def test_cap_is_per_try(self, store: Any) -> None:
        """One try's cap never drops another try's chunks."""
        run_id = await make_run(store)
        await store.logs.aappend(run_id, 1, [("stdout", "a" * 10)], max_bytes=10)
        await store.logs.aappend(run_id, 2, [("stdout", "b" * 10)], max_bytes=10)
        await store.logs.aappend(run_id, 2, [("stdout", "c" * 10)], max_bytes=10)
        assert [c.text for c in await store.logs.alist(run_id)] == ["a" * 10, "c" * 10]

    async def test_a_long_chunk_keeps_its_end(self, store: Any) -> None:
        """A chunk longer than the cap keeps its last bytes (a character cut in two is dropped)."""
        run_id = await make_run(store)
        await store.logs.aappend(run_id, 1, [("stdout", "é" * 10 + "end")], max_bytes=8)
        (chunk,) = await store.logs.alist(run_id)
        assert chunk.text == "ééend"

    async def test_a_batch_over_the_cap_keeps_its_tail(self, store: Any) -> None:
        """One append larger than the cap keeps its newest chunks."""
        run_id = await make_run(store)
        batch = [("stdout", f"{i:04}") for i in range(10)]
        await store.logs.aappend(run_id, 1, batch, max_bytes=12)
        assert [c.text for c in await store.logs.alist(run_id)] == ["0007", "0008", "0009"]


class TestText:
    async def test_secrets_are_masked(self, store: Any) -> None:
        """A URL's password and a token in a query string are stored masked."""
        run_id = await make_run(store)
        line = "connecting to postgresql://app:hunter2@db/x?token=abc123\n"
        await store.logs.aappend(run_id, 1, [("stdout", line)])
        (chunk,) = await store.logs.alist(run_id)
        assert "hunter2" not in chunk.text and "abc123" not in chunk.text
        assert "postgresql://app:***@db/x" in chunk.text

    async def test_nul_and_lone_surrogates_are_replaced(self, store: Any) -> None:
        """Text no database column holds is stored with U+FFFD in its place."""
        run_id = await make_run(store)
        await store.logs.aappend(run_id, 1, [("stdout", "a\x00b\udcffc")])
        (chunk,) = await store.logs.alist(run_id)
        assert chunk.text.startswith("a\ufffdb\ufffd") and chunk.text.endswith("c")


class TestRejected:
    async def test_unknown_run(self, store: Any) -> None:
        """An unknown run is the store's not-found error naming it, and nothing is stored."""
        with pytest.raises(RunNotFoundError, match="run 999 does not exist"):
            await store.logs.aappend(999, 1, [("stdout", "x")])
        with pytest.raises(RunNotFoundError, match="run 999 does not exist"):
            await store.logs.alist(999)
        run_id = await make_run(store)
        assert await store.logs.alist(run_id) == []

    @pytest.mark.parametrize(
        ("args", "kwargs", "error", "says"),
        [
            ((0, 1, [("stdout", "x")]), {}, InvalidArgumentError, "run_id"),
            ((1, 0, [("stdout", "x")]), {}, InvalidArgumentError, "try_number"),
            ((1, 1, [("stdin", "x")]), {}, InvalidArgumentError, "stream"),
            ((1, 1, [("stdout", b"x")]), {}, ArgumentTypeError, "text"),
            ((1, 1, ["stdout x"]), {}, ArgumentTypeError, "chunks"),
            ((1, 1, "stdout"), {}, ArgumentTypeError, "chunks"),
            ((1, 1, [("stdout", "x")]), {"max_bytes": 0}, InvalidArgumentError, "max_bytes"),
        ],
    )
    async def test_bad_append(
        self, store: Any, args: tuple[Any, ...], kwargs: dict[str, Any], error: type, says: str
    ) -> None:
        """A bad argument is an error naming it, and nothing is stored."""
        run_id = await make_run(store)
        with pytest.raises(error, match=says):
            await store.logs.aappend(*args, **kwargs)
        assert await store.logs.alist(run_id) == []

    @pytest.mark.parametrize(
        ("kwargs", "says"),
        [
            ({"try_number": 0}, "try_number"),
            ({"after_seq": -1}, "after_seq"),
            ({"limit": 0}, "limit"),
        ],
    )
    async def test_bad_list(self, store: Any, kwargs: dict[str, Any], says: str) -> None:
        """A bad listing argument is an error naming it."""
        run_id = await make_run(store)
        with pytest.raises(InvalidArgumentError, match=says):
            await store.logs.alist(run_id, **kwargs)


class TestRetention:
    async def test_logs_go_with_the_finished_runs_events(self, store: Any) -> None:
        """GC deletes a finished run's logs once it finished before the events' retention,
        and keeps a running run's; a dry run only counts."""
        done, running = await make_run(store), await make_run(store)
        (claimed,) = [r for r in await store.tasks.alist_runs() if r.id == done]
        await store.tasks.afinish_run(done, "w1", claimed.lease_token, success=True)
        await store.logs.aappend(done, 1, [("stdout", "a"), ("stdout", "b")])
        await store.logs.aappend(running, 1, [("stdout", "c")])
        soon = T0 + timedelta(days=1)
        report = await store.gc.acollect_garbage(now=soon, event_retention_days=30)
        assert report.logs == 0 and len(await store.logs.alist(done)) == 2
        later = T0 + timedelta(days=31)
        report = await store.gc.acollect_garbage(now=later, event_retention_days=30, dry_run=True)
        assert report.logs == 2 and len(await store.logs.alist(done)) == 2
        report = await store.gc.acollect_garbage(now=later, event_retention_days=30)
        assert report.logs == 2
        assert await store.logs.alist(done) == []
        assert [c.text for c in await store.logs.alist(running)] == ["c"]

    async def test_batched_gc(self, store: Any) -> None:
        """With a batch size the logs go in batches, all of them in the end."""
        run_id = await make_run(store)
        (claimed,) = await store.tasks.alist_runs()
        await store.tasks.afinish_run(run_id, "w1", claimed.lease_token, success=True)
        await store.logs.aappend(run_id, 1, [("stdout", str(i)) for i in range(5)])
        later = T0 + timedelta(days=31)
        report = await store.gc.acollect_garbage(now=later, batch_size=2)
        assert report.logs == 5 and await store.logs.alist(run_id) == []

    async def test_zero_retention_keeps_logs(self, store: Any) -> None:
        """``retention_days = 0`` keeps events forever, and the logs with them."""
        run_id = await make_run(store)
        (claimed,) = await store.tasks.alist_runs()
        await store.tasks.afinish_run(run_id, "w1", claimed.lease_token, success=True)
        await store.logs.aappend(run_id, 1, [("stdout", "x")])
        far = T0 + timedelta(days=3650)
        report = await store.gc.acollect_garbage(now=far, event_retention_days=0)
        assert report.logs == 0 and len(await store.logs.alist(run_id)) == 1
