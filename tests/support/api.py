"""A real API server (uvicorn on a free port) over a test's backend, with a token per name:
what the API tests share, so each keeps only the data it needs."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

import anyio
import httpx
from watchkeeper.store import AssetEvent, BaseStateBackend, MemoryStateBackend
from watchkeeper.store.protocols import (
    EventCommit,
    encode_json,
)
from watchkeeper.triggerer import Settings, TriggerRunner
from watchkeeper.triggerer.api import ApiContext, api_context, make_token, serve_app
from watchkeeper.triggerer.daemon import Daemon
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers
from watchkeeper.triggerer.settings import ApiSettings

__all__ = ["ServedApi", "daemon_api", "serve_api"]

B = TypeVar("B", bound=BaseStateBackend)


@dataclass
class ServedApi(Generic[B]):
    """The backend, the API's context, its base URL and a token by name."""

    backend: B
    ctx: ApiContext
    base: str
    tokens: dict[str, str]

    def client(self, token: str | None = None) -> httpx.AsyncClient:
        """A client sending the named token (none: no ``Authorization`` header)."""
        headers = {} if token is None else {"Authorization": f"Bearer {self.tokens[token]}"}
        return httpx.AsyncClient(base_url=self.base, headers=headers, timeout=10)

    async def add_token(
        self, name: str, scopes: Sequence[str], expires_in: timedelta | None = None
    ) -> None:
        text, row = make_token(name, list(scopes), now=datetime.now(UTC), expires_in=expires_in)
        await self.backend.controls.acreate_token(row)
        self.tokens[name] = text

    async def commit(self, asset: str, n: int, watcher: str = "feed") -> list[AssetEvent]:
        """Commit the event ``{"n": n}`` to ``asset``."""
        commit = EventCommit(watcher, (asset,), encode_json({"n": n}))
        return await self.backend.events.acommit(commit)


@contextlib.asynccontextmanager
async def serve_api(
    backend: B,
    scopes: Mapping[str, Sequence[str]],
    settings: ApiSettings | None = None,
    runner: TriggerRunner | None = None,
) -> AsyncIterator[ServedApi[B]]:
    """Serve the API over the open ``backend`` with a token per name of ``scopes``; stopped on
    exit. With ``runner``, the API reports it as a daemon's API does."""
    settings = settings or ApiSettings(port=0)
    ctx = api_context(backend, settings, runner=runner)
    served: ServedApi[B] = ServedApi(backend, ctx, "", {})
    for name, granted in scopes.items():
        await served.add_token(name, granted)
    async with anyio.create_task_group() as tg:
        serve = functools.partial(serve_app, ctx, host="127.0.0.1", port=0, settings=settings)
        served.base = f"http://127.0.0.1:{await tg.start(serve)}"
        yield served
        tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def daemon_api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A daemon in this process on a memory store, its API on a free port (no token needed
    for the probes and ``/metrics``); yields a client of it. Its watchers are unloaded at
    exit."""
    try:
        async with (
            MemoryStateBackend() as backend,
            Daemon(settings, backend=backend) as daemon,
            anyio.create_task_group() as tg,
        ):
            ctx = api_context(backend, ApiSettings(port=0), daemon=daemon)
            port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                yield client
            tg.cancel_scope.cancel()
    finally:
        unload_watchers()
