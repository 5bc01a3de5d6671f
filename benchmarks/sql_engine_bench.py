"""Per-statement client cost of the store's SQL engine (``watchkeeper.store.sql``), against a
prebuilt statement string with its arguments in a tuple (the hand-written baseline).

Not a test. Run by hand from the repository root:

    python3 -m uv run python benchmarks/sql_engine_bench.py

No database: both sides hand their statement to a step that does nothing, so what is measured
is what the engine adds per statement (binding by name, the job's generator, driving it), in
CPU time (``time.process_time``). Writes benchmarks/results/sql_engine.json (with the load).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchkeeper.store.sql.dialects import POSTGRES, SQLITE
from watchkeeper.store.sql.engine import Dialect, Job, Query, Step, count, drive_sync
from watchkeeper.store.sql.leases import LeaseStatements

N = 200_000


def _cpu_us(fn: Callable[[], Any], n: int = N) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


def _renew(s: LeaseStatements, owner: str, ttl: float) -> Job[int]:
    changed: int = yield count(s.renew, owner=owner, ttl=ttl)
    return changed


def measure(dialect: Dialect) -> dict[str, float]:
    s = LeaseStatements(dialect, "")
    stmt = s.renew
    sql, args = stmt.sql, stmt.bind({"owner": "d1", "ttl": 30.0}, "now", lambda t: "later")

    def execute(sql: str, *args: Any) -> int:
        return 1

    def step(step: Step) -> int:
        if isinstance(step, Query):  # what an executor does per statement, but the call
            step.stmt.bind(step.params, "now", lambda t: "later")
        return 1

    def raw() -> int:
        return execute(sql, *args)

    def engine() -> int:
        return drive_sync(_renew(s, "d1", 30.0), step)

    def engine_bound() -> int:
        query = count(stmt, owner="d1", ttl=30.0)
        return execute(stmt.sql, *stmt.bind(query.params, "now", lambda t: "later"))

    def compile_cached() -> Any:
        return dialect.compile(
            "UPDATE {p}trigger_nodes SET expires_at = {expires} WHERE owner = :owner AND alive"
        )

    raw_us = _cpu_us(raw)
    return {
        "raw_prebuilt_us": round(raw_us, 3),
        "engine_bind_us": round(_cpu_us(engine_bound), 3),
        "engine_job_us": round(_cpu_us(engine), 3),
        "compile_cached_us": round(_cpu_us(compile_cached), 3),
        "engine_job_minus_raw_us": round(_cpu_us(engine) - raw_us, 3),
    }


def main() -> None:
    result: dict[str, Any] = {"loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    for dialect in (SQLITE, POSTGRES):
        figures = measure(dialect)
        result[dialect.name] = figures
        print(f"{dialect.name:10}  " + "  ".join(f"{k} {v}" for k, v in figures.items()))
    result["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = Path("benchmarks/results/sql_engine.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
