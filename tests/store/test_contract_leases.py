"""The lease contract of the built-in backends: claim, renew, expire, steal, release, fencing.

Runs against memory, SQLite and PostgreSQL through the ``backend`` fixture. Time is the
backend's own ``clock``, set by each test, so expiry never depends on the wall clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import anyio
import pytest
from watchkeeper.store import (
    Asset,
    AssetScope,
    AssetStateStoreAccessors,
    LeaseLostError,
    PostgresStateBackend,
    StateStoreError,
    TaskScope,
    TaskStateStoreAccessor,
)
from watchkeeper.store.protocols import (
    BaseStateBackend,
    EventCommit,
    Fence,
    Lease,
    Writer,
    encode_json,
    encode_value,
)

from tests.support.clock import T0, Clock

TTL = timedelta(seconds=30)
ORDERS = AssetScope(name="orders")
TASK = TaskScope("dag", "run", "task")


@pytest.fixture
async def store(backend: BaseStateBackend) -> AsyncIterator[BaseStateBackend]:
    """The backend on a settable clock, with the asset ``orders`` registered."""
    backend.clock = Clock()
    await backend.events.aregister_assets([Asset("orders")])
    yield backend


def clock_of(store: BaseStateBackend) -> Clock:
    clock = store.clock
    assert isinstance(clock, Clock)
    return clock


def commit(fence: Fence | None, payload: object, watermark: int) -> EventCommit:
    return EventCommit(
        watcher="w",
        assets=("orders",),
        payload_json=encode_json(payload, what="payload"),
        state={"watermark": encode_value("watermark", watermark)},
        writer=Writer("watcher", "w"),
        fence=fence,
    )


async def snapshot(store: BaseStateBackend) -> tuple[object, ...]:
    return (await store.alist(ORDERS), await store.events.alist_events())


class TestClaim:
    async def test_first_claim_gets_token_one(self, store: BaseStateBackend) -> None:
        """Claiming free leases takes each with token 1, expiring ttl after the clock's now."""
        held = await store.leases.aclaim_leases("a", ["t2", "t1"], TTL)
        assert held == {"t1": 1, "t2": 1}
        assert await store.leases.alist_leases() == [
            Lease("t1", "a", 1, T0 + TTL),
            Lease("t2", "a", 1, T0 + TTL),
        ]

    async def test_renewal_keeps_the_token_and_extends(self, store: BaseStateBackend) -> None:
        """The holder claiming again keeps its token and pushes the expiry forward."""
        await store.leases.aclaim_leases("a", ["t"], TTL)
        clock_of(store).advance(10)
        assert await store.leases.aclaim_leases("a", ["t"], 60) == {"t": 1}
        assert await store.leases.alist_leases() == [Lease("t", "a", 1, T0 + timedelta(seconds=70))]

    async def test_a_live_lease_is_not_taken(self, store: BaseStateBackend) -> None:
        """Another owner gets nothing for a lease that has not expired, and changes nothing."""
        await store.leases.aclaim_leases("a", ["t"], TTL)
        clock_of(store).advance(29)
        assert await store.leases.aclaim_leases("b", ["t", "u"], TTL) == {"u": 1}
        leases = {lease.trigger_id: lease for lease in await store.leases.alist_leases()}
        assert leases["t"] == Lease("t", "a", 1, T0 + TTL)

    async def test_an_expired_lease_moves_with_the_next_token(
        self, store: BaseStateBackend
    ) -> None:
        """Once expired, another owner takes the lease with the previous token + 1."""
        await store.leases.aclaim_leases("a", ["t"], TTL)
        clock_of(store).advance(30)
        assert await store.leases.aclaim_leases("b", ["t"], TTL) == {"t": 2}
        assert await store.leases.aclaim_leases("a", ["t"], TTL) == {}
        clock_of(store).advance(31)
        assert await store.leases.aclaim_leases("a", ["t"], TTL) == {"t": 3}

    async def test_the_holder_renews_its_own_expired_lease(self, store: BaseStateBackend) -> None:
        """A lease that expired but that nobody took is renewed by its holder with its token."""
        await store.leases.aclaim_leases("a", ["t"], TTL)
        clock_of(store).advance(100)
        assert await store.leases.aclaim_leases("a", ["t"], TTL) == {"t": 1}

    async def test_release_frees_at_once(self, store: BaseStateBackend) -> None:
        """A released lease has no owner, and the next claim takes it at once with token + 1."""
        await store.leases.aclaim_leases("a", ["t", "u"], TTL)
        await store.leases.arelease_leases("a", ["t"])
        leases = await store.leases.alist_leases()
        assert [(x.trigger_id, x.owner, x.token) for x in leases] == [
            ("t", None, 1),
            ("u", "a", 1),
        ]
        assert await store.leases.aclaim_leases("b", ["t", "u"], TTL) == {"t": 2}

    async def test_release_by_another_owner_does_nothing(self, store: BaseStateBackend) -> None:
        """Releasing a lease someone else holds (or nobody claimed) changes nothing."""
        await store.leases.aclaim_leases("a", ["t"], TTL)
        await store.leases.arelease_leases("b", ["t", "never"])
        assert await store.leases.alist_leases() == [Lease("t", "a", 1, T0 + TTL)]

    async def test_duplicates_and_empty_lists(self, store: BaseStateBackend) -> None:
        """An id named twice is claimed once; empty lists claim and release nothing."""
        assert await store.leases.aclaim_leases("a", ["t", "t"], 5) == {"t": 1}
        assert await store.leases.aclaim_leases("a", [], 5) == {}
        await store.leases.arelease_leases("a", [])
        assert len(await store.leases.alist_leases()) == 1

    @pytest.mark.parametrize(
        ("owner", "ids", "ttl", "error", "match"),
        [
            ("", ["t"], TTL, ValueError, "owner"),
            ("a", "t", TTL, TypeError, "trigger_ids"),
            ("a", ["t", ""], TTL, ValueError, "trigger id"),
            ("a", ["t"], 0, ValueError, "invalid ttl 0: must be positive"),
            ("a", ["t"], "30", TypeError, "ttl"),
        ],
        ids=["empty-owner", "str-ids", "empty-id", "zero-ttl", "str-ttl"],
    )
    async def test_bad_input_is_refused_and_changes_nothing(
        self,
        store: BaseStateBackend,
        owner: str,
        ids: list[str],
        ttl: timedelta,
        error: type[Exception],
        match: str,
    ) -> None:
        """A bad owner, id list or ttl raises a clear error and claims nothing."""
        with pytest.raises(error, match=match):
            await store.leases.aclaim_leases(owner, ids, ttl)
        assert await store.leases.alist_leases() == []


class TestFencing:
    async def test_a_live_fence_commits(self, store: BaseStateBackend) -> None:
        """A commit fenced with the holder's current token writes its event and state."""
        (token,) = (await store.leases.aclaim_leases("a", ["w"], TTL)).values()
        events = await store.events.acommit(commit(Fence("w", "a", token), {"n": 1}, 1))
        assert [e.payload for e in events] == [{"n": 1}]
        assert await store.aget(ORDERS, "watermark") == 1

    async def test_a_stale_token_writes_nothing(self, store: BaseStateBackend) -> None:
        """After another daemon took the lease, the old holder's commit raises and writes nothing."""
        await store.leases.aclaim_leases("a", ["w"], TTL)
        await store.events.acommit(commit(Fence("w", "a", 1), {"n": 1}, 5))
        clock_of(store).advance(31)
        assert await store.leases.aclaim_leases("b", ["w"], TTL) == {"w": 2}
        before = await snapshot(store)
        with pytest.raises(LeaseLostError) as caught:
            await store.events.acommit(commit(Fence("w", "a", 1), {"n": 0}, 3))
        assert await snapshot(store) == before
        assert await store.aget(ORDERS, "watermark") == 5
        error = caught.value
        assert isinstance(error, StateStoreError)
        assert (error.trigger_id, error.owner, error.token) == ("w", "a", 1)
        assert "'w'" in str(error) and "'a'" in str(error) and "token 1" in str(error)
        assert "'b' holds it with token 2" in str(error)

    @pytest.mark.parametrize("how", ["expired", "released", "never-claimed"])
    async def test_a_lease_not_live_refuses_the_commit(
        self, store: BaseStateBackend, how: str
    ) -> None:
        """An expired, released or never-claimed lease refuses the commit; nothing is written."""
        if how != "never-claimed":
            await store.leases.aclaim_leases("a", ["w"], TTL)
        if how == "expired":
            clock_of(store).advance(30)
        elif how == "released":
            await store.leases.arelease_leases("a", ["w"])
        before = await snapshot(store)
        with pytest.raises(LeaseLostError, match="nothing was written"):
            await store.events.acommit(commit(Fence("w", "a", 1), {"n": 1}, 1))
        assert await snapshot(store) == before

    async def test_the_writer_fence_guards_set(self, store: BaseStateBackend) -> None:
        """A set by a writer carrying a stale fence raises and keeps the stored value."""
        await store.leases.aclaim_leases("a", ["w"], TTL)
        fenced = Writer("watcher", "w", fence=Fence("w", "a", 1))
        await store.aset(ORDERS, "watermark", 7, writer=fenced)
        await store.leases.arelease_leases("a", ["w"])
        await store.leases.aclaim_leases("b", ["w"], TTL)
        with pytest.raises(LeaseLostError):
            await store.aset(ORDERS, "watermark", 2, writer=fenced)
        with pytest.raises(LeaseLostError):
            await store.aset(ORDERS, "watermark", 2, writer=fenced, expected_version=1)
        entry = await store.aget_entry(ORDERS, "watermark")
        assert entry is not None and (entry.value, entry.version) == (7, 1)
        assert entry.writer == Writer("watcher", "w")

    async def test_a_commit_takes_its_writers_fence(self, store: BaseStateBackend) -> None:
        """An EventCommit without a fence of its own is fenced by its writer's."""
        fence = Fence("w", "a", 1)
        built = EventCommit("w", ("orders",), "1", writer=Writer("watcher", "w", fence=fence))
        assert built.fence == fence
        with pytest.raises(LeaseLostError):
            await store.events.acommit(built)
        assert await store.events.alist_events() == []

    async def test_only_the_stale_commit_of_a_group_fails(self, store: BaseStateBackend) -> None:
        """Concurrent commits sharing a transaction: the stale one fails, the others commit."""
        await store.leases.aclaim_leases("a", ["w"], TTL)
        await store.leases.aclaim_leases("b", ["x"], TTL)
        outcomes: dict[int, object] = {}

        async def send(n: int, fence: Fence) -> None:
            try:
                outcomes[n] = len(await store.events.acommit(commit(fence, {"n": n}, n)))
            except LeaseLostError as exc:
                outcomes[n] = exc.trigger_id

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(send, 1, Fence("w", "a", 1))
                tg.start_soon(send, 2, Fence("x", "a", 1))  # "b" holds x
                tg.start_soon(send, 3, Fence("x", "b", 1))
        assert outcomes == {1: 1, 2: "x", 3: 1}
        assert sorted(e.payload["n"] for e in await store.events.alist_events()) == [1, 3]

    @pytest.mark.parametrize(
        ("args", "error"),
        [(("", "a", 1), ValueError), (("w", "a", 0), ValueError), (("w", "a", True), TypeError)],
        ids=["empty-trigger", "zero-token", "bool-token"],
    )
    def test_a_bad_fence_is_refused(self, args: tuple[object, ...], error: type[Exception]) -> None:
        """A fence needs a trigger id, an owner and a token >= 1."""
        with pytest.raises(error, match="Fence"):
            Fence(*args)  # type: ignore[arg-type]


def fenced(owner: str, token: int) -> Writer:
    """The writer the runtime gives a watcher whose lease of trigger ``w`` is (owner, token)."""
    return Writer("watcher", "w", fence=Fence("w", owner, token))


Write = Callable[[BaseStateBackend, Writer], Awaitable[object]]

# Every write path a fenced writer can take, each against the rows `seed_fenced` wrote.
WRITES: dict[str, Write] = {
    "set": lambda s, w: s.aset(ORDERS, "watermark", 2, writer=w),
    "compare-and-set": lambda s, w: s.aset(ORDERS, "watermark", 2, writer=w, expected_version=1),
    "create": lambda s, w: s.aset(ORDERS, "fresh", 2, writer=w, expected_version=0),
    "delete": lambda s, w: s.adelete(ORDERS, "watermark", writer=w),
    "clear": lambda s, w: s.aclear(ORDERS, writer=w),
    "task set": lambda s, w: s.aset(TASK, "k", 2, writer=w),
    "task delete": lambda s, w: s.adelete(TASK, "k", writer=w),
    "task clear": lambda s, w: s.aclear(TASK, all_map_indices=True, writer=w),
    "event commit": lambda s, w: s.events.acommit(
        EventCommit("w", ("orders",), "1", state={"watermark": "2"}, writer=w)
    ),
}


async def seed_fenced(store: BaseStateBackend) -> None:
    """Owner "a" claims trigger w (token 1) and writes asset and task state with that fence."""
    assert await store.leases.aclaim_leases("a", ["w"], TTL) == {"w": 1}
    for scope, key in ((ORDERS, "watermark"), (ORDERS, "other"), (TASK, "k")):
        await store.aset(scope, key, 1, writer=fenced("a", 1))


async def everything(store: BaseStateBackend) -> tuple[object, ...]:
    return (await store.alist(ORDERS), await store.alist(TASK), await store.events.alist_events())


class TestFencedWrites:
    """Every write a fenced writer makes checks the lease in its own transaction."""

    @pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
    async def test_same_owner_with_a_stale_token_is_refused(
        self, store: BaseStateBackend, write: str
    ) -> None:
        """The owner released and re-claimed the lease (token 2): a write still fenced with its
        old token 1 raises LeaseLostError and changes nothing, on every write path."""
        await seed_fenced(store)
        await store.leases.arelease_leases("a", ["w"])
        assert await store.leases.aclaim_leases("a", ["w"], TTL) == {"w": 2}
        before = await everything(store)
        with pytest.raises(LeaseLostError) as caught:
            await WRITES[write](store, fenced("a", 1))
        assert "'a' holds it with token 2" in str(caught.value)
        assert await everything(store) == before

    @pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
    async def test_a_token_never_issued_is_refused(
        self, store: BaseStateBackend, write: str
    ) -> None:
        """A fence naming the holder with a token above the lease's is refused as well: the
        token must match exactly, not merely belong to the owner."""
        await seed_fenced(store)
        before = await everything(store)
        with pytest.raises(LeaseLostError, match="'a' holds it with token 1"):
            await WRITES[write](store, fenced("a", 2))
        assert await everything(store) == before

    @pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
    async def test_the_live_fence_writes(self, store: BaseStateBackend, write: str) -> None:
        """The same write with the holder's current token goes through."""
        await seed_fenced(store)
        before = await everything(store)
        await WRITES[write](store, fenced("a", 1))
        assert await everything(store) != before

    async def test_a_stale_accessor_cannot_delete_or_clear(self, store: BaseStateBackend) -> None:
        """A lease claimed by daemon-1, released, claimed by daemon-2; daemon-1's
        accessors are refused on delete and clear, async and sync, asset and task state."""
        await store.leases.aclaim_leases("daemon-1", ["trig"], TTL)
        old = Writer("watcher", "w", fence=Fence("trig", "daemon-1", 1))
        assets = AssetStateStoreAccessors(store, [Asset("orders")], writer=old)
        task = TaskStateStoreAccessor(store, TASK, writer=old)
        await assets.aset("wm", 1)
        await task.aset("k", 1)
        await store.leases.arelease_leases("daemon-1", ["trig"])
        assert await store.leases.aclaim_leases("daemon-2", ["trig"], TTL) == {"trig": 2}
        before = await everything(store)
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: assets.aset("wm", 2),
            lambda: assets.adelete("wm"),
            lambda: assets.aclear(),
            lambda: anyio.to_thread.run_sync(assets.delete, "wm"),
            lambda: anyio.to_thread.run_sync(assets.clear),
            lambda: task.adelete("k"),
            lambda: task.aclear(),
            lambda: anyio.to_thread.run_sync(task.delete, "k"),
            lambda: anyio.to_thread.run_sync(task.clear, True),
        ]
        for call in calls:
            with pytest.raises(LeaseLostError, match="'daemon-2' holds it with token 2"):
                await call()
        assert await everything(store) == before


class TestNodeLeases:
    """The node lease a daemon renews every second, and the trigger leases that live by it."""

    async def test_renewal_is_one_row_and_keeps_every_token(self, store: BaseStateBackend) -> None:
        """Renewing a node lease extends it and leaves its trigger leases (and tokens) alone."""
        first = await store.leases.arenew_node("a", TTL)
        assert not first.renewed  # created
        assert await store.leases.aclaim_leases("a", ["t", "u"], TTL) == {"t": 1, "u": 1}
        clock_of(store).advance(20)
        beat = await store.leases.arenew_node("a", TTL)
        assert beat.renewed and beat.reaped == ()
        assert [(n.owner, n.alive, n.expires_at, n.held) for n in beat.nodes] == [
            ("a", True, T0 + timedelta(seconds=50), 2)
        ]
        assert [n.owner for n in beat.live()] == ["a"]
        assert {(x.owner, x.token, x.expires_at) for x in await store.leases.alist_leases()} == {
            ("a", 1, T0 + timedelta(seconds=50))
        }

    async def test_an_expired_node_is_reaped_and_learns_it(self, store: BaseStateBackend) -> None:
        """Another node's renewal reaps an expired node; its next renewal says it was not
        renewed, and the trigger leases it held are free (taken with token + 1)."""
        await store.leases.aclaim_leases("a", ["t"], TTL)
        await store.leases.arenew_node("b", TTL)
        clock_of(store).advance(30)
        beat = await store.leases.arenew_node("b", TTL)
        assert beat.reaped == ("a",)
        assert [(n.owner, n.alive) for n in beat.nodes] == [("a", False), ("b", True)]
        assert await store.leases.alist_leases() == [Lease("t", "a", 1, None)]
        again = await store.leases.arenew_node("a", TTL)
        assert not again.renewed
        assert [(x.owner, x.token) for x in await store.leases.alist_leases()] == [(None, 1)]
        assert await store.leases.aclaim_leases("b", ["t"], TTL) == {"t": 2}

    async def test_a_reaped_nodes_fence_is_refused(self, store: BaseStateBackend) -> None:
        """Once its node lease is reaped, a holder's writes are refused before anyone else
        took the trigger, and nothing is written."""
        await store.leases.aclaim_leases("a", ["w"], TTL)
        clock_of(store).advance(31)
        await store.leases.arenew_node("b", TTL)  # reaps a
        before = await snapshot(store)
        with pytest.raises(LeaseLostError, match="node lease of its daemon lapsed"):
            await store.events.acommit(commit(Fence("w", "a", 1), {"n": 1}, 1))
        assert await snapshot(store) == before

    async def test_break_node_reaps_at_once(self, store: BaseStateBackend) -> None:
        """A node known dead is reaped before its expiry: its leases are free at once."""
        await store.leases.aclaim_leases("a", ["t"], TTL)
        assert await store.leases.abreak_node("a")
        assert not await store.leases.abreak_node("a")
        assert await store.leases.aclaim_leases("b", ["t"], TTL) == {"t": 2}

    async def test_a_limit_takes_that_many_and_daemons_spread(
        self, store: BaseStateBackend
    ) -> None:
        """A claim with a limit takes that many free leases, keeps those it holds, and two
        daemons claiming the same ids start from different ones."""
        ids = [f"t{i:02}" for i in range(40)]
        a = await store.leases.aclaim_leases("a", ids, TTL, limit=10)
        assert len(a) == 10 and set(a.values()) == {1}
        b = await store.leases.aclaim_leases("b", ids, TTL, limit=10)
        assert len(b) == 10 and set(a).isdisjoint(b)
        assert await store.leases.aclaim_leases("a", ids, TTL, limit=0) == a
        more = await store.leases.aclaim_leases("a", ids, TTL, limit=5)
        assert len(more) == 15 and set(a) < set(more)
        with pytest.raises(ValueError, match="limit"):
            await store.leases.aclaim_leases("a", ids, TTL, limit=-1)

    async def test_leaving_frees_everything_and_wakes_waiters(
        self, store: BaseStateBackend
    ) -> None:
        """A daemon leaving releases every lease it holds and ends its node lease; a daemon
        waiting for released leases is woken."""
        await store.leases.aclaim_leases("a", ["t", "u"], TTL)
        with anyio.move_on_after(1):  # PostgreSQL: returns once listening (nothing missed)
            await store.leases.await_lease_release()
        woken = anyio.Event()

        async def wait() -> None:
            await store.leases.await_lease_release()
            woken.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert not woken.is_set()
            await store.leases.arelease_leases("a", [], leave=True)
            with anyio.fail_after(10):
                await woken.wait()
        assert [(x.owner, x.token) for x in await store.leases.alist_leases()] == [
            (None, 1),
            (None, 1),
        ]
        beat = await store.leases.arenew_node("b", TTL)
        assert [n.owner for n in beat.nodes] == ["b"]
        assert await store.leases.aclaim_leases("b", ["t", "u"], TTL) == {"t": 2, "u": 2}


class TestPostgresLeaseLocking:
    async def test_a_claim_skips_a_lease_a_fenced_transaction_holds(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """A claim never takes a lease while a transaction holds its row as the writer's
        fence check does (FOR SHARE): it skips it (SKIP LOCKED) and takes it once that
        transaction committed, so the new holder sees what the old one wrote."""
        import asyncpg

        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as store:
            clock = Clock()
            store.clock = clock
            await store.leases.aclaim_leases("a", ["w"], TTL)
            clock.advance(60)
            conn = await asyncpg.connect(pg_dsn)
            try:
                tx = conn.transaction()
                await tx.start()
                await conn.fetch(
                    f'SELECT 1 FROM "{pg_schema}".trigger_leases WHERE trigger_id = $1 FOR SHARE',
                    "w",
                )
                with anyio.fail_after(10):
                    assert await store.leases.aclaim_leases("b", ["w"], TTL) == {}
                (lease,) = await store.leases.alist_leases()
                assert (lease.owner, lease.token) == ("a", 1)
                await tx.commit()
            finally:
                await conn.close()
            assert await store.leases.aclaim_leases("b", ["w"], TTL) == {"w": 2}

    async def test_daemons_claiming_the_same_new_leases_at_once_never_fail(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """Three daemons starting together claim the same 3,000 never-claimed leases at once
        (each picks them in its own spread order): no claim fails with a deadlock, and every
        lease ends with exactly one of them."""
        import asyncpg

        ids = [f"t{i}" for i in range(3000)]
        owners = ("a", "b", "c")
        async with (
            PostgresStateBackend(pg_dsn, schema=pg_schema) as a,
            PostgresStateBackend(pg_dsn, schema=pg_schema) as b,
            PostgresStateBackend(pg_dsn, schema=pg_schema) as c,
        ):
            got: dict[str, dict[str, int]] = {}

            async def claim(store: PostgresStateBackend, owner: str) -> None:
                got[owner] = await store.leases.aclaim_leases(owner, ids, TTL)

            for _ in range(3):  # a few rounds: a deadlock needs the inserts to interleave
                async with anyio.create_task_group() as tg:
                    for store, owner in zip((a, b, c), owners, strict=True):
                        tg.start_soon(claim, store, owner)
                leases = await a.leases.alist_leases()
                assert sorted(x.trigger_id for x in leases) == sorted(ids)
                held = sorted(t for owner in owners for t in got[owner])
                assert held == sorted(ids)  # each lease with one daemon, none twice
                await a.leases.arelease_leases("a", [], leave=True)
                await b.leases.arelease_leases("b", [], leave=True)
                await c.leases.arelease_leases("c", [], leave=True)
                conn = await asyncpg.connect(pg_dsn)
                try:
                    await conn.execute(f'DELETE FROM "{pg_schema}".trigger_leases')
                finally:
                    await conn.close()

    async def test_the_database_clock_decides_expiry(self, pg_dsn: str, pg_schema: str) -> None:
        """Without a clock of its own the backend uses now() of the server: a node lease
        renewed for 30 s is live at the server's time, whatever the process's clock says."""
        async with PostgresStateBackend(pg_dsn, schema=pg_schema) as store:
            beat = await store.leases.arenew_node("a", 30)
            (node,) = beat.nodes
            assert timedelta(seconds=29) < node.expires_at - beat.now <= timedelta(seconds=30)
            token = (await store.leases.aclaim_leases("a", ["w"], 30))["w"]
            await store.events.aregister_assets([Asset("orders")])
            events = await store.events.acommit(commit(Fence("w", "a", token), {"n": 1}, 1))
            assert len(events) == 1

    async def test_sessions_carry_a_name_and_an_idle_timeout(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """Every connection, the lease ones included, sets the session settings it is given."""
        settings = {"application_name": "wk-test", "idle_in_transaction_session_timeout": "2500"}
        backend = PostgresStateBackend(pg_dsn, schema=pg_schema, server_settings=settings)
        async with backend as store:
            rows = await store._fetch(
                "reading settings",
                "SELECT current_setting('application_name'), "
                "current_setting('idle_in_transaction_session_timeout')",
            )
            assert tuple(rows[0]) == ("wk-test", "2500ms")
