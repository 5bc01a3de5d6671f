"""Loader benchmark: what reading watcher files in a separate process costs at start-up.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/loader_bench.py [--files 200] [--runs 3]

Generates ``--files`` watcher files (each defines its own trigger class, so the daemon must
import every file to rebuild its trigger) and measures, each in a fresh child process:

- baseline: :func:`load_watchers`, every file imported in this process (what the daemon did
  before files were read in a separate process; unbounded in time);
- ours: :func:`aload_watchers`, the files read by a child process under ``import_timeout``,
  then the triggers rebuilt here;
- the daemon: ``watchkeeper triggerer`` from spawn to its ``daemon_started`` log line.

Wall time and CPU time (user + system, the reading process's included) per load; the CPU
figures are the ones to compare on a busy machine. Writes ``benchmarks/results/loader.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FILE = """
import anyio
from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent


class Watcher{i}(BaseEventTrigger):
    def __init__(self, n={i}):
        super().__init__()
        self.n = n

    def serialize(self):
        return (self.classpath(), {{"n": self.n}})

    async def run(self):
        await anyio.sleep_forever()
        yield TriggerEvent(1)


asset_{i} = Asset("asset_{i}", watchers=[AssetWatcher("watcher_{i}", Watcher{i}())])
"""

MEASURE = """
import json, resource, sys, time
import anyio
from watchkeeper.triggerer._evaluate import aload_watchers
from watchkeeper.triggerer._loader import load_watchers

def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

path, kind = sys.argv[1], sys.argv[2]
c0, t0 = cpu(), time.perf_counter()
if kind == "in-process":
    result = load_watchers(path)
else:
    result = anyio.run(lambda: aload_watchers(path, import_timeout=30), backend="asyncio")
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": cpu() - c0,
                  "groups": len(result.groups)}))
"""


def write_files(directory: Path, count: int) -> None:
    directory.mkdir()
    for i in range(count):
        (directory / f"w{i:04d}.py").write_text(FILE.format(i=i))


def measure_load(path: Path, kind: str) -> dict[str, float]:
    env = {**os.environ, "WATCHKEEPER__LOGGING__LEVEL": "error"}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), kind],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    result: dict[str, float] = json.loads(out.splitlines()[-1])
    return result


def measure_daemon(tmp: Path, watchers: Path, count: int) -> dict[str, float]:
    """Spawn to ``daemon_started``: wall time, and CPU of the daemon and its reaped children."""
    script = Path(sys.executable).with_name("watchkeeper")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
    env.update(
        WATCHKEEPER__DATABASE__URL=f"sqlite:///{tmp}/state-{time.monotonic_ns()}.db",
        WATCHKEEPER__LOGGING__FORMAT="json",
        WATCHKEEPER__TRIGGERER__GC_INTERVAL="0",
    )
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(script), "triggerer", "--watchers-path", str(watchers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp,
    )
    assert proc.stdout is not None
    figures: dict[str, float] = {}
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "daemon_started":
            figures["wall"] = time.perf_counter() - start
            stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = sum(int(f) for f in stat[11:15])  # utime stime cutime cstime
            figures["cpu"] = ticks / os.sysconf("SC_CLK_TCK")
            figures["groups"] = event["triggers"]
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    if figures.get("groups") != count:
        raise RuntimeError(f"the daemon did not start {count} triggers: {figures}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/loader.json"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows: dict[str, list[dict[str, float]]] = {"in-process": [], "isolated": [], "daemon": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        watchers = tmp / "watchers"
        write_files(watchers, args.files)
        for _ in range(args.runs):
            rows["in-process"].append(measure_load(watchers, "in-process"))
            rows["isolated"].append(measure_load(watchers, "isolated"))
            rows["daemon"].append(measure_daemon(tmp, watchers, args.files))
    summary: dict[str, Any] = {"files": args.files, "runs": args.runs, "loadavg_1m": load}
    print(f"{args.files} watcher files, {args.runs} runs, load average {load:.2f}")
    print(f"{'':<12} {'wall (median)':>14} {'cpu (median)':>13}")
    for kind, figures in rows.items():
        wall = statistics.median(f["wall"] for f in figures)
        cpu = statistics.median(f["cpu"] for f in figures)
        summary[kind] = {"wall_s": wall, "cpu_s": cpu, "runs": figures}
        print(f"{kind:<12} {wall:>12.2f} s {cpu:>11.2f} s")
    ratio = summary["isolated"]["cpu_s"] / summary["in-process"]["cpu_s"]
    print(f"isolated / in-process CPU: {ratio:.1f}x (load average {os.getloadavg()[0]:.2f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
