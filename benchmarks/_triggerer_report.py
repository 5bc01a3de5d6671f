"""Printing the results of ``triggerer_bench.py``: tables, ratios to the baselines, the goals.

Not a test and not part of any package: imported by ``benchmarks/triggerer_bench.py`` only.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

__all__ = ["AIRFLOW_33", "GOALS", "report"]

GOALS: dict[str, Any] = {
    "start_10k_s": 5.0,
    "rss_per_watcher_kib": 10.0,
    "idle_cores": 0.5,
    "sqlite_events_per_s": 15_000,
    "p99_ms": {"1000": 5.0, "10000": 15.0},
}
AIRFLOW_33 = (
    "For scale, Airflow 3.3's triggerer on a machine like this: 5,000 idle watchers took ~30 s\n"
    "to start at ~14 KB each, a store call ~40 ms, at most ~72 asset events/s."
)
_NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def _ratio(ours: float, base: float) -> str:
    if not base or math.isnan(ours) or math.isnan(base):
        return "-"
    return f"{ours / base:.2f}x"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def _check(res: dict[str, Any]) -> str:
    check = res.get("check") or {}
    if not check:
        return "-"
    if check["events"] == check["watermark_sum"]:
        return f"ok ({check['events']} events = sum of watermarks)"
    return f"MISMATCH events={check['events']} watermarks={check['watermark_sum']}"


def _blocked(res: dict[str, Any]) -> int:
    return int((res.get("logs") or {}).get("loop_blocked", 0))


def _idle(r: dict[str, Any]) -> None:
    idle = r.get("idle") or {}
    if not idle:
        return
    raw = idle.get("raw") or {}
    print(
        f"\nIdle watchers: {raw.get('count', '?')} polling every 1 s (jittered), a fresh process each"
    )
    head = (
        f"  {'':<22}{'start':>9}{'running':>9}{'RSS/watcher':>13}{'idle CPU':>12}"
        f"{'polls/s':>9}{'CPU/poll':>10}{'stop':>8}{'blocked':>9}  load"
    )
    print(head)

    def row(label: str, res: dict[str, Any]) -> None:
        if "error" in res:
            print(f"  {label:<22}ERROR {res['error']}")
            return
        print(
            f"  {label:<22}{res['start_s']:>7.2f} s{res['all_running_s']:>7.2f} s"
            f"{res['rss_per_watcher_bytes'] / 1024:>9.1f} KiB{res['idle_cores']:>6.3f} cores"
            f"{res['polls_per_s']:>9.0f}{res['cpu_us_per_poll']:>7.1f} us{res['stop_s']:>6.2f} s"
            f"{_blocked(res):>9}  {res['load_before']}"
        )

    if raw:
        row("bare anyio tasks", raw)
    for kind, label in (
        ("sqlite", "ours, SQLite"),
        ("postgres", "ours, PostgreSQL"),
        ("sqlite_tuned", "ours, SQLite, GC tuned"),
    ):
        res = idle.get(kind)
        if not res:
            continue
        row(label, res)
        if "error" not in res and "error" not in raw and raw:
            print(
                f"  {'  ratio to bare tasks':<22}{_ratio(res['start_s'], raw['start_s']):>9}"
                f"{_ratio(res['all_running_s'], raw['all_running_s']):>9}"
                f"{_ratio(res['rss_per_watcher_bytes'], raw['rss_per_watcher_bytes']):>13}"
                f"{_ratio(res['idle_cores'], raw['idle_cores']):>12}"
                f"{'':>9}{_ratio(res['cpu_us_per_poll'], raw['cpu_us_per_poll']):>10}"
            )
        if "register_assets_s" in res:
            print(f"  {'':<22}(registering the assets first: {res['register_assets_s']:.2f} s)")
    diag = [
        (k, label)
        for k, label in (
            ("diag_no_status", "SQLite, no status saves"),
            ("diag_no_gc", "SQLite, cyclic GC off"),
            ("diag_raw_no_gc", "bare tasks, GC off"),
        )
        if k in idle
    ]
    if diag:
        print(
            "\nDiagnosis (not the product's configuration): the same idle run with one cost removed"
        )
        print(head)
        for key, label in diag:
            row(label, idle[key])
    blocked: Counter[str] = Counter()
    for kind in ("sqlite", "postgres"):
        for key, count in ((idle.get(kind) or {}).get("logs") or {}).items():
            if key.startswith("loop_blocked in "):
                blocked[key[len("loop_blocked in ") :]] += count
    if blocked:
        print(
            "  loop_blocked warnings by the task holding the loop: "
            + ", ".join(f"{task} x{count}" for task, count in blocked.most_common(5))
        )
    if "stretch_sqlite" in idle:
        every = idle["stretch_sqlite"].get("interval_s", 10.0)
        print(f"\nStretch: 100,000 idle watchers polling every {every:g} s")
        print(head)
        row("bare anyio tasks", idle["stretch_raw"])
        row("ours, SQLite, GC tuned", idle["stretch_sqlite"])


def _events(r: dict[str, Any]) -> None:
    for kind, res in (r.get("events") or {}).items():
        name = _NAMES[kind]
        print(f"\nDurable events/s with state=, {name} (each watcher yields as fast as it commits)")
        print(
            f"  {'watchers':>8}{'raw pipeline':>15}{'backend only':>15}{'ours':>12}{'ratio':>8}"
            f"{'batch raw/backend/ours':>24}{'cores raw/backend/ours':>24}  load"
        )
        checks = []
        for n, pair in res["throughput"].items():
            raw, ours = pair["raw"], pair["ours"]
            mid = pair.get("backend") or {"events_per_s": float("nan"), "cores": float("nan")}
            print(
                f"  {n:>8}{raw['events_per_s']:>10.0f} ev/s{mid['events_per_s']:>10.0f} ev/s"
                f"{ours['events_per_s']:>7.0f} ev/s"
                f"{_ratio(ours['events_per_s'], raw['events_per_s']):>8}"
                f"{raw['mean_batch']:>10.0f} /{_num(mid.get('mean_batch')):>5} /{_num(ours.get('mean_batch')):>5}"
                f"{raw['cores']:>10.2f} /{mid['cores']:>5.2f} /{ours['cores']:>5.2f}"
                f"  {pair['load']}"
            )
            checks.append(f"{n}: {_check(ours)}")
        print("  consistency after stopping (ours): " + "; ".join(checks))
        print(f"\nOpen-loop event-to-commit latency, {name} (100 emitters on a schedule)")
        print(
            f"  {'rate':>7}{'raw p50/p99':>18}{'ours p50/p99':>19}{'p50, p99 ratio':>17}"
            f"{'ours p99.9/max':>18}{'sustained raw/ours':>20}{'goal p99':>10}  load"
        )
        for rate, pair in res["latency"].items():
            raw, ours = pair["raw"], pair["ours"]
            goal = GOALS["p99_ms"][rate]
            print(
                f"  {rate:>7}{raw['p50_ms']:>8.2f} /{raw['p99_ms']:>6.2f} ms"
                f"{ours['p50_ms']:>9.2f} /{ours['p99_ms']:>6.2f} ms"
                f"{_ratio(ours['p50_ms'], raw['p50_ms']):>8},{_ratio(ours['p99_ms'], raw['p99_ms']):>7}"
                f"{ours['p999_ms']:>8.1f} /{ours['max_ms']:>6.1f} ms"
                f"{raw['sustained_per_s']:>11.0f} /{ours['sustained_per_s']:>6.0f}"
                f"{'<= ' + str(goal):>10}  {pair['load']}"
            )


def _goals(r: dict[str, Any]) -> None:
    print("\nGoals")
    idle = r.get("idle") or {}
    for kind, name in (*_NAMES.items(), ("sqlite_tuned", "SQLite, daemon's GC tuning")):
        res = idle.get(kind)
        if not res or "error" in res:
            continue
        full = res["count"] == 10_000
        start, kib, cores = res["start_s"], res["rss_per_watcher_bytes"] / 1024, res["idle_cores"]
        print(
            f"  {name}: 10,000 watchers started within {GOALS['start_10k_s']} s: {start:.2f} s"
            f" -> {_met(start <= GOALS['start_10k_s'] if full else None)}"
        )
        print(
            f"  {name}: under {GOALS['rss_per_watcher_kib']} KiB RSS each: {kib:.1f} KiB"
            f" -> {_met(kib < GOALS['rss_per_watcher_kib'])}"
        )
        print(
            f"  {name}: 10,000 polling once a second under {GOALS['idle_cores']} core:"
            f" {cores:.3f} cores -> {_met(cores < GOALS['idle_cores'] if full else None)}"
        )
    events = r.get("events") or {}
    if "sqlite" in events:
        tp = events["sqlite"]["throughput"]
        best_n = max(tp, key=lambda n: tp[n]["ours"]["events_per_s"])
        best = tp[best_n]["ours"]["events_per_s"]
        print(
            f"  SQLite: >= {GOALS['sqlite_events_per_s']} events/s with watermarks: {best:.0f}/s"
            f" (best, at {best_n} watchers) -> {_met(best >= GOALS['sqlite_events_per_s'])}"
        )
    for kind, res in events.items():
        for rate, pair in res["latency"].items():
            p99, goal = pair["ours"]["p99_ms"], GOALS["p99_ms"][rate]
            complete = pair["ours"]["committed"] == pair["ours"]["scheduled"]
            print(
                f"  {_NAMES[kind]}: p99 event-to-commit <= {goal} ms at {rate}/s: {p99:.2f} ms"
                f"{'' if complete else ' (NOT all scheduled events committed)'}"
                f" -> {_met(p99 <= goal and complete)}"
            )


def report(r: dict[str, Any]) -> None:
    print(
        f"\nwatchkeeper triggerer benchmark  (cpus={r['cpus']}, python {r['python']}, "
        f"load at start {r['load_start']}, at end {r['load_end']}, quick={r['quick']})"
    )
    _idle(r)
    _events(r)
    _goals(r)
    print()
    print(AIRFLOW_33)
