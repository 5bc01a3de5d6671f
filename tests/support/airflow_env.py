"""Airflow 3.3 in subprocesses, each test with its own ``AIRFLOW_HOME`` (an SQLite metastore).

Airflow is never imported into the test process: ``import airflow`` reconfigures structlog and
the root logger, which would change what the rest of the suite sees. Its commands run as child
processes of the test's own interpreter, with the environment built here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import anyio

from tests.support.requires import unavailable

__all__ = [
    "AIRFLOW_DAGS",
    "airflow_env",
    "require_airflow",
    "run_airflow",
    "run_python",
]

AIRFLOW_DAGS = Path(__file__).resolve().parent.parent / "airflow" / "dags"
"""The DAG files the Airflow tests run."""

COMMAND_TIMEOUT = 150.0
"""Seconds one command may take: ``airflow dags test`` starts cold in 7-8 s on an idle machine
and several times that on a loaded one."""


def require_airflow() -> None:
    """Skip (fail in CI) when the ``airflow`` extra is not installed."""
    if importlib.util.find_spec("airflow") is None:
        unavailable("Apache Airflow is not installed (the watchkeeper-airflow[airflow] extra)")


def airflow_env(home: Path, *, store_url: str, **extra: str) -> dict[str, str]:
    """The environment of an Airflow command: its own home and metastore, our backend selected,
    watchkeeper's store at ``store_url``; ``extra`` adds or overrides variables."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AIRFLOW__", "WATCHKEEPER__"))
    }
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(AIRFLOW_DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="false",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__STATE_STORE__BACKEND="watchkeeper.airflow.WatchkeeperStoreBackend",
        WATCHKEEPER__DATABASE__URL=store_url,
        PYTHONWARNINGS="ignore",  # Airflow's own warnings are not this suite's to judge
    )
    env.update(extra)
    return env


async def run_python(*args: str, env: Mapping[str, str]) -> str:
    """Run ``python ARGS`` with ``env`` and return its output; a failure raises with it."""
    with anyio.fail_after(COMMAND_TIMEOUT):
        done = await anyio.run_process([sys.executable, *args], env=dict(env), check=False)
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    if done.returncode != 0:
        raise AssertionError(
            f"python {' '.join(args)} exited {done.returncode}:\n{out[-4000:]}\n{err[-4000:]}"
        )
    return out


async def run_airflow(*args: str, env: Mapping[str, str]) -> str:
    """Run ``airflow ARGS`` with ``env`` and return its output; a failure raises with it."""
    return await run_python("-m", "airflow", *args, env=env)
