"""Airflow benchmark: a state-store call from an Airflow 3.3 task, through watchkeeper's backend
and through Airflow's own metastore backend, in the same run.

Not a test (CI does not run it). Needs the ``airflow`` extra (the dev group installs it). Run by
hand from the repository root:

    uv run python benchmarks/airflow_bench.py [--calls N] [--rounds R] [--postgres]

One temporary ``AIRFLOW_HOME`` (SQLite metastore, ``airflow db migrate`` once), then R rounds,
each alternating the two backends so a change in the machine's load hits both:

1. **From a task.** ``airflow dags test`` of a DAG whose task times N calls of each of
   ``context["asset_state_store"].set``/``.get`` and ``context["task_state_store"].set``/``.get``
   (the whole path: the task's accessor, the supervisor, Airflow's in-process Execution API
   route, the backend, and back).
2. **The backend alone.** N calls of ``backend.set``/``backend.get`` on an ``AssetScope(asset_id=)``
   with a SQLAlchemy session per call, committed, as an Execution API request holds one.

watchkeeper's store is a SQLite file (or, with ``--postgres``, a fresh database on
``WATCHKEEPER_BENCH_PG_DSN``, default ``postgresql://postgres@127.0.0.1:5432/test``). Reported:
median and p99 per call in microseconds (the first call of each process left out: it opens
watchkeeper's store), and watchkeeper's median over Airflow's. Writes
``benchmarks/results/airflow.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

from _bench_measure import loadavg, pct

OURS = "watchkeeper.airflow.WatchkeeperStoreBackend"
THEIRS = "airflow.state.metastore.MetastoreBackend"

DAG = """
from __future__ import annotations

import json
import os
import time
from datetime import datetime

from airflow.sdk import DAG, Asset, task

BENCH = Asset(name="bench", uri="s3://bench/data")

with DAG("wk_airflow_bench", schedule=None, start_date=datetime(2026, 1, 1)):

    @task(outlets=[BENCH])
    def calls(**context):
        n = int(os.environ["WK_BENCH_CALLS"])
        asset, notes = context["asset_state_store"], context["task_state_store"]
        times = {"asset_set": [], "asset_get": [], "task_set": [], "task_get": []}
        for i in range(n):
            for name, call in (
                ("asset_set", lambda: asset.set("watermark", {"n": i})),
                ("asset_get", lambda: asset.get("watermark")),
                ("task_set", lambda: notes.set("note", i)),
                ("task_get", lambda: notes.get("note")),
            ):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
        with open(os.environ["WK_BENCH_OUT"], "w") as out:
            json.dump(times, out)

    calls()
"""

BACKEND_ALONE = """
import json, os, sys, time
from airflow.state import AssetScope, resolve_state_backend
from airflow.utils.session import create_session
from airflow.models.asset import AssetModel
from sqlalchemy import select

backend = resolve_state_backend()()
n = int(os.environ["WK_BENCH_CALLS"])
with create_session() as s:
    asset_id = s.scalar(select(AssetModel.id).where(AssetModel.name == "bench"))
scope = AssetScope(asset_id=asset_id)
times = {"backend_set": [], "backend_get": []}
for i in range(n):
    start = time.perf_counter()
    with create_session() as s:
        backend.set(scope, "alone", json.dumps({"n": i}), session=s)
    times["backend_set"].append(time.perf_counter() - start)
    start = time.perf_counter()
    with create_session() as s:
        backend.get(scope, "alone", session=s)
    times["backend_get"].append(time.perf_counter() - start)
print(json.dumps(times))
"""


def _env(home: Path, backend: str, store_url: str, calls: int, out: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "WATCHKEEPER__"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="false",
        AIRFLOW__STATE_STORE__BACKEND=backend,
        WATCHKEEPER__DATABASE__URL=store_url,
        WK_BENCH_CALLS=str(calls),
        WK_BENCH_OUT=str(out),
        PYTHONWARNINGS="ignore",
    )
    return env


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def _pg_database(dsn: str) -> tuple[str, str]:
    import asyncio

    import asyncpg

    name = f"wk_airflow_bench_{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return name, dsn.rsplit("/", 1)[0] + f"/{name}"


def _drop(dsn: str, name: str) -> None:
    import asyncio

    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="wk-airflow-bench-") as tmp:
        home = Path(tmp)
        (home / "dags").mkdir()
        (home / "dags" / "wk_airflow_bench.py").write_text(textwrap.dedent(DAG))
        pg: tuple[str, str] | None = None
        dsn = os.environ.get(
            "WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"
        )
        if args.postgres:
            pg = _pg_database(dsn)
            store_url = pg[1]
        else:
            store_url = f"sqlite:///{home / 'watchkeeper.db'}"
        try:
            out = home / "times.json"
            airflow = [sys.executable, "-m", "airflow"]
            _run([*airflow, "db", "migrate"], _env(home, THEIRS, store_url, args.calls, out))
            samples: dict[str, dict[str, list[float]]] = {"ours": {}, "airflow": {}}
            for _ in range(args.rounds):
                for label, backend in (("ours", OURS), ("airflow", THEIRS)):
                    env = _env(home, backend, store_url, args.calls, out)
                    _run([*airflow, "dags", "test", "wk_airflow_bench"], env)
                    alone = json.loads(
                        _run([sys.executable, "-c", BACKEND_ALONE], env).strip().splitlines()[-1]
                    )
                    for name, times in {**json.loads(out.read_text()), **alone}.items():
                        # the first call of a process opens watchkeeper's store: not a call's cost
                        samples[label].setdefault(name, []).extend(times[1:])
        finally:
            if pg is not None:
                _drop(dsn, pg[0])

    report: dict[str, Any] = {
        "calls": args.calls,
        "rounds": args.rounds,
        "store": "postgresql" if args.postgres else "sqlite",
        "load": loadavg(),
        "rows": [],
    }
    print(f"store: {report['store']}, {args.calls} calls x {args.rounds} rounds, load {loadavg()}")
    print(
        f"{'call':<12} {'ours p50':>10} {'ours p99':>10} {'airflow p50':>12} {'airflow p99':>12} {'ratio':>6}"
    )
    for name in samples["ours"]:
        ours, theirs = samples["ours"][name], samples["airflow"][name]
        row = {
            "call": name,
            "ours_p50_us": statistics.median(ours) * 1e6,
            "ours_p99_us": pct(ours, 0.99) * 1e6,
            "airflow_p50_us": statistics.median(theirs) * 1e6,
            "airflow_p99_us": pct(theirs, 0.99) * 1e6,
        }
        row["ratio_p50"] = row["ours_p50_us"] / row["airflow_p50_us"]
        report["rows"].append(row)
        print(
            f"{name:<12} {row['ours_p50_us']:>10.0f} {row['ours_p99_us']:>10.0f} "
            f"{row['airflow_p50_us']:>12.0f} {row['airflow_p99_us']:>12.0f} {row['ratio_p50']:>6.2f}"
        )
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    (results / "airflow.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
