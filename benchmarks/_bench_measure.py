"""What the triggerer benchmark measures with: RSS, load, percentiles, CPU windows, log counts.

Shared by ``triggerer_bench.py`` and its idle child processes.
"""

from __future__ import annotations

import json
import resource
import time
from collections import Counter
from pathlib import Path
from typing import Self


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class LogTally:
    """A structlog stream (JSON lines) that keeps a count per event name, and for each
    ``loop_blocked`` event the task that held the loop (the monitor names it)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if not line.strip():
                continue  # print() writes the newline separately
            try:
                record = json.loads(line)
            except ValueError:
                self.counts["(unparsed)"] += 1
                continue
            event = str(record.get("event"))
            self.counts[event] += 1
            if event == "loop_blocked":
                self.counts[f"loop_blocked in {record.get('task')}"] += 1
        return len(text)

    def flush(self) -> None:
        pass

    def take(self) -> dict[str, int]:
        out = dict(self.counts)
        self.counts.clear()
        return out


LOGS = LogTally()


class CpuWindow:
    """Process CPU time (all threads: loop, SQLite writer, lag monitor) over a wall window."""

    def __enter__(self) -> Self:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        self.ru0 = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.user = ru.ru_utime - self.ru0.ru_utime
        self.system = ru.ru_stime - self.ru0.ru_stime

    @property
    def cores(self) -> float:
        return self.cpu / self.wall
