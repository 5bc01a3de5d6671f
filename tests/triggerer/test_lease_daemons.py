"""Two real ``watchkeeper triggerer`` processes on one PostgreSQL database share the watchers.

Both load the same three watchers (one per asset, each following a text file). Each watcher
runs on the daemon that holds its lease, never on both: the first daemon takes every lease and
hands one to the second when it joins (its share); when the first is paused (SIGSTOP) past its
node lease's time to live the second takes every watcher over, and the first, resumed, has its
stale writes refused, stops them and gets its share back; when the second is SIGKILLed the
first takes them all after the time to live. The committed events of every asset are the
whole stream, with no gap and no duplicate.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from watchkeeper.store import AssetScope, PostgresStateBackend

from tests.support.daemons import (
    LINES_WATCHER,
    append_lines,
    asset_file,
    spawn_daemon,
    wait_until,
)
from tests.support.postgres import PgDatabase

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ASSETS = ("alpha", "beta", "gamma")
HEARTBEAT = 0.25
LEASE_TTL = 1.0
WAIT = 20.0  # bound of every wait (a loaded machine starts Python slowly)


class Node:
    """One daemon process, its log file and its owner identity (from ``daemon_started``)."""

    def __init__(self, name: str, process: anyio.abc.Process, log_path: Path) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path
        self.owner = ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a traceback line, or one still being written
                continue
            if isinstance(entry, dict) and (name is None or entry.get("event") == name):
                found.append(entry)
        return found

    def exit_note(self) -> str | None:
        """Why waiting for this daemon failed (it exited, with its log's tail), or None."""
        if self.process.returncode is None:
            return None
        tail = self.log_path.read_text(errors="replace")[-3000:]
        return f"daemon {self.name} exited:\n{tail}\n"


def daemon_env(dsn: str, **settings: str) -> dict[str, str]:
    """The daemons' environment: this database, fast renewals, JSON logs, and ``settings``
    (``[triggerer]`` keys)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        WATCHKEEPER__DATABASE__URL=dsn,
        WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL=str(HEARTBEAT),
        WATCHKEEPER__TRIGGERER__LEASE_TTL=str(LEASE_TTL),
        WATCHKEEPER__TRIGGERER__LEASE_RENEW_INTERVAL=str(HEARTBEAT),
        WATCHKEEPER__TRIGGERER__LEASE_MARGIN="0.25",
        WATCHKEEPER__TRIGGERER__GC_INTERVAL="0",
        WATCHKEEPER__TRIGGERER__STOP_GRACE="2",
        WATCHKEEPER__LOGGING__FORMAT="json",
    )
    env.update({f"WATCHKEEPER__TRIGGERER__{k.upper()}": v for k, v in settings.items()})
    return env


async def start_node(
    name: str, watchers: Path, env: dict[str, str], tmp_path: Path, nodes: list[Node]
) -> Node:
    """Start one daemon; return once it logged ``daemon_started`` (its owner is then known)."""
    log_path = tmp_path / f"{name}.log"
    with log_path.open("ab") as log:
        process = await spawn_daemon(tmp_path, watchers, env, log)
    node = Node(name, process, log_path)
    nodes.append(node)
    await wait_until(lambda: node.events("daemon_started"), f"{name} to start", node)
    node.owner = node.events("daemon_started")[0]["owner"]
    return node


async def stop_all(nodes: list[Node]) -> None:
    for node in nodes:
        if node.process.returncode is None:
            node.process.send_signal(signal.SIGCONT)
            node.process.kill()
        with anyio.move_on_after(10, shield=True):
            await node.process.wait()
        await node.process.aclose()


def setup_watchers(tmp_path: Path, assets: Sequence[str]) -> tuple[Path, dict[str, Path]]:
    """A watchers path with one lines watcher per asset, each source holding lines 1..3."""
    watchers = tmp_path / "watchers"
    watchers.mkdir()
    (watchers / "lines.py").write_text(LINES_WATCHER)
    sources = {name: tmp_path / f"{name}.txt" for name in assets}
    for name, source in sources.items():
        (watchers / f"{name}.py").write_text(asset_file(name, source))
        append_lines(source, 1, 3)
    return watchers, sources


class TestTwoDaemons:
    async def test_each_watcher_runs_on_one_daemon_and_moves_without_gap_or_duplicate(
        self, tmp_path: Path, pg_database: PgDatabase
    ) -> None:
        """Leases keep each watcher on one daemon; pause and SIGKILL move them; the events
        of every asset are exactly 1..9 and a resumed zombie writes nothing."""
        watchers, sources = setup_watchers(tmp_path, ASSETS)
        database = pg_database.dsn
        env = daemon_env(database)
        nodes: list[Node] = []

        async def start(name: str) -> Node:
            return await start_node(name, watchers, env, tmp_path, nodes)

        try:
            async with PostgresStateBackend(database) as db:

                async def holders() -> dict[str | None, list[int]]:
                    """Lease tokens by owner."""
                    found: dict[str | None, list[int]] = {}
                    for lease in await db.leases.alist_leases():
                        found.setdefault(lease.owner, []).append(lease.token)
                    return found

                async def committed(count: int) -> bool:
                    events = await db.events.alist_events()
                    return all(len([e for e in events if e.asset == a]) >= count for a in ASSETS)

                async def split(want: dict[str, list[int]]) -> bool:
                    return await holders() == want

                # 1. The first daemon takes every lease; the second one joins and gets its
                #    share (one of three) from the first, with the next token.
                a = await start("a")
                await wait_until(lambda: committed(3), "a's first events", a)
                assert await holders() == {a.owner: [1, 1, 1]}
                b = await start("b")
                await wait_until(lambda: split({a.owner: [1, 1], b.owner: [2]}), "a share", a, b)
                (first_b,) = [
                    x.trigger_id for x in await db.leases.alist_leases() if x.owner == b.owner
                ]

                # 2. a is paused past the lease's ttl: b takes every watcher over.
                a.process.send_signal(signal.SIGSTOP)
                for source in sources.values():
                    append_lines(source, 4, 6)
                await wait_until(lambda: split({b.owner: [2, 2, 2]}), "b to take all", b)
                await wait_until(lambda: committed(6), "b's events", b)
                assert len(b.events("trigger_started")) == 3

                # 3. a resumes as a zombie: it writes nothing, stops the watchers it ran, and
                #    rejoins, getting its share back from b with the next token.
                a.process.send_signal(signal.SIGCONT)
                a_ran = {e["trigger_id"] for e in a.events("lease_acquired")} - {first_b}

                def a_let_go() -> bool:
                    moved = {e["trigger_id"] for e in a.events("lease_moved")}
                    lost = {e["trigger_id"] for e in a.events("lease_lost")}
                    return a_ran <= moved | lost and bool(a.events("leases_changed"))

                await wait_until(a_let_go, "a to stop its watchers", a, b)
                await wait_until(lambda: split({a.owner: [3], b.owner: [2, 2]}), "shares", a, b)

                # 4. b is SIGKILLed: a takes the watchers back once b's node lease expires.
                b.process.kill()
                with anyio.fail_after(WAIT):
                    assert await b.process.wait() == -signal.SIGKILL
                for source in sources.values():
                    append_lines(source, 7, 9)

                async def a_holds() -> bool:
                    return await holders() == {a.owner: [3, 3, 3]}

                await wait_until(a_holds, "a to take the leases back", a)
                await wait_until(lambda: committed(9), "the last events", a)

                # 5. A clean exit releases every lease.
                a.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(WAIT):
                    assert await a.process.wait() == 0
                assert await holders() == {None: [3, 3, 3]}

                for name in ASSETS:
                    events = await db.events.alist_events(asset=name)
                    assert [e.payload["n"] for e in events] == list(range(1, 10)), name
                    assert await db.aget(AssetScope(name=name), "watermark") == 9
        finally:
            await stop_all(nodes)

    async def test_a_clean_exit_hands_over_at_once_and_a_join_gets_its_share(
        self, tmp_path: Path, pg_database: PgDatabase
    ) -> None:
        """With renewals far apart (30 s), a daemon joining gets its share and a daemon
        exiting hands its watchers over well before any renewal: both go by NOTIFY. The
        events stay exactly 1..6 on every asset."""
        assets = ("alpha", "beta", "gamma", "delta")
        watchers, sources = setup_watchers(tmp_path, assets)
        env = daemon_env(pg_database.dsn, lease_renew_interval="30", lease_ttl="90")
        nodes: list[Node] = []
        try:
            async with PostgresStateBackend(pg_database.dsn) as db:

                async def owners() -> list[str]:
                    return sorted(x.owner or "" for x in await db.leases.alist_leases())

                a = await start_node("a", watchers, env, tmp_path, nodes)
                assert await owners() == [a.owner] * 4
                b = await start_node("b", watchers, env, tmp_path, nodes)

                async def shared() -> bool:
                    return await owners() == sorted([a.owner] * 2 + [b.owner] * 2)

                await wait_until(shared, "b to get its share", a, b)
                a.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(WAIT):
                    assert await a.process.wait() == 0
                for source in sources.values():
                    append_lines(source, 4, 6)

                async def b_runs_all() -> bool:
                    events = await db.events.alist_events()
                    every = all(len([e for e in events if e.asset == x]) >= 6 for x in assets)
                    return every and await owners() == [b.owner] * 4

                await wait_until(b_runs_all, "b to take a's watchers over", b)
                assert sorted(x.token for x in await db.leases.alist_leases()) == [2, 2, 2, 2]
                for name in assets:
                    events = await db.events.alist_events(asset=name)
                    assert [e.payload["n"] for e in events] == list(range(1, 7)), name
        finally:
            await stop_all(nodes)
