"""A run's tries and their logs on the page, in a real browser (Playwright's async API driving
Debian's chromium): beside the selected run, one row per try and one block of output per
try, followed while the run runs; log text holding markup or a script shows as text and never
runs; the blocks are reachable from the keyboard.

The daemon and its API are those of :mod:`tests.support.browser`: one watcher on ``orders``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from watchkeeper.store.protocols import TaskRun, TaskSpec

from tests.support.browser import Site, open_site, screenshot, signed_in
from tests.triggerer.test_api_page_views import MARKUP, events_of

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCRIPT = "<script>window.__xss=2</script>"
"""A log line that would run if the page put it in as HTML."""


@pytest.fixture
async def site(tmp_path: Path, watchers: Path) -> AsyncIterator[Site]:
    async with open_site(tmp_path, watchers) as one:
        yield one


@pytest.fixture
async def page(chromium: Path, site: Site) -> AsyncIterator[Any]:
    viewport = {"width": 1200, "height": 800}
    async with signed_in(chromium, site.base, site.token, viewport=viewport) as tab:
        yield tab


async def claimed_run(site: Site) -> TaskRun:
    """A run of the task ``load`` (two tries at most) on the site's events, claimed."""
    backend = site.backend
    await events_of(site, site.asset, 2)
    oldest = (await backend.events.alist_events(asset=site.asset))[0].id
    await backend.tasks.async_tasks([TaskSpec("load", (site.asset,), max_tries=2)])
    await backend.tasks.arewind_task("load", site.asset, oldest)
    assert await backend.tasks.acreate_run("load") is not None
    (claimed,) = await backend.tasks.aclaim_runs("w1", limit=1, ttl=30, tasks=["load"])
    return claimed


async def log_text(page: Any, try_number: int) -> str:
    text: str = await page.inner_text(f'#run-logs section[data-try="{try_number}"] pre.log')
    return text


class TestRunLogs:
    async def test_tries_and_logs_beside_the_run_followed_while_it_runs(
        self, page: Any, site: Site
    ) -> None:
        """A run whose first try failed and whose second runs shows both tries (cause,
        duration, error) and each try's output apart; a line its running try writes
        appears without a reload, and the run's end shows too."""
        backend = site.backend
        run = await claimed_run(site)
        await backend.logs.aappend(run.id, 1, [("stdout", "loading\n"), ("stderr", "oops\n")])
        await backend.tasks.afinish_run(
            run.id, "w1", run.lease_token, success=False, error="ValueError: bad row"
        )
        (again,) = await backend.tasks.aclaim_runs("w1", limit=1, ttl=30, tasks=["load"])
        await backend.logs.aappend(run.id, 2, [("log", "INFO second try\n")])
        await page.goto(site.base + f"/#/tasks/load/runs/{run.id}")
        await page.wait_for_selector('#run-logs section[data-try="2"] span')
        tries = await page.eval_on_selector_all(
            "#run-tries tbody tr",
            "rows => rows.map(r => [...r.cells].map(c => c.textContent))",
        )
        assert [row[0] for row in tries] == ["1", "2"]
        assert tries[0][1] == "task_error" and tries[0][3] == "ValueError: bad row"
        assert tries[1][1] == "running" and tries[1][2] != "-" and tries[1][3] == "-"
        assert await log_text(page, 1) == "loading\noops\n"
        assert await page.get_attribute("#run-logs span.stream-stderr", "data-seq")
        assert await log_text(page, 2) == "INFO second try\n"
        await backend.logs.aappend(run.id, 2, [("stdout", "row 1 of 1\n")])
        await page.wait_for_selector('#run-logs section[data-try="2"] span:has-text("row 1")')
        assert await log_text(page, 2) == "INFO second try\nrow 1 of 1\n"
        await backend.tasks.afinish_run(run.id, "w1", again.lease_token, success=True)
        await page.wait_for_selector('#run-tries tr[data-try="2"] td.cause:has-text("success")')
        assert await log_text(page, 2) == "INFO second try\nrow 1 of 1\n"  # each chunk once
        await screenshot(page, "run-logs")

    async def test_markup_in_logs_is_text(self, page: Any, site: Site) -> None:
        """Log lines holding a script or an element with a handler show as text: no element
        is made from them and nothing runs."""
        backend = site.backend
        run = await claimed_run(site)
        await backend.logs.aappend(
            run.id, 1, [("stdout", SCRIPT + "\n"), ("stderr", MARKUP + "\n"), ("log", "&amp;")]
        )
        await page.goto(site.base + f"/#/tasks/load/runs/{run.id}")
        await page.wait_for_selector("#run-logs span.stream-log")
        found = await page.evaluate(
            "() => ({xss: window.__xss, imgs: document.querySelectorAll('img').length,"
            " scripts: document.querySelectorAll('main script').length,"
            " handlers: document.querySelectorAll('[onerror]').length})"
        )
        assert found == {"xss": None, "imgs": 0, "scripts": 0, "handlers": 0}
        assert await log_text(page, 1) == f"{SCRIPT}\n{MARKUP}\n&amp;"

    async def test_a_tries_logs_are_reached_from_the_keyboard(self, page: Any, site: Site) -> None:
        """Each try's block takes the focus with Tab and is named for its try; it follows
        the newest line, and the keys scroll it back."""
        run = await claimed_run(site)
        lines = [("stdout", f"line {n}\n") for n in range(200)]
        await site.backend.logs.aappend(run.id, 1, lines)
        await page.goto(site.base + f"/#/tasks/load/runs/{run.id}")
        await page.wait_for_selector('#run-logs span:has-text("line 199")')
        await page.focus(f'#runs tr[data-run="{run.id}"] a')
        name = None
        for _ in range(60):
            await page.keyboard.press("Tab")
            name = await page.evaluate("() => document.activeElement.getAttribute('aria-label')")
            if name == "Logs of try 1":
                break
        assert name == "Logs of try 1"
        at_end = "p => p.scrollTop > 0 && p.scrollTop + p.clientHeight >= p.scrollHeight - 4"
        assert await page.eval_on_selector("#run-logs pre.log", at_end)  # kept at the end
        await page.keyboard.press("Home")  # scrolled smoothly: waited for, within the timeout
        await page.wait_for_function(
            "() => document.querySelector('#run-logs pre.log').scrollTop === 0"
        )
