"""CLI start-up benchmark: how long ``watchkeeper`` takes to answer, against a bare interpreter.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/cli_bench.py [--runs 15] [--watchers 50] [--importtime]

Each command runs ``--runs`` times in a fresh process, interleaved with the others so a burst
of load on the shared machine hits them all alike. The baseline, in the same run, is
``python -c 'import sys'`` (the interpreter's own start-up, which no command can beat). The
``status`` commands read a SQLite database prepared with ``--watchers`` trigger statuses, a
live daemon row and each watched asset's state, as a daemon leaves it. Reported per command:
the median and best wall time, the median CPU time (user + system of the child, steadier than
wall time on a busy machine) and the ratio of the median wall time to the baseline's.
``--importtime`` adds the modules that cost most (``python -X importtime``) per command.
Writes ``benchmarks/results/cli.json``.

The children run with Python's bytecode cache on (``PYTHONDONTWRITEBYTECODE`` is dropped from
their environment, and the warm-up run writes the ``.pyc`` files), as an installed package
runs. ``--no-pyc`` keeps the cache off (every module compiled from source at every start), to
compare with figures taken in a shell that sets ``PYTHONDONTWRITEBYTECODE=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

CLI = "from watchkeeper.triggerer.cli import main; main()"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def _prepare(path: Path, watchers: int) -> None:
    from watchkeeper.store import Asset, AssetScope, SqliteStateBackend
    from watchkeeper.store.protocols import DaemonStatus, TriggerStatus

    now = datetime.now(UTC)
    async with SqliteStateBackend(path) as backend:
        await backend.events.aregister_assets([Asset(f"asset_{i}") for i in range(watchers)])
        for i in range(watchers):
            await backend.aset(AssetScope(name=f"asset_{i}"), "watermark", i * 1000)
        await backend.status.asave_daemon_status(
            DaemonStatus(
                owner="bench-host:1",
                started_at=now,
                heartbeat_at=now,
                lease_ttl=3600.0,
                watchers_path="watchers",
            )
        )
        await backend.status.asave_trigger_status(
            [
                TriggerStatus(
                    trigger_id=f"{i:032x}",
                    classpath="watchers.tables.TableWatcher",
                    assets=(f"asset_{i}",),
                    watchers=(f"watcher_{i}",),
                    state="running",
                    events=i,
                    last_event_at=now,
                    updated_at=now,
                    owner="bench-host:1",
                )
                for i in range(watchers)
            ]
        )


def _commands(db: Path) -> dict[str, list[str]]:
    url = ["--database-url", f"sqlite:///{db}"]
    py = sys.executable
    return {
        "baseline: python -c 'import sys'": [py, "-c", "import sys"],
        "import watchkeeper.triggerer": [py, "-c", "import watchkeeper.triggerer"],
        "watchkeeper --help": [py, "-c", CLI, "--help"],
        "watchkeeper status": [py, "-c", CLI, *url, "status"],
        "watchkeeper status --json": [py, "-c", CLI, *url, "status", "--json"],
        "watchkeeper events --limit 10": [py, "-c", CLI, *url, "events", "--limit", "10"],
    }


def _run_once(command: list[str], cwd: Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


NO_PYC: str | None = None
"""Set by ``--no-pyc`` to an empty cache directory: the children compile every module from
source (they neither write nor find a ``.pyc``)."""


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("WATCHKEEPER_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["COLUMNS"] = "120"
    if NO_PYC is not None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = NO_PYC
    return env


def _importtime(command: list[str], cwd: Path, top: int = 8) -> list[tuple[str, float]]:
    """The ``top`` modules by cumulative import time (ms) when ``command`` runs."""
    result = subprocess.run(
        [command[0], "-X", "importtime", *command[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    )
    rows: list[tuple[str, float]] = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line[12:].split("|"))
        rows.append((name, int(cumulative) / 1000))
    return sorted(rows, key=lambda row: -row[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--no-pyc", action="store_true", help="no bytecode cache")
    opts = parser.parse_args()
    global NO_PYC
    with tempfile.TemporaryDirectory() as empty:
        NO_PYC = empty if opts.no_pyc else None
        _measure(opts)


def _measure(opts: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        db = cwd / "status.db"
        anyio.run(_prepare, db, opts.watchers)
        commands = _commands(db)
        for command in commands.values():  # warm the page cache and the .pyc files
            _run_once(command, cwd)
        load_before = loadavg()
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(opts.runs):
            for name, command in commands.items():
                times[name].append(_run_once(command, cwd))
        load_after = loadavg()
        imports = (
            {name: _importtime(command, cwd) for name, command in commands.items()}
            if opts.importtime
            else {}
        )

    baseline = statistics.median(w for w, _ in times[next(iter(commands))])
    results: dict[str, Any] = {
        "runs": opts.runs,
        "watchers": opts.watchers,
        "python": sys.version.split()[0],
        "bytecode_cache": not opts.no_pyc,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "cpus": os.cpu_count(),
        "commands": {},
    }
    cache = "off (--no-pyc)" if opts.no_pyc else "on"
    print(f"{opts.runs} runs each, {opts.watchers} watchers in the status database")
    print(f"bytecode cache {cache}")
    print(f"load average {load_before} -> {load_after} ({os.cpu_count()} CPUs)")
    print(f"{'command':<36} {'median s':>9} {'best s':>7} {'cpu s':>6} {'x baseline':>10}")
    for name, samples in times.items():
        wall = statistics.median(w for w, _ in samples)
        best = min(w for w, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        ratio = wall / baseline
        results["commands"][name] = {
            "median_s": wall,
            "best_s": best,
            "cpu_median_s": cpu,
            "ratio": ratio,
            "importtime_ms": imports.get(name, []),
        }
        print(f"{name:<36} {wall:>9.3f} {best:>7.3f} {cpu:>6.3f} {ratio:>10.1f}")
        for module, ms in imports.get(name, []):
            print(f"    {module:<50} {ms:>8.1f} ms")
    out = Path(__file__).parent / "results" / "cli.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
