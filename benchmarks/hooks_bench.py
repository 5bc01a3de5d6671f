"""Webhook benchmark: signed posts per second through ``POST /hooks/{asset}``, against a raw
ASGI handler that commits the same rows, in the same run.

Not a test (CI does not run it). Run by hand from the repository root:

    uv run python benchmarks/hooks_bench.py [--posts 3000] [--concurrency 16] [--rounds 3]

Each round serves, one after the other on a fresh store (uvicorn in this process, on
127.0.0.1), for each ``--store``: ``sqlite`` (a fresh file: each commit waits for the disk,
group commit shares it among the requests in flight) and ``memory`` (no disk: what the
HTTP side costs in CPU):

- ``api-github``: the API's route with a GitHub-style hook (``X-Hub-Signature-256``
  checked, ``X-GitHub-Delivery`` as the dedup key), as ``[api.hooks]`` configures it;
- ``api-token``: the same route with a ``push:asset`` bearer token (a token row read and its
  digest compared per request) and ``Idempotency-Key``;
- ``raw``: a bare ASGI callable under the same uvicorn (its h11 protocol, as the API's): it
  reads the body, checks the same HMAC with :func:`hmac.compare_digest`, decodes the JSON,
  builds the same payload and commits the same :class:`EventCommit` through the same store,
  then answers a small JSON body. No routing, middleware, auth choice, limits or error
  handling: the floor of any handler that commits the same rows through the store.

A client in a child process (so the server's loop is not the client's) posts ``--posts``
signed JSON bodies with ``--concurrency`` connections and reports posts/s (every answer must
be 200), and the server process's CPU time per post over the same span (every thread of
this process: the loop, uvicorn, the store's writer thread), the figure a loaded machine
disturbs least. Modes alternate within each round; the medians are reported with the ratios
to ``raw``. The client shares the machine's cores with the server: the figures are for the
pair, the ratio is what matters.

Writes ``benchmarks/results/hooks.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from _bench_measure import loadavg
from pydantic import SecretStr
from watchkeeper.store import Asset, BaseStateBackend, MemoryStateBackend, SqliteStateBackend
from watchkeeper.store.protocols import EventCommit, Writer, encode_payload
from watchkeeper.triggerer.api import api_context, make_token, serve_app
from watchkeeper.triggerer.settings import ApiSettings, HookSettings

RESULTS = Path(__file__).parent / "results"
SECRET = "bench-hook-secret"
ASSET = "pushes"

CLIENT = r"""
import asyncio, hashlib, hmac, json, sys, time
import httpx

base, mode, posts, concurrency, secret, token = sys.argv[1:7]
posts, concurrency = int(posts), int(concurrency)

def request(n):
    body = json.dumps({"n": n, "ref": "refs/heads/main", "commits": [{"id": "c%d" % n}]}).encode()
    headers = {"Content-Type": "application/json"}
    if mode == "api-token":
        headers["Authorization"] = "Bearer " + token
        headers["Idempotency-Key"] = "d-%d" % n
    else:
        headers["X-GitHub-Delivery"] = "d-%d" % n
        headers["X-GitHub-Event"] = "push"
        headers["X-Hub-Signature-256"] = "sha256=" + hmac.new(
            secret.encode(), body, hashlib.sha256).hexdigest()
    return body, headers

async def main():
    todo = list(range(posts))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        for n in range(concurrency):  # warm the connections
            body, headers = request(posts + n)
            r = await client.post("/hooks/pushes", content=body, headers=headers)
            assert r.status_code == 200, r.text
        async def worker():
            while todo:
                body, headers = request(todo.pop())
                r = await client.post("/hooks/pushes", content=body, headers=headers)
                assert r.status_code == 200, r.text
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        print(json.dumps({"seconds": time.perf_counter() - start}))

asyncio.run(main())
"""


def _raw_app(backend: BaseStateBackend) -> Callable[..., Awaitable[None]]:
    """The baseline: one ASGI callable doing the same check and commit, nothing else."""
    secret = SECRET.encode()
    writer = Writer("api", "webhook:github")

    async def app(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, headers["x-hub-signature-256"][7:]):
            raise RuntimeError("bad signature")
        delivery = headers["x-github-delivery"]
        payload = {
            "provider": "github",
            "delivery": delivery,
            "event": headers.get("x-github-event"),
            "body": json.loads(body),
        }
        text = encode_payload(payload, max_payload_bytes=backend.max_payload_bytes)
        events = await backend.events.acommit(
            EventCommit("webhook", (ASSET,), text, dedup_key=delivery, writer=writer)
        )
        answer = json.dumps(
            {
                "asset": ASSET,
                "delivery": delivery,
                "duplicate": not events,
                "event_id": events[0].id,
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


class _Quiet(uvicorn.Server):
    """uvicorn without its signal handlers, telling when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


async def _serve_raw(backend: BaseStateBackend, *, task_status: anyio.abc.TaskStatus[int]) -> None:
    sock = socket.create_server(("127.0.0.1", 0), backlog=2048)
    config = uvicorn.Config(
        _raw_app(backend), log_config=None, access_log=False, lifespan="off", http="h11"
    )
    server = _Quiet(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await server.ready.wait()
        task_status.started(sock.getsockname()[1])
        try:
            await anyio.sleep_forever()
        finally:
            server.should_exit = True


async def _client(base: str, mode: str, posts: int, concurrency: int, token: str) -> float:
    args = [sys.executable, "-c", CLIENT, base, mode, str(posts), str(concurrency), SECRET, token]
    done = await anyio.run_process(args, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode()[-2000:])
    return float(json.loads(done.stdout)["seconds"])


async def _one(store: str, mode: str, work: Path, posts: int, concurrency: int) -> dict[str, Any]:
    path = work / f"{mode}-{time.monotonic_ns()}.db"
    opened: BaseStateBackend = (
        SqliteStateBackend(path) if store == "sqlite" else MemoryStateBackend()
    )
    async with opened as backend:
        await backend.events.aregister_assets([Asset(ASSET)])
        token = ""
        async with anyio.create_task_group() as tg:
            if mode == "raw":
                port = await tg.start(_serve_raw, backend)
            else:
                settings = ApiSettings(
                    port=0,
                    hooks={ASSET: HookSettings(provider="github", secret=SecretStr(SECRET))},
                )
                text, row = make_token("sender", [f"push:asset:{ASSET}"], now=datetime.now(UTC))
                await backend.controls.acreate_token(row)
                token = text
                ctx = api_context(backend, settings)
                serve = serve_app
                port = await tg.start(
                    lambda task_status: serve(
                        ctx, host="127.0.0.1", port=0, settings=settings, task_status=task_status
                    )
                )
            cpu = time.process_time()
            seconds = await _client(f"http://127.0.0.1:{port}", mode, posts, concurrency, token)
            cpu = time.process_time() - cpu
            tg.cancel_scope.cancel()
        committed = len(await backend.events.alist_events(asset=ASSET))
    path.unlink(missing_ok=True)
    expected = posts + concurrency
    if committed != expected:
        raise RuntimeError(f"{mode}: {committed} events committed, expected {expected}")
    return {
        "store": store,
        "mode": mode,
        "posts_per_s": posts / seconds,
        "server_cpu_us_per_post": 1e6 * cpu / posts,
        "load": loadavg(),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--posts", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=["sqlite", "memory"], action="append")
    parser.add_argument("--out", type=Path, default=RESULTS / "hooks.json")
    args = parser.parse_args()
    modes = ["raw", "api-github", "api-token"]
    stores = args.store or ["sqlite", "memory"]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = modes[r % 3 :] + modes[: r % 3]
            for store in stores:
                for mode in order:
                    run = await _one(store, mode, Path(tmp), args.posts, args.concurrency)
                    runs.append(run)
                    print(
                        f"round {r + 1} {store:<6} {mode:<11} {run['posts_per_s']:8.0f} "
                        f"posts/s {run['server_cpu_us_per_post']:7.0f} µs server CPU/post  "
                        f"load {run['load']}",
                        flush=True,
                    )

    def median(store: str, mode: str, figure: str) -> float:
        return statistics.median(
            x[figure] for x in runs if x["mode"] == mode and x["store"] == store
        )

    medians = {f"{st}/{m}": median(st, m, "posts_per_s") for st in stores for m in modes}
    cpu = {f"{st}/{m}": median(st, m, "server_cpu_us_per_post") for st in stores for m in modes}
    print()
    for store in stores:
        for mode in modes:
            key, raw = f"{store}/{mode}", f"{store}/raw"
            print(
                f"{store:<6} {mode:<11} median {medians[key]:8.0f} posts/s "
                f"({medians[key] / medians[raw]:.2f}x raw), server CPU {cpu[key]:6.0f} µs/post "
                f"({cpu[key] / cpu[raw]:.2f}x raw)"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "runs": runs,
                "medians": medians,
                "cpu_us_per_post": cpu,
                "args": vars(args) | {"out": str(args.out)},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
