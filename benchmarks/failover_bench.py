"""Failover benchmark: daemons on PostgreSQL, each its own host, with many cheap watchers.

Not a test. Run by hand from the repository root (as root, for ``unshare``):

    python3 -m uv run python benchmarks/failover_bench.py [--quick] [--watchers N] [--kills K]

Three ``watchkeeper triggerer`` processes share one fresh PostgreSQL database, each in its own
UTS namespace with its own host name (``unshare -u sh -c 'hostname hostX; exec ...'``; when
``unshare`` is refused the daemons run with distinct identities on this host's name, and the
report says so). They start together. Each watcher commits an event as soon as it starts and
then every ``--period`` seconds (30; 2 with ``--quick``), with ``state={"n": n}``; its payload
names the process that wrote it.
Default settings (node lease renewed every 1 s, time to live 3 s), ``capacity`` raised to
hold every watcher.

1. **SIGKILL**, ``--kills`` times: kill one daemon, measure the time until every watcher it
   held has committed again on a survivor (its first event after the kill); then start a new
   daemon on the same host and wait for the balance to be restored. p50/max over the kills.
2. **SIGSTOP** one daemon past its node lease (ttl + 3 s), then SIGCONT it: the writes it
   attempts after resuming (``lease_lost``) must all be refused and none of its events may
   land after its lease lapsed.
3. **SIGTERM** one daemon: the time until every watcher it held has committed elsewhere (the
   clean handoff: its leases are released and the others notified).

After each step: the leases per daemon (balance). At the end: events duplicated (the same
watcher and ``n`` twice), which must be 0. Baseline, same run: the cold start of the same
share of watchers by a daemon joining (the floor a takeover cannot beat, besides the ttl);
the report gives failover / (ttl + that cold start).

``--hog N`` runs N busy-looping processes beside the daemons for the whole run (artificial
load: the daemons then compete for the cores). The report counts, over every daemon's log,
the node leases lost (``node_lease_lapsed``: a daemon stopped its watchers at its deadline;
``node_lease_reaped``: it found its node lease reaped) and the longest ``loop_blocked``.

Writes JSON to benchmarks/results/failover.json (with the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

PG_DSN = os.environ.get("WATCHKEEPER_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
TTL = 3.0
RESULTS = Path(__file__).parent / "results" / "failover.json"

WATCHER = '''
"""A cheap watcher: an event now, then one every PERIOD seconds, n as its watermark."""

import os
import socket

import anyio

from watchkeeper.triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent

PERIOD = {period!r}
HOST = f"{{socket.gethostname()}}:{{os.getpid()}}"


class Tick(BaseEventTrigger):
    def __init__(self, phase=0.0):
        super().__init__()
        self.phase = phase

    def serialize(self):
        return (self.classpath(), {{"phase": self.phase}})

    async def run(self):
        n = await self.asset_state_store.aget("n", default=0)
        while True:
            n += 1
            yield TriggerEvent({{"n": n, "by": HOST}}, state={{"n": n}})
            await anyio.sleep(PERIOD)


for _i in range({count}):
    globals()[f"a{{_i}}"] = Asset(
        f"a{{_i}}", watchers=[AssetWatcher(f"w{{_i}}", Tick(_i % 97 / 97))]
    )
'''


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-u", "sh", "-c", "hostname wk-probe && hostname"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.returncode == 0 and probe.stdout.strip() == "wk-probe"


class Node:
    """One daemon process: its host name, log file, pid and owner identity."""

    def __init__(self, host: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.host, self.process, self.log = host, process, log
        self.owner = ""

    def events(self, name: str) -> list[dict[str, Any]]:
        return log_events(self.log, name)


def log_events(log: Path, name: str) -> list[dict[str, Any]]:
    """The JSON log lines of event ``name`` in a daemon's log file."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("event") == name:
            found.append(entry)
    return found


class Bench:
    def __init__(self, args: argparse.Namespace, dsn: str, work: Path, namespaces: bool) -> None:
        self.args, self.dsn, self.work, self.namespaces = args, dsn, work, namespaces
        self.nodes: dict[str, Node] = {}
        self.started = 0
        self.conn: asyncpg.Connection | None = None
        self.result: dict[str, Any] = {}
        self.unbalanced: list[dict[str, Any]] = []

    @property
    def db(self) -> asyncpg.Connection:
        assert self.conn is not None
        return self.conn

    def start(self, host: str) -> Node:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHKEEPER__")}
        env.update(
            WATCHKEEPER__DATABASE__URL=self.dsn,
            WATCHKEEPER__TRIGGERER__CAPACITY=str(self.args.watchers),
            WATCHKEEPER__TRIGGERER__GC_INTERVAL="0",
            WATCHKEEPER__TRIGGERER__STOP_GRACE="5",
            WATCHKEEPER__LOGGING__FORMAT="json",
            WATCHKEEPER__LOGGING__LEVEL="INFO",
        )
        script = Path(sys.executable).with_name("watchkeeper")
        command = [str(script), "triggerer", "--watchers-path", str(self.work / "watchers")]
        if self.namespaces:
            quoted = " ".join(f"'{c}'" for c in command)
            command = ["unshare", "-u", "sh", "-c", f"hostname {host}; exec {quoted}"]
        self.started += 1
        log = self.work / f"{host}-{self.started}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env, cwd=self.work
            )
        node = Node(host, process, log)
        self.nodes[host] = node
        return node

    async def wait_started(self, node: Node, limit: float = 300) -> None:
        deadline = time.monotonic() + limit
        while not node.events("daemon_started"):
            if node.process.poll() is not None:
                raise RuntimeError(f"{node.host} exited: {node.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node.host} did not start")
            await asyncio.sleep(0.2)
        node.owner = node.events("daemon_started")[0]["owner"]

    async def holders(self) -> dict[str, int]:
        rows = await self.db.fetch(
            "SELECT l.owner, count(*) FROM trigger_leases l JOIN trigger_nodes n "
            "ON n.owner = l.owner AND n.alive GROUP BY l.owner"
        )
        return {r[0]: r[1] for r in rows}

    async def balance(self) -> dict[str, Any]:
        by_owner = await self.holders()
        hosts = {n.owner: h for h, n in self.nodes.items() if n.process.poll() is None}
        counts = {hosts.get(o, o): c for o, c in by_owner.items()}
        spread = max(counts.values()) - min(counts.values()) if counts else 0
        return {"leases": counts, "spread": spread, "total": sum(counts.values())}

    async def wait_balanced(self, live: int) -> float:
        """Seconds until ``live`` daemons hold every watcher, within one of each other; at
        most ``--balance-limit`` seconds (then noted in ``self.unbalanced`` and returned)."""
        t0 = time.monotonic()
        want, limit = self.args.watchers, self.args.balance_limit
        while time.monotonic() - t0 < limit:
            by_owner = await self.holders()
            counts = list(by_owner.values())
            if len(counts) == live and sum(counts) == want and max(counts) - min(counts) <= 1:
                return time.monotonic() - t0
            await asyncio.sleep(0.25)
        balance = await self.balance()
        self.unbalanced.append(balance)
        print("not balanced", json.dumps(balance), flush=True)
        return float(limit)

    async def held_by(self, owner: str) -> list[str]:
        rows = await self.db.fetch("SELECT trigger_id FROM trigger_leases WHERE owner = $1", owner)
        return [r[0] for r in rows]

    async def watchers_of(self, node: Node) -> list[str]:
        """The watchers ``node`` runs: those whose latest event it wrote (each commits as
        soon as it starts, and the benchmark waits for the balance first)."""
        rows = await self.db.fetch(
            "SELECT watcher FROM (SELECT DISTINCT ON (watcher) watcher, payload::jsonb ->> 'by' "
            "AS by FROM asset_events ORDER BY watcher, id DESC) AS latest WHERE by = $1",
            f"{node.host if self.namespaces else socket.gethostname()}:{node.process.pid}",
        )
        return [r[0] for r in rows]

    async def resumed(self, watchers: list[str], since: datetime, limit: float = 120) -> float:
        """Seconds from ``since`` until each of ``watchers`` committed an event after it (the
        latest of their first events after ``since``)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            row = await self.db.fetchrow(
                "SELECT count(*), max(first) FROM (SELECT min(created_at) AS first "
                "FROM asset_events WHERE created_at > $1 AND watcher = ANY($2::text[]) "
                "GROUP BY watcher) AS f",
                since,
                watchers,
            )
            assert row is not None
            if row[0] == len(watchers):
                return float((row[1] - since).total_seconds())
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{len(watchers)} watchers did not all resume within {limit} s")

    def steps_since(self, at: datetime, nodes: list[Node]) -> dict[str, float | None]:
        """When the survivors (from their logs) first and last claimed a lease and last
        started a trigger after ``at``, in seconds after it."""
        found: dict[str, list[float]] = {
            "lease_acquired": [],
            "leases_acquired": [],
            "trigger_started": [],
        }
        for node in nodes:
            for name, times in found.items():
                for entry in node.events(name):
                    t = datetime.fromisoformat(entry["timestamp"])
                    if t > at:
                        times.append((t - at).total_seconds())
        claims = found["lease_acquired"] + found["leases_acquired"]
        starts = found["trigger_started"]
        return {
            "first_claim": round(min(claims), 3) if claims else None,
            "last_claim": round(max(claims), 3) if claims else None,
            "last_start": round(max(starts), 3) if starts else None,
        }

    async def kill_cycle(self, host: str) -> dict[str, Any]:
        node = self.nodes[host]
        await asyncio.sleep(self.args.period + 1)  # every watcher committed where it runs now
        held = await self.held_by(node.owner)
        watchers = await self.watchers_of(node)
        at = datetime.now(UTC)
        node.process.send_signal(signal.SIGKILL)
        node.process.wait()
        took = await self.resumed(watchers, at)
        steps = self.steps_since(at, [n for h, n in self.nodes.items() if h != host])
        after_kill = await self.balance()
        fresh = self.start(host)
        t_join = time.monotonic()
        await self.wait_started(fresh)
        rebalance = await self.wait_balanced(3)
        return {
            "host": host,
            "leases": len(held),
            "watchers": len(watchers),
            "failover_s": round(took, 3),
            "steps_s": steps,
            "balance_after_kill": after_kill,
            "join_start_s": round(time.monotonic() - t_join - rebalance, 3),
            "join_rebalance_s": round(rebalance, 3),
            "balance_after_join": await self.balance(),
        }

    async def stop_cycle(self, host: str) -> dict[str, Any]:
        node = self.nodes[host]
        pid = node.process.pid
        held = await self.held_by(node.owner)
        stopped_at = datetime.now(UTC)
        node.process.send_signal(signal.SIGSTOP)
        await asyncio.sleep(TTL + 3)
        taken = len(await self.held_by(node.owner))
        resumed_at = datetime.now(UTC)
        node.process.send_signal(signal.SIGCONT)
        await asyncio.sleep(5)
        lost = node.events("lease_lost")
        lapsed = node.events("node_lease_lapsed")
        rejoined = [
            datetime.fromisoformat(e["timestamp"])
            for e in node.events("lease_acquired") + node.events("leases_acquired")
            if datetime.fromisoformat(e["timestamp"]) > resumed_at
        ]
        rejoin_at = min(rejoined) if rejoined else datetime.now(UTC)
        # Events the zombie got in between its stop and its first claim after resuming (any
        # would be a write under its old, lapsed leases): must be none.
        accepted = await self.db.fetchval(
            "SELECT count(*) FROM asset_events WHERE payload::jsonb ->> 'by' LIKE $1 "
            "AND created_at > $2 AND created_at < $3",
            f"%:{pid}",
            stopped_at,
            rejoin_at,
        )
        await self.wait_balanced(3)
        return {
            "host": host,
            "held_before": len(held),
            "held_while_stopped": taken,
            "writes_refused": len(lost),
            "watchers_refused": len({e.get("trigger_id") for e in lost}),
            "writes_accepted_before_rejoin": accepted,
            "rejoined_after_resume_s": round((rejoin_at - resumed_at).total_seconds(), 3),
            "stopped_by_deadline": sum(e.get("stopped", 0) for e in lapsed),
            "resumed_at": resumed_at.isoformat(),
            "balance_after": await self.balance(),
        }

    async def term_cycle(self, host: str) -> dict[str, Any]:
        node = self.nodes[host]
        await asyncio.sleep(self.args.period + 1)
        held = await self.held_by(node.owner)
        watchers = await self.watchers_of(node)
        at = datetime.now(UTC)
        node.process.send_signal(signal.SIGTERM)
        took = await self.resumed(watchers, at)
        code = node.process.wait()
        return {
            "host": host,
            "leases": len(held),
            "watchers": len(watchers),
            "handoff_s": round(took, 3),
            "exit_code": code,
            "balance_after": await self.balance(),
        }

    def churn(self) -> dict[str, Any]:
        """Node leases lost by the daemons (their own logs), and the loop's longest stall."""
        lapsed = reaped = 0
        stalls: list[float] = []
        for log in self.work.glob("*.log"):
            lapsed += len(log_events(log, "node_lease_lapsed"))
            reaped += len(log_events(log, "node_lease_reaped"))
            stalls += [float(e.get("blocked_for", 0)) for e in log_events(log, "loop_blocked")]
        return {
            "node_lease_lapsed": lapsed,
            "node_lease_reaped": reaped,
            "loop_blocked": len(stalls),
            "loop_blocked_max_s": round(max(stalls), 3) if stalls else 0.0,
        }

    async def duplicates(self) -> int:
        return int(
            await self.db.fetchval(
                "SELECT count(*) - count(DISTINCT (watcher, payload::jsonb ->> 'n')) "
                "FROM asset_events"
            )
        )

    async def run(self) -> dict[str, Any]:
        args = self.args
        (self.work / "watchers").mkdir()
        (self.work / "watchers" / "ticks.py").write_text(
            textwrap.dedent(WATCHER.format(period=args.period, count=args.watchers))
        )
        self.conn = await asyncpg.connect(self.dsn)
        hosts = ["hostA", "hostB", "hostC"]
        t0 = time.monotonic()
        # All three at once, so that no daemon starts every watcher before the others join.
        for node in [self.start(host) for host in hosts]:
            await self.wait_started(node)
        cold = time.monotonic() - t0
        settle = await self.wait_balanced(3)
        self.result["start"] = {
            "three_daemons_started_s": round(cold, 3),
            "settle_three_s": round(time.monotonic() - t0, 3),
            "last_rebalance_s": round(settle, 3),
            "balance": await self.balance(),
            "load": load(),
        }
        print("started", json.dumps(self.result["start"]), flush=True)
        kills = []
        for i in range(args.kills):
            cycle = await self.kill_cycle(hosts[i % 3])
            cycle["load"] = load()
            print("kill", json.dumps(cycle), flush=True)
            kills.append(cycle)
        self.result["kills"] = kills
        took = [k["failover_s"] for k in kills]
        joins = [k["join_start_s"] + k["join_rebalance_s"] for k in kills]
        self.result["failover"] = {
            "p50_s": round(statistics.median(took), 3),
            "max_s": round(max(took), 3),
            "baseline_cold_join_p50_s": round(statistics.median(joins), 3),
            "ratio_p50_to_ttl_plus_cold_join": round(
                statistics.median(took) / (TTL + statistics.median(joins)), 3
            ),
        }
        stop = await self.stop_cycle(hosts[0])
        stop["load"] = load()
        print("stop", json.dumps(stop), flush=True)
        self.result["sigstop"] = stop
        term = await self.term_cycle(hosts[1])
        term["load"] = load()
        print("term", json.dumps(term), flush=True)
        self.result["sigterm"] = term
        await asyncio.sleep(2)
        self.result["duplicated_events"] = await self.duplicates()
        self.result["churn"] = self.churn()
        self.result["not_balanced_within_limit"] = self.unbalanced
        self.result["events"] = await self.db.fetchval("SELECT count(*) FROM asset_events")
        return self.result

    async def close(self) -> None:
        for node in self.nodes.values():
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)
                node.process.kill()
                node.process.wait()
        if self.conn is not None:
            await self.conn.close()


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that busy-loop until killed: artificial load on the cores."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 watchers, 2 kills")
    parser.add_argument("--watchers", type=int, default=None)
    parser.add_argument("--kills", type=int, default=None)
    parser.add_argument("--period", type=float, default=None, help="seconds between events")
    parser.add_argument("--hog", type=int, default=0, help="busy-looping processes beside")
    parser.add_argument(
        "--balance-limit", type=float, default=300, help="seconds to wait for the balance"
    )
    args = parser.parse_args()
    args.watchers = args.watchers or (1000 if args.quick else 10_000)
    args.kills = args.kills or (2 if args.quick else 5)
    args.period = args.period or (2.0 if args.quick else 30.0)
    namespaces = unshare_works()
    name = f"wk_failover_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(PG_DSN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = PG_DSN.rpartition("/")
    dsn = f"{base}/{name}"
    work = Path(tempfile.mkdtemp(prefix="wk-failover-"))
    bench = Bench(args, dsn, work, namespaces)
    started = time.time()
    hogs = start_hogs(args.hog)
    try:
        result = await bench.run()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        print("churn", json.dumps(bench.churn()), flush=True)
        await bench.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    result = {
        "watchers": args.watchers,
        "daemons": 3,
        "period_s": args.period,
        "hogs": args.hog,
        "ttl_s": TTL,
        "hosts": "own UTS namespace each (unshare -u)" if namespaces else "one host name",
        "this_host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "load_end": load(),
        "seconds": round(time.time() - started, 1),
        **result,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    keys = ("failover", "duplicated_events", "churn", "load_end")
    print(json.dumps({k: result[k] for k in keys}))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
