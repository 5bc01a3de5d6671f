"""The sync/async bridge of BaseStateBackend.

A backend implements one side of the hooks and gets the other: sync calls reach async hooks from
a worker thread, through a greenback portal on the loop thread, or on a private loop thread
after ``with backend:``; async calls reach sync hooks in a worker thread. A sync call on the
loop thread without a portal would stall the loop, so it is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread
import greenback
import pytest
from watchkeeper.store import (
    Asset,
    AssetScope,
    BaseStateBackend,
    MissingCapabilityError,
    SqliteStateBackend,
    StateScope,
    StoreClosedError,
    SyncCallInLoopError,
    TaskScope,
    VersionConflictError,
)
from watchkeeper.store.protocols import (
    Put,
    RawEntry,
    Services,
    Writer,
)

TASK = TaskScope("dag", "run_1", "task")
ORDERS = Asset("orders")


class _Rows:
    """The storage both test backends share: a dict, and the threads that touched it."""

    def __init__(self) -> None:
        self.rows: dict[tuple[StateScope, str], RawEntry] = {}
        self.threads: set[int] = set()

    def get(self, scope: StateScope, key: str) -> RawEntry | None:
        self.threads.add(threading.get_ident())
        return self.rows.get((scope, key))

    def put(self, put: Put) -> int:
        self.threads.add(threading.get_ident())
        old = self.rows.get((put.scope, put.key))
        current = 0 if old is None else old.version
        expected = put.expected_version
        if expected is not None and expected != current:
            raise VersionConflictError(put.key, expected, current)
        self.rows[(put.scope, put.key)] = RawEntry(
            key=put.key,
            value_json=put.value_json,
            version=current + 1,
            updated_at=datetime.now(UTC),
            writer=put.writer,
            expires_at=put.expires_at,
            never_expire=put.never_expire,
        )
        return current + 1

    def delete(self, scope: StateScope, key: str) -> bool:
        self.threads.add(threading.get_ident())
        return self.rows.pop((scope, key), None) is not None

    def clear(self, scope: StateScope, all_map_indices: bool) -> int:
        self.threads.add(threading.get_ident())

        def hit(other: StateScope) -> bool:
            if all_map_indices and isinstance(scope, TaskScope) and isinstance(other, TaskScope):
                return (other.dag_id, other.run_id, other.task_id) == (
                    scope.dag_id,
                    scope.run_id,
                    scope.task_id,
                )
            return other == scope

        doomed = [k for k in self.rows if hit(k[0])]
        for k in doomed:
            del self.rows[k]
        return len(doomed)

    def list(self, scope: StateScope) -> list[RawEntry]:
        self.threads.add(threading.get_ident())
        return sorted((v for k, v in self.rows.items() if k[0] == scope), key=lambda r: r.key)


class SyncOnlyBackend(BaseStateBackend):
    """Implements only the sync hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.store = _Rows()

    def _get(self, scope: StateScope, key: str) -> RawEntry | None:
        return self.store.get(scope, key)

    def _put(self, put: Put) -> int:
        return self.store.put(put)

    def _delete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        return self.store.delete(scope, key)

    def _clear(self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None) -> int:
        return self.store.clear(scope, all_map_indices)

    def _list(self, scope: StateScope) -> list[RawEntry]:
        return self.store.list(scope)


class AsyncOnlyBackend(BaseStateBackend):
    """Implements only the async hooks; ``gate``, when set, holds every read until it fires."""

    def __init__(self) -> None:
        super().__init__()
        self.store = _Rows()
        self.gate: anyio.Event | None = None

    async def _aget(self, scope: StateScope, key: str) -> RawEntry | None:
        if self.gate is not None:
            await self.gate.wait()
        return self.store.get(scope, key)

    async def _aput(self, put: Put) -> int:
        await anyio.lowlevel.checkpoint()
        return self.store.put(put)

    async def _adelete(self, scope: StateScope, key: str, *, writer: Writer | None) -> bool:
        return self.store.delete(scope, key)

    async def _aclear(
        self, scope: StateScope, all_map_indices: bool, *, writer: Writer | None
    ) -> int:
        return self.store.clear(scope, all_map_indices)

    async def _alist(self, scope: StateScope) -> list[RawEntry]:
        return self.store.list(scope)


def exercise_sync(backend: BaseStateBackend) -> None:
    """Every sync method once, checking the results."""
    writer = Writer("task", str(TASK), 1)
    assert backend.set(TASK, "a", {"n": 1}, writer=writer) == 1
    assert backend.set(TASK, "a", {"n": 2}, expected_version=1) == 2
    assert backend.put_json(TASK, "b", '"raw"') == 1
    assert backend.get(TASK, "a") == {"n": 2}
    assert backend.get(TASK, "missing", "d") == "d"
    raw = backend.get_raw(TASK, "b")
    assert raw is not None and raw.value_json == '"raw"'
    entry = backend.get_entry(TASK, "a")
    assert entry is not None and entry.version == 2
    assert [e.key for e in backend.list(TASK)] == ["a", "b"]
    backend.delete(TASK, "a")
    assert backend.clear(TASK) == 1
    assert backend.list(TASK) == []


async def exercise_async(backend: BaseStateBackend) -> None:
    """Every async method once, checking the results."""
    assert await backend.aset(TASK, "a", [1]) == 1
    assert await backend.aset(TASK, "a", [2], expected_version=1) == 2
    assert await backend.aget(TASK, "a") == [2]
    entry = await backend.aget_entry(TASK, "a")
    assert entry is not None and entry.version == 2
    assert [e.key for e in await backend.alist(TASK)] == ["a"]
    await backend.adelete(TASK, "a")
    await backend.aset(TASK, "c", 1)
    assert await backend.aclear(TASK) == 1
    assert await backend.aget(TASK, "c") is None


SYNC_CALLS: list[tuple[str, Callable[[BaseStateBackend], object]]] = [
    ("get", lambda b: b.get(TASK, "k")),
    ("get", lambda b: b.get_entry(TASK, "k")),
    ("set", lambda b: b.set(TASK, "k", 2)),
    ("delete", lambda b: b.delete(TASK, "k")),
    ("clear", lambda b: b.clear(TASK)),
    ("list", lambda b: b.list(TASK)),
]


class TestSyncOnlyBackend:
    async def test_async_methods_work(self) -> None:
        """A backend with only sync hooks gets working async methods."""
        async with SyncOnlyBackend() as backend:
            await exercise_async(backend)

    async def test_sync_hooks_run_off_the_loop(self) -> None:
        """From async code the sync hooks run in a worker thread, never on the loop thread."""
        async with SyncOnlyBackend() as backend:
            await exercise_async(backend)
            assert backend.store.threads
            assert threading.get_ident() not in backend.store.threads

    async def test_sync_methods_call_hooks_directly(self) -> None:
        """Sync methods of a sync backend call its hooks in the caller's own thread."""
        async with SyncOnlyBackend() as backend:

            def work() -> int:
                exercise_sync(backend)
                return threading.get_ident()

            caller = await anyio.to_thread.run_sync(work)
            assert backend.store.threads == {caller}


class TestAsyncOnlyBackend:
    async def test_sync_methods_from_a_worker_thread(self) -> None:
        """Sync calls from a worker thread run the async hooks on the backend's loop."""
        async with AsyncOnlyBackend() as backend:
            await anyio.to_thread.run_sync(exercise_sync, backend)
            assert backend.store.threads == {threading.get_ident()}

    @pytest.mark.parametrize(("method", "call"), SYNC_CALLS, ids=[c[0] for c in SYNC_CALLS])
    async def test_sync_call_on_the_loop_is_refused(
        self, method: str, call: Callable[[BaseStateBackend], object]
    ) -> None:
        """A sync call on the loop thread without a portal raises SyncCallInLoopError, writing nothing."""
        async with AsyncOnlyBackend() as backend:
            await backend.aset(TASK, "k", 1)
            with pytest.raises(SyncCallInLoopError, match=f"await a{method}") as info:
                call(backend)
            assert isinstance(info.value, RuntimeError)
            assert await backend.aget(TASK, "k") == 1

    async def test_sync_calls_work_through_a_greenback_portal(self) -> None:
        """Inside a coroutine holding a greenback portal, sync calls run on the loop thread."""
        async with AsyncOnlyBackend() as backend:
            await greenback.ensure_portal()
            exercise_sync(backend)
            assert backend.store.threads == {threading.get_ident()}

    async def test_portal_call_does_not_block_the_loop(self) -> None:
        """A sync call waiting in a portal lets other tasks run until its hook completes."""
        async with AsyncOnlyBackend() as backend:
            await backend.aset(TASK, "k", "value")
            backend.gate = anyio.Event()
            results: list[object] = []

            async def reader() -> None:
                await greenback.ensure_portal()
                results.append(backend.get(TASK, "k"))

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(reader)
                    await anyio.wait_all_tasks_blocked()
                    assert results == []
                    backend.gate.set()
            assert results == ["value"]

    async def test_closed_backend_refuses_calls(self) -> None:
        """Before opening and after closing, sync and async calls raise StoreClosedError."""
        backend = AsyncOnlyBackend()
        with pytest.raises(StoreClosedError, match="closed"):
            await backend.aget(TASK, "k")
        with pytest.raises(StoreClosedError):
            await anyio.to_thread.run_sync(backend.get, TASK, "k")
        async with backend:
            await backend.aset(TASK, "k", 1)
        with pytest.raises(StoreClosedError):
            await backend.aset(TASK, "k", 2)
        with pytest.raises(StoreClosedError):
            await anyio.to_thread.run_sync(backend.get, TASK, "k")

    def test_with_statement_gives_a_sync_backend(self) -> None:
        """``with backend:`` runs it on a private loop thread, so plain sync code can use it."""
        backend = AsyncOnlyBackend()
        with backend:
            assert "open=True" in repr(backend)
            exercise_sync(backend)
            backend.set(TASK, "k", [1, 2])
            assert backend.run_sync(backend.aget, TASK, "k") == [1, 2]
            assert threading.get_ident() not in backend.store.threads
        assert "open=False" in repr(backend)
        with pytest.raises(StoreClosedError):
            backend.get(TASK, "k")


class TestMissingHooks:
    async def test_backend_without_hooks_says_what_is_missing(self) -> None:
        """A backend implementing neither side raises NotImplementedError naming both hooks."""
        async with BaseStateBackend() as backend:
            with pytest.raises(NotImplementedError, match="neither _aget nor _get"):
                await backend.aget(TASK, "k")

    async def test_metastore_capabilities_are_optional(self) -> None:
        """A custom backend without a metastore has none of its capabilities, and asking it
        for an event log names the backend and the capability."""
        async with AsyncOnlyBackend() as backend:
            assert backend.services == Services()
            with pytest.raises(MissingCapabilityError, match="AsyncOnlyBackend has no events"):
                _ = backend.events


def _sqlite(path: Path) -> BaseStateBackend:
    return SqliteStateBackend(path)


class TestSqliteBridge:
    def test_with_statement_sync_mode(self, tmp_path: Path) -> None:
        """``with SqliteStateBackend(path)`` works from plain sync code and persists to the file."""
        path = tmp_path / "sync.db"
        with _sqlite(path) as backend:
            exercise_sync(backend)
            backend.run_sync(backend.events.aregister_assets, [ORDERS])
            backend.set(ORDERS.scope, "watermark", "2024-06-01")
            backend.set(TASK, "job_id", "spark-1")
        with _sqlite(path) as reopened:
            assert reopened.get(ORDERS.scope, "watermark") == "2024-06-01"
            assert reopened.get(TASK, "job_id") == "spark-1"

    async def test_sync_calls_from_a_worker_thread(self, tmp_path: Path) -> None:
        """With the backend open on the loop, sync calls from a thread reach it."""
        async with _sqlite(tmp_path / "state.db") as backend:
            await anyio.to_thread.run_sync(exercise_sync, backend)
            await anyio.to_thread.run_sync(lambda: backend.set(TASK, "k", 1))
            assert await backend.aget(TASK, "k") == 1

    async def test_sync_calls_through_a_portal(self, tmp_path: Path) -> None:
        """Inside a coroutine with a greenback portal, sync calls to SQLite work."""
        async with _sqlite(tmp_path / "state.db") as backend:
            await greenback.ensure_portal()
            exercise_sync(backend)
            backend.set(TASK, "k", 1)
            assert await backend.aget(TASK, "k") == 1

    async def test_sync_call_on_the_loop_is_refused(self, tmp_path: Path) -> None:
        """Without a portal a sync SQLite call on the loop thread raises SyncCallInLoopError."""
        async with _sqlite(tmp_path / "state.db") as backend:
            with pytest.raises(SyncCallInLoopError, match="await aset"):
                backend.set(TASK, "k", 1)
            assert await backend.aget(TASK, "k") is None

    async def test_asset_state_via_portal(self, tmp_path: Path) -> None:
        """Asset state set through a portal is read back asynchronously."""
        async with _sqlite(tmp_path / "state.db") as backend:
            await backend.events.aregister_assets([ORDERS])
            await greenback.ensure_portal()
            backend.set(AssetScope(name="orders"), "w", 3)
            assert await backend.aget(AssetScope(name="orders"), "w") == 3
