"""Ready-made watchers benchmark: what building, serializing and rebuilding one costs.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/watchers_bench.py [--count 10000] [--runs 5]

A daemon builds each watcher of its definition files (in the reading process), serializes it
(its identity) and rebuilds it from that serialization (in the daemon): for each ready-made
watcher this times ``cls(**kwargs)``, ``serialize()`` and ``cls(**serialized)`` over
``--count`` watchers, the best of ``--runs``. The baseline, in the same run, is what any trigger
costs there whatever its class: its kwargs encoded to JSON and decoded back. Writes
``benchmarks/results/watchers.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchkeeper.watchers import (
    DirectoryWatcher,
    HttpPollWatcher,
    MqttWatcher,
    NatsJetStreamWatcher,
    RabbitMQWatcher,
    RedisStreamWatcher,
    SqlTableWatcher,
)

CASES: list[tuple[type[Any], Callable[[int], dict[str, Any]]]] = [
    (DirectoryWatcher, lambda i: {"path": f"/data/{i}", "pattern": "*.csv", "lag_window": 30}),
    (
        SqlTableWatcher,
        lambda i: {
            "dsn": "postgresql://db/wk",
            "table": f"t{i}",
            "cursor_column": "seq",
            "key_column": "id",
            "lag_window": 10,
        },
    ),
    (HttpPollWatcher, lambda i: {"url": f"https://h/{i}", "items": "items", "cursor": "next"}),
    (RedisStreamWatcher, lambda i: {"stream": f"s{i}", "batch_size": 50}),
    (NatsJetStreamWatcher, lambda i: {"stream": f"S{i}", "ack_wait": 2.0}),
    (RabbitMQWatcher, lambda i: {"queue": f"q{i}", "prefetch": 10}),
    (MqttWatcher, lambda i: {"topics": [f"t/{i}/#"], "dedup_field": "id"}),
]


def _best(runs: int, step: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


def _measure(
    cls: type[Any], make: Callable[[int], dict[str, Any]], count: int, runs: int
) -> dict[str, float]:
    """µs per watcher to build, serialize and rebuild ``count`` watchers, and the baseline's."""
    kwargs = [make(i) for i in range(count)]
    built = [cls(**k) for k in kwargs]
    serialized = [w.serialize()[1] for w in built]
    seconds = {
        "build": _best(runs, lambda: [cls(**k) for k in kwargs]),
        "serialize": _best(runs, lambda: [w.serialize() for w in built]),
        "rebuild": _best(runs, lambda: [cls(**s) for s in serialized]),
        "baseline": _best(runs, lambda: [json.loads(json.dumps(k)) for k in serialized]),
    }
    return {name: value / count * 1e6 for name, value in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    count, runs = options.count, options.runs
    results: dict[str, dict[str, float]] = {}
    print(f"{'watcher':22} {'build µs':>9} {'serialize':>9} {'rebuild':>9} {'baseline':>9} ratio")
    for cls, make in CASES:
        per = _measure(cls, make, count, runs)
        ratio = (per["build"] + per["serialize"] + per["rebuild"]) / per["baseline"]
        results[cls.__name__] = {**per, "ratio": ratio}
        print(
            f"{cls.__name__:22} {per['build']:9.2f} {per['serialize']:9.2f} "
            f"{per['rebuild']:9.2f} {per['baseline']:9.2f} {ratio:5.1f}x"
        )
    out = Path(__file__).parent / "results" / "watchers.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"count": count, "runs": runs, "results": results}, indent=2))


if __name__ == "__main__":
    main()
