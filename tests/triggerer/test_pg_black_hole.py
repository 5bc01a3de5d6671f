"""A network that black-holes the PostgreSQL connections of a running process (their sockets
stay open, their bytes are dropped, new connections work) stalls it for no longer than one
statement's bound: the daemon and a worker, real processes behind a TCP proxy, commit again
within ``lease_ttl`` + 5 s of the hole, nothing is lost or done twice (raw SQL), and SIGTERM
still stops them promptly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import pytest
from watchkeeper.store import Asset, PostgresStateBackend
from watchkeeper.store.protocols import EventCommit

from tests.support.daemons import (
    LINES_WATCHER,
    append_lines,
    asset_file,
    reap,
    wait_until,
    watchkeeper_command,
)
from tests.support.postgres import PgDatabase
from tests.support.proxy import TcpProxy, open_proxy

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

LEASE_TTL = 3.0
"""The daemons' node lease (the default: three renewals of 1 s)."""
WORKER_LEASE_TTL = 5.0
"""The worker's run leases (shorter than the default 15 s, so the bound below means more)."""
RECOVERY = LEASE_TTL + 5
"""The bound on committing again once the network is back (every wait here is bounded)."""
STOP = 10.0
"""The bound on a SIGTERMed process's exit."""


def proxied(dsn: str, proxy: TcpProxy) -> str:
    """``dsn`` through ``proxy`` (its host and port replaced)."""
    url = urlsplit(dsn)
    netloc = url.netloc.rsplit("@", 1)
    netloc[-1] = proxy.dsn_host
    return urlunsplit(url._replace(netloc="@".join(netloc)))


async def rows(dsn: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Raw SQL on a connection of the test's own (never through the proxy)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def streams(dsn: str) -> dict[str, list[int]]:
    """Each asset's committed ``n`` in commit order."""
    found: dict[str, list[int]] = {}
    for asset, payload in await rows(
        dsn, "SELECT asset_name, payload FROM asset_events ORDER BY id"
    ):
        found.setdefault(asset, []).append(json.loads(payload)["n"])
    return found


def still_open(proxy: TcpProxy) -> list[int]:
    """The client ports of the black-holed links whose client socket is still established
    (``/proc/net/tcp``): connections the client did not give up."""
    holed = {
        link.client.extra(anyio.abc.SocketAttribute.remote_port)
        for link in proxy.links
        if link.holed
    }
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        local_port, remote_port = (int(a.split(":")[1], 16) for a in (local, remote))
        if state == "01" and remote_port == proxy.port and local_port in holed:
            found.append(local_port)
    return found


def base_env(dsn: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(WATCHKEEPER__DATABASE__URL=dsn, WATCHKEEPER__LOGGING__FORMAT="json")
    env.update(settings)
    return env


@asynccontextmanager
async def process(
    tmp_path: Path, name: str, env: dict[str, str], *args: str
) -> AsyncIterator[anyio.abc.Process]:
    """``watchkeeper ARGS`` as a child, its output in ``<name>.log``; killed at exit."""
    with (tmp_path / f"{name}.log").open("ab") as log:
        child = await anyio.open_process(
            watchkeeper_command(*args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=tmp_path,
            env=env,
        )
    try:
        yield child
    finally:
        await reap(child)


def log_tail(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text(errors="replace")[-4000:]


async def stop(child: anyio.abc.Process, tmp_path: Path, name: str) -> None:
    """SIGTERM ``child``: it exits 0 within :data:`STOP`."""
    child.send_signal(signal.SIGTERM)
    with anyio.move_on_after(STOP):
        await child.wait()
    assert child.returncode == 0, f"{name} did not stop in {STOP} s:\n{log_tail(tmp_path, name)}"


async def recovers(
    check: Any, what: str, tmp_path: Path, name: str, within: float = RECOVERY
) -> None:
    """Poll ``check`` until truthy; fail with the log's tail after ``within`` seconds (the
    lease's time to live + 5 s)."""
    with anyio.move_on_after(within) as scope:
        while True:
            if await check():
                return
            await anyio.sleep(0.05)
    if scope.cancelled_caught:
        raise AssertionError(
            f"{what}: not within {within} s of the black hole\n{log_tail(tmp_path, name)}"
        )


class TestDaemon:
    async def test_daemon_commits_again_after_its_connections_are_black_holed(
        self, tmp_path: Path, pg_database: PgDatabase
    ) -> None:
        """Three watchers commit, every connection of the daemon is black-holed, more lines
        come: they are committed within the bound, each exactly once, and SIGTERM stops it."""
        assets = ("alpha", "beta", "gamma")
        watchers = tmp_path / "watchers"
        watchers.mkdir()
        (watchers / "lines.py").write_text(LINES_WATCHER)
        sources = {a: tmp_path / f"{a}.txt" for a in assets}
        for asset, source in sources.items():
            (watchers / f"{asset}.py").write_text(asset_file(asset, source))
            append_lines(source, 1, 3)
        dsn = pg_database.dsn
        async with PostgresStateBackend(dsn):
            pass  # the schema, for the raw SQL below
        async with open_proxy(urlsplit(dsn).port or 5432) as proxy:
            env = base_env(
                proxied(dsn, proxy),
                WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL="0.5",
                WATCHKEEPER__TRIGGERER__LEASE_RENEW_INTERVAL="0.5",
                WATCHKEEPER__TRIGGERER__LEASE_TTL=str(LEASE_TTL),
                WATCHKEEPER__TRIGGERER__STOP_GRACE="2",
                WATCHKEEPER__API__ENABLED="false",
            )
            name = "daemon"
            args = ("triggerer", "--watchers-path", str(watchers), "--reload-interval", "0.5")
            async with process(tmp_path, name, env, *args) as daemon:

                async def committed(count: int) -> bool:
                    found = await streams(dsn)
                    return all(len(found.get(a, [])) >= count for a in assets)

                await wait_until(lambda: committed(3), "the first events", daemon)
                assert proxy.black_hole() > 0
                for source in sources.values():
                    append_lines(source, 4, 6)
                await recovers(lambda: committed(6), "events after the hole", tmp_path, name)

                async def holed_closed() -> bool:
                    # The keep-alive thread's connection, if it has one, is replaced when it
                    # is next used (the loop renews on time here); every other is closed.
                    return len(still_open(proxy)) <= 1

                if sys.platform == "linux":
                    await recovers(holed_closed, "the silent connections closed", tmp_path, name)
                await stop(daemon, tmp_path, name)
        found = await streams(dsn)
        for asset in assets:
            assert found[asset] == [1, 2, 3, 4, 5, 6], f"{asset}: a gap or a duplicate"
        marks = await rows(
            dsn,
            "SELECT a.name, s.value FROM asset_state s JOIN assets a ON a.id = s.asset_id "
            "WHERE s.key = 'watermark' ORDER BY a.name",
        )
        assert [(a, json.loads(v)) for a, v in marks] == [(a, 6) for a in sorted(assets)]


TASKS = textwrap.dedent(
    """
    from watchkeeper.triggerer import Asset, asset_task

    src = Asset("hole_src")


    @asset_task(schedule=[src], retries=1000, retry_delay=0.05)
    def consume(*, triggering_asset_events, **_):
        pass
    """
)


class TestWorker:
    async def test_worker_runs_tasks_again_after_its_connections_are_black_holed(
        self, tmp_path: Path, pg_database: PgDatabase
    ) -> None:
        """A worker runs a task on events; its connections are black-holed; the events
        committed after are run within the bound, each event in exactly one successful run,
        and SIGTERM stops it."""
        defs = tmp_path / "defs"
        defs.mkdir()
        (defs / "tasks.py").write_text(TASKS)
        dsn = pg_database.dsn
        source = Asset("hole_src")

        async def produce(backend: PostgresStateBackend, first: int, last: int) -> None:
            log = backend.events
            for n in range(first, last + 1):
                await log.acommit(EventCommit("feed", (source.name,), json.dumps({"n": n})))

        async def done(count: int) -> bool:
            (row,) = await rows(
                dsn,
                "SELECT count(*) FROM task_run_events e JOIN task_runs r ON r.id = e.run_id "
                "WHERE r.state = 'success'",
            )
            return bool(row[0] >= count)

        async with (
            PostgresStateBackend(dsn) as backend,
            open_proxy(urlsplit(dsn).port or 5432) as proxy,
        ):
            await backend.events.aregister_assets([source])
            env = base_env(
                proxied(dsn, proxy),
                WATCHKEEPER__WORKER__POLL_INTERVAL="0.05",
                WATCHKEEPER__WORKER__HEARTBEAT_INTERVAL="0.5",
                WATCHKEEPER__WORKER__LEASE_TTL=str(WORKER_LEASE_TTL),
            )
            name = "worker"
            args = ("worker", "--watchers-path", str(defs))
            async with process(tmp_path, name, env, *args) as worker:

                def started() -> bool:
                    return '"worker_started"' in log_tail(tmp_path, name)

                await wait_until(started, "the worker to start", worker)
                await produce(backend, 1, 5)
                await wait_until(lambda: done(5), "the first runs", worker)
                assert proxy.black_hole() > 0
                await produce(backend, 6, 10)
                within = WORKER_LEASE_TTL + 5
                await recovers(lambda: done(10), "runs after the hole", tmp_path, name, within)
                await stop(worker, tmp_path, name)
        in_success = await rows(
            dsn,
            "SELECT e.event_id FROM task_run_events e JOIN task_runs r ON r.id = e.run_id "
            "WHERE r.state = 'success' ORDER BY e.event_id",
        )
        events = await rows(dsn, "SELECT id FROM asset_events ORDER BY id")
        assert [r[0] for r in in_success] == [r[0] for r in events]
        (open_runs,) = await rows(
            dsn, "SELECT count(*) FROM task_runs WHERE state IN ('queued', 'running')"
        )
        assert open_runs[0] == 0


UP_DEFINITIONS = """
from watchkeeper.triggerer import Asset, AssetWatcher, asset_task
from lines import LinesWatcher

alpha = Asset("alpha", watchers=[AssetWatcher("alpha_feed", LinesWatcher({path!r}))])


@asset_task(schedule=[alpha], retries=1000, retry_delay=0.05)
def consume(**_):
    pass
"""


class TestUp:
    async def test_up_commits_and_runs_again_after_its_connections_are_black_holed(
        self, tmp_path: Path, pg_database: PgDatabase
    ) -> None:
        """``watchkeeper up`` (a triggerer and a worker in one process): after the hole its
        watcher commits the new lines and its worker runs them, each event once, in one
        successful run, and SIGTERM stops it."""
        watchers = tmp_path / "watchers"
        watchers.mkdir()
        (watchers / "lines.py").write_text(LINES_WATCHER)
        source = tmp_path / "alpha.txt"
        (watchers / "alpha.py").write_text(UP_DEFINITIONS.format(path=str(source)))
        append_lines(source, 1, 3)
        dsn = pg_database.dsn
        async with PostgresStateBackend(dsn):
            pass  # the schema, for the raw SQL below

        async def done(count: int) -> bool:
            (row,) = await rows(
                dsn,
                "SELECT (SELECT count(*) FROM asset_events), (SELECT count(*) FROM "
                "task_run_events e JOIN task_runs r ON r.id = e.run_id WHERE r.state = 'success')",
            )
            return bool(row[0] >= count and row[1] >= count)

        async with open_proxy(urlsplit(dsn).port or 5432) as proxy:
            env = base_env(
                proxied(dsn, proxy),
                WATCHKEEPER__TRIGGERER__HEARTBEAT_INTERVAL="0.5",
                WATCHKEEPER__TRIGGERER__LEASE_RENEW_INTERVAL="0.5",
                WATCHKEEPER__TRIGGERER__LEASE_TTL=str(LEASE_TTL),
                WATCHKEEPER__TRIGGERER__STOP_GRACE="2",
                WATCHKEEPER__WORKER__HEARTBEAT_INTERVAL="0.5",
                WATCHKEEPER__WORKER__LEASE_TTL=str(LEASE_TTL),
                WATCHKEEPER__API__ENABLED="false",
            )
            name = "up"
            args = ("up", "--watchers-path", str(watchers))
            async with process(tmp_path, name, env, *args) as up:
                await wait_until(lambda: done(3), "the first events and runs", up)
                assert proxy.black_hole() > 0
                append_lines(source, 4, 6)
                await recovers(lambda: done(6), "events and runs after the hole", tmp_path, name)
                await stop(up, tmp_path, name)
        assert (await streams(dsn))["alpha"] == [1, 2, 3, 4, 5, 6]
        in_success = await rows(
            dsn,
            "SELECT e.event_id FROM task_run_events e JOIN task_runs r ON r.id = e.run_id "
            "WHERE r.state = 'success' ORDER BY e.event_id",
        )
        events = await rows(dsn, "SELECT id FROM asset_events ORDER BY id")
        assert [r[0] for r in in_success] == [r[0] for r in events]
