"""``watchkeeper airflow relay`` against a real ``airflow api-server``: every committed event
becomes exactly one Airflow asset event, across SIGKILLs of the relay mid-stream.

Airflow runs as a child process (``airflow api-server --workers 1`` on a temporary home with
the simple auth manager); the relay runs as ``watchkeeper airflow relay`` children, killed
with SIGKILL while they post; the test reads Airflow's events over its REST API.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from watchkeeper.store import Asset, StoreSettings, open_state_backend
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
from watchkeeper.triggerer.testing import run_trigger

from tests.support.airflow_env import airflow_env, require_airflow, run_airflow
from tests.support.daemons import free_port, reap, watchkeeper_command

AIRFLOW_TIMEOUT = 300
"""Airflow's api-server starts in ~9 s on an idle machine and several times that on a loaded
one: the suite's 120 s would fail a correct run on a busy machine."""

ORDERS = Asset("orders")
EVENTS = 60
KILLS = 4
PASSWORD = "relay-secret"


class Numbered(BaseEventTrigger):
    """``count`` events numbered from ``start``."""

    def __init__(self, start: int, count: int) -> None:
        super().__init__()
        self.start, self.count = start, count

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.Numbered", {"start": self.start, "count": self.count}

    async def run(self) -> Any:
        for n in range(self.start, self.start + self.count):
            yield TriggerEvent({"n": n}, state={"last": n})


class Airflow:
    """A running api-server and a logged-in client of its REST API."""

    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self.url, self.client = url, client

    async def events(self) -> list[dict[str, Any]]:
        asset_id = await self.asset_id("orders")
        found: list[dict[str, Any]] = []
        while True:
            page = await self.get(
                "/api/v2/assets/events",
                asset_id=asset_id,
                order_by="timestamp",
                limit=100,
                offset=len(found),
            )
            found += page["asset_events"]
            if len(found) >= page["total_entries"]:
                return found

    async def asset_id(self, name: str) -> int:
        page = await self.get("/api/v2/assets", name_pattern=name)
        [asset_id] = [a["id"] for a in page["assets"] if a["name"] == name]
        return int(asset_id)

    async def get(self, path: str, **params: Any) -> Any:
        response = await self.client.get(path, params=params)
        response.raise_for_status()
        return response.json()


@pytest.fixture
async def airflow(tmp_path: Path) -> AsyncIterator[tuple[Airflow, dict[str, str]]]:
    require_airflow()
    home = tmp_path / "airflow"
    home.mkdir()
    (home / "passwords.json").write_text(json.dumps({"relay": PASSWORD}))
    env = airflow_env(
        home,
        store_url=f"sqlite:///{tmp_path / 'watchkeeper.db'}",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="relay:op",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "passwords.json"),
        AIRFLOW__API_AUTH__JWT_SECRET="a-test-secret-of-enough-length-for-hs512-signing-keys",
        AIRFLOW__API__EXPOSE_CONFIG="false",
    )
    await run_airflow("db", "migrate", env=env)
    await run_airflow("dags", "reserialize", env=env)
    port = free_port()
    log = (tmp_path / "api-server.log").open("wb")
    server = await anyio.open_process(
        ["airflow", "api-server", "--port", str(port), "--host", "127.0.0.1", "--workers", "1"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            with anyio.fail_after(150):
                while True:
                    if server.returncode is not None:
                        pytest.fail(f"airflow api-server exited: {_tail(tmp_path)}")
                    try:
                        answer = await client.post(
                            "/auth/token", json={"username": "relay", "password": PASSWORD}
                        )
                        if answer.status_code == 201:
                            break
                    except httpx.TransportError:
                        pass
                    await anyio.sleep(0.5)
            client.headers["Authorization"] = f"Bearer {answer.json()['access_token']}"
            yield Airflow(url, client), env
    finally:
        await reap(server)
        log.close()


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "api-server.log").read_text(errors="replace")[-3000:]


async def test_the_password_comes_from_the_environment_only(tmp_path: Path) -> None:
    """Without the variable the relay refuses to start (exit 2) and says which one to set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER")}
    done = await anyio.run_process(
        watchkeeper_command(
            "--database-url",
            f"sqlite:///{tmp_path / 'wk.db'}",
            "airflow",
            "relay",
            "--airflow-url",
            "http://127.0.0.1:9",
            "--username",
            "relay",
            "--asset",
            "orders",
        ),
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert "WATCHKEEPER_AIRFLOW_PASSWORD" in done.stderr.decode()


@pytest.mark.slow
@pytest.mark.timeout(AIRFLOW_TIMEOUT)
async def test_each_event_reaches_airflow_once_across_kills(
    tmp_path: Path, airflow: tuple[Airflow, dict[str, str]]
) -> None:
    api, airflow_env_vars = airflow
    store_url = airflow_env_vars["WATCHKEEPER__DATABASE__URL"]
    async with open_state_backend(StoreSettings(database={"url": store_url})) as store:
        ours = await run_trigger(Numbered(1, EVENTS), assets=ORDERS, backend=store)
    ids = [event.id for event in ours]

    # A relay that died after Airflow took its first post and before it acknowledged it: the
    # post is in Airflow, the cursor is not moved. The next relay must find it, not post again.
    asset_id = await api.asset_id("orders")
    first = {
        "watchkeeper": {"relay": "airflow", "event_id": ids[0], "asset": "orders"},
        "payload": ours[0].payload,
    }
    posted = await api.client.post(
        "/api/v2/assets/events", json={"asset_id": asset_id, "extra": first}
    )
    assert posted.status_code == 200, posted.text

    # A DAG scheduled on the asset, unpaused so each event queues it.
    unpaused = await api.client.patch("/api/v2/dags/wk_on_orders", json={"is_paused": False})
    assert unpaused.status_code == 200, unpaused.text

    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AIRFLOW__", "WATCHKEEPER__"))
    }
    env["WATCHKEEPER_AIRFLOW_PASSWORD"] = PASSWORD
    relay_args = (
        "--database-url",
        store_url,
        "airflow",
        "relay",
        "--airflow-url",
        api.url,
        "--username",
        "relay",
        "--asset",
        "orders",
    )
    rng = random.Random(27)
    kills = 0
    seen = len(await api.events())
    while kills < KILLS:
        with (tmp_path / f"relay-{kills}.log").open("wb") as relay_log:
            relay = await anyio.open_process(
                watchkeeper_command(*relay_args),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=relay_log,
            )
        try:
            # Kill it once it posted a few more events, at a random moment after that.
            target = seen + rng.randint(3, 8)
            with anyio.fail_after(120):
                while (seen := len(await api.events())) < target:
                    if relay.returncode is not None:
                        pytest.fail(
                            (tmp_path / f"relay-{kills}.log").read_text(errors="replace")[-3000:]
                        )
                    await anyio.sleep(0.05)
            await anyio.sleep(rng.uniform(0, 0.2))
            relay.send_signal(signal.SIGKILL)
            kills += 1
        finally:
            await reap(relay)
    assert seen < EVENTS, "the relay finished before it was killed enough times"

    finish = await anyio.run_process(
        watchkeeper_command(*relay_args, "--drain"), env=env, check=False
    )
    assert finish.returncode == 0, finish.stderr.decode(errors="replace")[-3000:]

    events = await api.events()
    relayed = Counter(
        e["extra"]["watchkeeper"]["event_id"]
        for e in events
        if isinstance(e.get("extra"), dict) and "watchkeeper" in e["extra"]
    )
    assert relayed == Counter(ids), {k: n for k, n in relayed.items() if n != 1}
    assert len(events) == EVENTS
    by_id = {e["extra"]["watchkeeper"]["event_id"]: e["extra"]["payload"] for e in events}
    assert [by_id[i] for i in ids] == [event.payload for event in ours]

    # The DAG scheduled on the asset was queued by the relayed events.
    queued = await api.get(f"/api/v2/assets/{asset_id}/queuedEvents")
    assert [q["dag_id"] for q in queued["queued_events"]] == ["wk_on_orders"]
