"""The web page in a real browser: Debian's chromium driven by Playwright's async API, signed in
to a daemon that runs in the test's process with one watcher and serves its API on a free port.

The daemon's watcher emits each line of a text file (``LinesWatcher``, see
:mod:`tests.support.daemons`); :func:`open_site` starts it, :func:`signed_in` opens a page past
the sign-in form. Playwright is imported only inside, so modules that import this one load
without it.
"""

from __future__ import annotations

import functools
import os
import textwrap
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from pydantic import SecretStr
from watchkeeper.store import SqliteStateBackend
from watchkeeper.store.settings import DatabaseSettings
from watchkeeper.triggerer import Settings, TriggererSettings
from watchkeeper.triggerer.api import api_context, make_token, serve_app
from watchkeeper.triggerer.daemon import Daemon
from watchkeeper.triggerer.daemon._watcher_files import unload_watchers
from watchkeeper.triggerer.settings import ApiSettings

from tests.support.daemons import append_lines
from tests.support.requires import unavailable

__all__ = [
    "CHROMIUM",
    "TIMEOUT_MS",
    "Site",
    "chromium_path",
    "launched",
    "new_tab",
    "open_site",
    "screenshot",
    "signed_in",
]

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 15_000
"""How long a page step may take (a loaded machine renders slowly)."""


def chromium_path() -> Path:
    """Debian's chromium; missing, the test skips (and fails under CI=true)."""
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    return CHROMIUM


@dataclass
class Site:
    """A daemon serving the API: where, with which tokens, and its one watcher's source."""

    base: str
    token: str
    """A token with the ``scopes`` :func:`open_site` was given."""
    reader: str
    """A token with the read scope only."""
    source: Path
    backend: SqliteStateBackend
    asset: str
    watcher: str


def _definitions(asset: str, watcher: str, source: Path) -> str:
    return textwrap.dedent(
        f"""
        from watchkeeper.triggerer import Asset, AssetWatcher
        from lines import LinesWatcher

        feed = Asset({asset!r}, watchers=[AssetWatcher({watcher!r}, LinesWatcher({str(source)!r}))])
        """
    )


@asynccontextmanager
async def open_site(
    tmp_path: Path,
    watchers: Path,
    asset: str = "orders",
    watcher: str = "orders_feed",
    *,
    scopes: Iterable[str] = ("read", "operate"),
    api: ApiSettings | None = None,
) -> AsyncIterator[Site]:
    """A daemon on ``tmp_path/state.db`` with the watcher ``watcher`` on ``asset`` (lines 1
    and 2 of its source written already), and its API (``api``, on a free port)."""
    source = tmp_path / "lines.txt"
    append_lines(source, 1, 2)
    (watchers / "feed.py").write_text(_definitions(asset, watcher, source))
    settings = Settings(
        database=DatabaseSettings(url=SecretStr(f"sqlite:///{tmp_path / 'state.db'}")),
        triggerer=TriggererSettings(watchers_path=watchers, gc_interval=0, stop_grace=2),
    )
    try:
        async with Daemon(settings) as daemon, anyio.create_task_group() as tg:
            backend = daemon.backend
            assert isinstance(backend, SqliteStateBackend)
            text, row = make_token("ops", list(scopes), now=datetime.now(UTC))
            await backend.controls.acreate_token(row)
            reader, row = make_token("viewer", ["read"], now=datetime.now(UTC))
            await backend.controls.acreate_token(row)
            ctx = api_context(backend, api or ApiSettings(port=0), daemon=daemon)
            port = await tg.start(functools.partial(serve_app, ctx, host="127.0.0.1", port=0))
            yield Site(f"http://127.0.0.1:{port}", text, reader, source, backend, asset, watcher)
            tg.cancel_scope.cancel()
    finally:
        unload_watchers()


@asynccontextmanager
async def launched(chromium: Path) -> AsyncIterator[Any]:
    """A fresh headless chromium (Playwright's ``Browser``), closed at exit."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser
        finally:
            await browser.close()


async def new_tab(browser: Any, **context: Any) -> Any:
    """A page of a new browser context (``context``: its options), steps bounded by
    :data:`TIMEOUT_MS`."""
    tab = await (await browser.new_context(**context)).new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    return tab


@asynccontextmanager
async def signed_in(chromium: Path, base: str, token: str, **context: Any) -> AsyncIterator[Any]:
    """A page of a fresh browser (``context``: its context's options), signed in at ``base``
    with ``token``, on the watchers view."""
    async with launched(chromium) as browser:
        tab = await new_tab(browser, **context)
        await tab.goto(base + "/")
        await tab.fill("#token", token)
        await tab.click("#login-button")
        await tab.wait_for_selector("#watchers-view:not([hidden])")
        yield tab


async def screenshot(page: Any, name: str) -> None:
    """Save the page as ``<name>.png`` under ``$WATCHKEEPER_SCREENSHOTS``, when it is set."""
    directory = os.environ.get("WATCHKEEPER_SCREENSHOTS")
    if directory:
        await page.screenshot(path=str(Path(directory) / f"{name}.png"), full_page=True)
