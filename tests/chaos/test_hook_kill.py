"""kill -9 of a real ``watchkeeper triggerer`` while senders push webhooks to it: every
delivery is committed exactly once.

The daemon serves ``POST /hooks/pushes`` with a GitHub-style signed hook (``[api.hooks]`` in
its ``watchkeeper.toml``, the secret in the environment). Eight senders push 400 deliveries,
each signed, each with its delivery id, each sent again until it is answered 200, as a sender
does (a refused connection, a connection cut mid-request, any other answer: send again).
Meanwhile the daemon is SIGKILLed at random moments at least five times and started again.
A request cut by a kill was either committed (its retry is answered 200 ``duplicate``) or
not (its retry commits it): the events of the asset, counted with ``sqlite3``, are then
exactly the 400 deliveries, each once, each with its own body. The same on PostgreSQL
(counted with ``asyncpg``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from tests.support.daemons import free_port, reap, spawn_daemon
from tests.support.postgres import fresh_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEED = int(os.environ.get("WATCHKEEPER_CHAOS_SEED", random.randrange(2**32)))
DELIVERIES = 400
SENDERS = 8
KILLS = 6
SECRET = "chaos-hook-secret"


@dataclass
class Tally:
    """What the senders saw."""

    answered: int = 0
    duplicates: int = 0
    cut: int = 0
    """Requests sent whose answer never came (the connection died under them)."""
    refused: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    goal: int = 0
    reached: anyio.Event = field(default_factory=anyio.Event)
    """Set once ``answered`` reaches ``goal`` (and when the senders are done)."""

    def wait_for(self, goal: int) -> anyio.Event:
        self.goal, self.reached = goal, anyio.Event()
        if self.answered >= goal:
            self.reached.set()
        return self.reached


def _signed(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"n": n}).encode()
    digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": f"delivery-{n}",
        "X-Hub-Signature-256": f"sha256={digest}",
    }


async def _send(client: httpx.AsyncClient, n: int, tally: Tally) -> None:
    """Send delivery ``n`` until it is answered 200, as a webhook sender retries."""
    body, headers = _signed(n)
    while True:
        try:
            response = await client.post("/hooks/pushes", content=body, headers=headers)
        except httpx.ConnectError:
            tally.refused += 1
        except httpx.TransportError:
            tally.cut += 1
        else:
            tally.statuses[response.status_code] += 1
            if response.status_code == 200:
                tally.answered += 1
                tally.duplicates += bool(response.json()["duplicate"])
                if tally.answered >= tally.goal:
                    tally.reached.set()
                return
        await anyio.sleep(0.05)


async def _senders(client: httpx.AsyncClient, tally: Tally) -> None:
    queue = list(range(1, DELIVERIES + 1))

    async def sender() -> None:
        while queue:
            await _send(client, queue.pop(0), tally)

    async with anyio.create_task_group() as tg:
        for _ in range(SENDERS):
            tg.start_soon(sender)


START = 120.0
"""Seconds a daemon may take to answer after its start (a loaded machine starts Python slowly,
and a PostgreSQL daemon connects and migrates first)."""


async def _started(client: httpx.AsyncClient, process: anyio.abc.Process) -> float:
    """Wait until the daemon's API answers ``/healthz``; the seconds it took."""
    began = time.monotonic()
    with anyio.fail_after(START):
        while True:
            if process.returncode is not None:
                pytest.fail(f"the daemon exited ({process.returncode}) before its API answered")
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return time.monotonic() - began
            except httpx.TransportError:
                pass
            await anyio.sleep(0.05)


_COMMITTED = "SELECT dedup_key, payload FROM asset_events WHERE asset_name = 'pushes' ORDER BY id"


async def _committed(url: str) -> list[tuple[str, str]]:
    """The asset's events, read with the database's own driver (not through watchkeeper)."""
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as lite:
            rows = lite.execute(_COMMITTED).fetchall()
    else:
        import asyncpg

        pg = await asyncpg.connect(url)
        try:
            rows = [tuple(r) for r in await pg.fetch(_COMMITTED)]
        finally:
            await pg.close()
    return [(str(key), str(payload)) for key, payload in rows]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_every_delivery_is_committed_once_across_kills(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    """Eight senders, 400 signed deliveries retried until 200, six SIGKILLs of the daemon at
    random moments: the asset's events are the 400 deliveries, each exactly once."""
    if backend == "sqlite":
        await _kill_while_pushing(tmp_path, f"sqlite:///{tmp_path / 'state.db'}")
        return
    dsn = request.getfixturevalue("pg_dsn")
    async with fresh_pg_database(dsn, prefix="wk_hooks") as database:
        await _kill_while_pushing(tmp_path, database.dsn)


async def _kill_while_pushing(tmp_path: Path, url: str) -> None:
    rng = random.Random(SEED)
    watchers = tmp_path / "watchers"
    watchers.mkdir()
    (watchers / "hooks.py").write_text(
        'from watchkeeper.triggerer import Asset\n\npushes = Asset("pushes")\n'
    )
    (tmp_path / "watchkeeper.toml").write_text(
        '[api.hooks.pushes]\nprovider = "github"\nsecret_env = "WK_CHAOS_HOOK_SECRET"\n'
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        WATCHKEEPER__DATABASE__URL=url,
        WATCHKEEPER__LOGGING__FORMAT="json",
        WATCHKEEPER__API__PORT=str(port),
        WK_CHAOS_HOOK_SECRET=SECRET,
    )
    tally = Tally()
    kills = 0
    with (tmp_path / "daemon.log").open("ab") as log:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            process = await spawn_daemon(tmp_path, watchers, env, log)
            try:
                starts = [await _started(client, process)]
                async with anyio.create_task_group() as tg:
                    done = anyio.Event()

                    async def send_all() -> None:
                        await _senders(client, tally)
                        done.set()
                        tally.reached.set()

                    tg.start_soon(send_all)
                    while kills < KILLS and not done.is_set():
                        goal = tally.answered + rng.randint(5, DELIVERIES // (2 * KILLS))
                        with anyio.fail_after(120):
                            await tally.wait_for(goal).wait()
                        if done.is_set():
                            break
                        process.send_signal(signal.SIGKILL)
                        await reap(process)
                        kills += 1
                        process = await spawn_daemon(tmp_path, watchers, env, log)
                        starts.append(await _started(client, process))
                    with anyio.fail_after(120):
                        await done.wait()
                process.send_signal(signal.SIGTERM)
                with anyio.fail_after(20):
                    await process.wait()
            finally:
                await reap(process)
    rows = await _committed(url)
    keys = Counter(key for key, _ in rows)
    print(
        f"hooks chaos: {url.split(':')[0]} seed={SEED} kills={kills} deliveries={DELIVERIES} events={len(rows)} "
        f"cut={tally.cut} refused={tally.refused} duplicates={tally.duplicates} "
        f"statuses={dict(tally.statuses)} starts={[round(t, 1) for t in starts]}"
    )
    assert kills >= 5, "fewer kills than planned: the senders finished first"
    assert tally.cut > 0, "no kill cut a request in flight: the gap was never exercised"
    assert {key: count for key, count in keys.items() if count != 1} == {}
    assert set(keys) == {f"delivery-{n}" for n in range(1, DELIVERIES + 1)}
    for key, payload in rows:
        assert json.loads(payload)["body"] == {"n": int(key.removeprefix("delivery-"))}
