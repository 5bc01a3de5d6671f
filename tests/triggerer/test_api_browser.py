"""The web page in a real browser: Playwright's async API driving Debian's chromium.

A daemon runs in this process on a SQLite file with one watcher that emits each line of a
text file; the API is served from it on a free port. The tests sign in, watch events arrive
live, pause and resume the watcher, edit its watermark with a stale version to see the
conflict, and see a task's runs, retry a failed one and pause the task. With ``WATCHKEEPER_SCREENSHOTS=DIR`` they also save the main views there (the
docs' pictures come from ``docs/screenshots``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from watchkeeper.store.protocols import EventBatchCommit, TaskSpec, encode_json
from watchkeeper.triggerer.api import make_token

from tests.support.browser import Site, launched, new_tab, open_site, screenshot, signed_in
from tests.support.daemons import append_lines, asset_file, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
async def site(tmp_path: Path, watchers: Path) -> AsyncIterator[Site]:
    """A daemon with the watcher ``orders_feed`` and its API on a free port."""
    scopes = ["read", "operate", "write:asset:orders"]
    async with open_site(tmp_path, watchers, scopes=scopes) as one:
        yield one


@pytest.fixture
async def page(chromium: Path, site: Site) -> AsyncIterator[Any]:
    """A signed-in page of a fresh browser."""
    viewport = {"width": 1200, "height": 700}
    async with signed_in(chromium, site.base, site.token, viewport=viewport) as tab:
        yield tab


def state_cell(name: str) -> str:
    return f'#watchers tr[data-watcher="{name}"] td.state'


class TestWebPage:
    async def test_a_wrong_token_is_refused_and_asked_again(
        self, chromium: Path, site: Site
    ) -> None:
        """A wrong token leaves the sign-in form up with an error; nothing is stored."""
        async with launched(chromium) as browser:
            tab = await new_tab(browser)
            await tab.goto(site.base + "/")
            await tab.fill("#token", "wk_0123456789abcdef_" + "x" * 43)
            await tab.click("#login-button")
            await tab.wait_for_selector("#login-error:has-text('unknown')")
            stored = await tab.evaluate("sessionStorage.getItem('watchkeeper.token')")
            assert stored is None

    async def test_events_arrive_live(self, page: Any, site: Site) -> None:
        """The live tail shows an event committed after the page opened the stream."""
        await page.wait_for_selector(state_cell("orders_feed") + ":has-text('running')")
        await screenshot(page, "watchers")
        await page.click("a[href='#/events']")
        await page.wait_for_selector("#tail-status:has-text('connected')")
        append_lines(site.source, 3, 3)
        item = await page.wait_for_selector("#tail li:has-text('line 3')")
        assert '"n":3' in (await item.text_content() or "")
        await screenshot(page, "events")

    async def test_pause_and_resume(self, page: Any, site: Site) -> None:
        """Pause stops the watcher: a line written while it is paused is not committed while
        a second, unpaused watcher of the same daemon commits three lines one after the
        other; resume starts it again and the line arrives."""
        backend = site.backend
        await page.wait_for_selector(state_cell("orders_feed") + ":has-text('running')")
        await page.click('#watchers tr[data-watcher="orders_feed"] button.pause')
        await page.wait_for_selector(state_cell("orders_feed") + ":has-text('paused')")
        before = len(await backend.events.alist_events(asset="orders"))
        append_lines(site.source, 3, 3)
        # The daemon's proof that time passed: a control watcher (picked up by the next
        # reload) commits three lines, each written once the one before was committed.
        control = site.source.with_name("control.txt")
        watchers = site.source.with_name("watchers")
        (watchers / "control.py").write_text(asset_file("control", control))
        for n in (1, 2, 3):
            append_lines(control, n, n)

            async def committed(n: int = n) -> bool:
                return len(await backend.events.alist_events(asset="control")) == n

            await wait_until(committed, f"the control watcher to commit line {n}")
        assert len(await backend.events.alist_events(asset="orders")) == before
        await page.click('#watchers tr[data-watcher="orders_feed"] button.resume')
        await page.wait_for_selector(state_cell("orders_feed") + ":has-text('running')")

        async def three() -> bool:
            return len(await backend.events.alist_events(asset="orders")) == 3

        await wait_until(three, "the resumed watcher to emit line 3")

    async def test_stale_edit_shows_the_conflict(self, page: Any, site: Site) -> None:
        """Saving the watermark with an old version shows the conflict and the current one;
        the right version then saves, recorded as written by the token."""
        await page.wait_for_selector(state_cell("orders_feed") + ":has-text('running')")
        await page.click('#watchers tr[data-watcher="orders_feed"] button.pause')
        await page.wait_for_selector(state_cell("orders_feed") + ":has-text('paused')")
        await page.goto(site.base + "/#/assets/orders")
        row = await page.wait_for_selector('#state tr[data-key="watermark"]')
        current = int(await page.text_content('#state tr[data-key="watermark"] td.version') or 0)
        await row.click()
        await page.fill("#edit-value", "1")
        await page.fill("#edit-version", str(current - 1))
        await page.click("#edit-save")
        conflict = await page.wait_for_selector("#edit-result.conflict")
        text = await conflict.text_content() or ""
        assert f"current version is {current}" in text
        await screenshot(page, "asset-conflict")
        await page.fill("#edit-version", str(current))
        await page.click("#edit-save")
        await page.wait_for_selector(f"#edit-result:has-text('version {current + 1}')")
        await page.wait_for_selector(
            f'#state tr[data-key="watermark"] td.version:text-is("{current + 1}")'
        )
        writer = await page.text_content('#state tr[data-key="watermark"] td.writer')
        assert writer == "api:ops"


@pytest.fixture
async def runs(site: Site) -> tuple[int, int]:
    """Task ``load`` on orders (one event a run): run one failed with ``boom``, run two is
    queued (no worker runs here). Returns (failed id, queued id)."""
    backend = site.backend

    async def two() -> bool:
        return len(await backend.events.alist_events(asset="orders")) == 2

    await wait_until(two, "the watcher to emit lines 1 and 2")
    oldest = (await backend.events.alist_events(asset="orders"))[0].id
    await backend.tasks.async_tasks([TaskSpec("load", ("orders",), max_events=1, max_tries=1)])
    await backend.tasks.arewind_task("load", "orders", oldest)  # a new task starts after the log
    first = await backend.tasks.acreate_run("load")
    assert first is not None
    (claimed,) = await backend.tasks.aclaim_runs("w1", limit=1, ttl=30)
    await backend.tasks.afinish_run(
        claimed.id, "w1", claimed.lease_token, success=False, error="boom"
    )
    second = await backend.tasks.acreate_run("load")
    assert second is not None
    return first.id, second.id


def run_row(run_id: int) -> str:
    return f'#runs tr[data-run="{run_id}"]'


class TestTasksView:
    async def test_runs_retry_and_pause(self, page: Any, site: Site, runs: tuple[int, int]) -> None:
        """The tasks list shows the schedule and pending events; a task's runs show state and
        try; a failed run shows its error and triggering event and is queued again by retry;
        pause and resume change the task in the store."""
        failed, queued = runs
        await page.click("a[href='#/tasks']")
        row = '#tasks tr[data-task="load"]'
        await page.wait_for_selector(f"{row} td.schedule:text-is('all of orders')")
        assert await page.text_content(f"{row} td.pending") == "orders: 0"
        assert await page.text_content(f"{row} td.paused") == "no"
        await screenshot(page, "tasks")
        await page.click(f"{row} a")
        await page.wait_for_selector(f"{run_row(failed)} td.state:text-is('failed')")
        assert await page.text_content(f"{run_row(queued)} td.state") == "queued"
        assert await page.text_content(f"{run_row(failed)} td.try") == "1 of 1"
        await page.click(f"{run_row(failed)} td.id")
        await page.wait_for_selector("#run-errors li:has-text('boom')")
        event = await page.wait_for_selector("#run-events li")
        assert "line 1" in (await event.text_content() or "")
        await screenshot(page, "task-runs")
        await page.click(f"{run_row(failed)} button.retry")
        await page.wait_for_selector(f"{run_row(failed)} td.state:text-is('queued')")
        retried = await site.backend.tasks.aget_run(failed)
        assert (retried.state, retried.max_tries) == ("queued", 2)

        summary = '#task-summary tr[data-task="load"]'
        await page.click(f"{summary} button.pause")
        await page.wait_for_selector(f"{summary} td.paused:text-is('yes')")
        assert {i.name: i.paused for i in await site.backend.tasks.alist_tasks()} == {"load": True}
        await page.click(f"{summary} button.resume")
        await page.wait_for_selector(f"{summary} td.paused:text-is('no')")
        assert {i.name: i.paused for i in await site.backend.tasks.alist_tasks()} == {"load": False}

    async def test_read_token_sees_disabled_controls(
        self, page: Any, site: Site, runs: tuple[int, int]
    ) -> None:
        """Signed in with a read-only token, the pause and retry buttons are disabled and the
        task and run are unchanged."""
        failed, _ = runs
        await page.evaluate("t => sessionStorage.setItem('watchkeeper.token', t)", site.reader)
        await page.goto(site.base + "/#/tasks/load")
        await page.wait_for_selector(f"{run_row(failed)} td.state:text-is('failed')")
        assert await page.is_disabled(f"{run_row(failed)} button.retry")
        assert await page.is_disabled('#task-summary tr[data-task="load"] button.pause')
        assert (await site.backend.tasks.aget_run(failed)).state == "failed"
        assert {i.name: i.paused for i in await site.backend.tasks.alist_tasks()} == {"load": False}


class TestAssetEvents:
    async def test_recent_events_are_the_newest(self, page: Any, site: Site) -> None:
        """With more than 1,000 events, an asset's "Recent events" lists its newest 20,
        newest first."""

        async def two() -> bool:
            return len(await site.backend.events.alist_events(asset="orders")) == 2

        await wait_until(two, "the watcher to emit lines 1 and 2")
        rows = tuple((encode_json({"bulk": n}), None) for n in range(1, 1101))
        await site.backend.events.acommit_batch(EventBatchCommit("bulk", ("orders",), rows))
        newest = await site.backend.events.alist_events(asset="orders", newest_first=True, limit=20)
        await page.goto(site.base + "/#/assets/orders")
        await page.wait_for_selector(f'#asset-events li:first-child[data-id="{newest[0].id}"]')
        shown = await page.eval_on_selector_all(
            "#asset-events li", "items => items.map(li => Number(li.dataset.id))"
        )
        assert shown == [e.id for e in newest]


class TestWatcherRates:
    async def test_events_per_minute_from_the_server_on_first_load(
        self, page: Any, site: Site
    ) -> None:
        """The events/min column states its window and shows the daemon's figure on the
        first load: 300 events committed in the last 5 minutes are 60.0/min."""

        async def two() -> bool:
            return len(await site.backend.events.alist_events(asset="orders")) == 2

        await wait_until(two, "the watcher to emit lines 1 and 2")
        append_lines(site.source, 3, 300)  # the daemon's own watcher commits them: it counts

        async def all_300() -> bool:
            return len(await site.backend.events.alist_events(asset="orders")) == 300

        await wait_until(all_300, "the watcher to emit lines 3 to 300")
        await page.reload()
        rate = '#watchers tr[data-watcher="orders_feed"] td.rate'
        first = await page.wait_for_selector(rate)
        assert (await first.text_content() or "-") != "-"
        await page.wait_for_selector(f"{rate}:text-is('60.0')")
        assert await page.text_content("#rate-header") == "events/min (last 5 min)"


async def sign_in_as(page: Any, site: Site, name: str, scopes: list[str]) -> None:
    """Replace the page's token with a new token ``name`` of these scopes."""
    text, row = make_token(name, scopes, now=datetime.now(UTC))
    await site.backend.controls.acreate_token(row)
    await page.evaluate("t => sessionStorage.setItem('watchkeeper.token', t)", text)


class TestScopedTokens:
    async def test_asset_views_show_a_403(self, page: Any, site: Site) -> None:
        """With an operate-only token the assets list and an asset's view say why they are
        empty instead of showing nothing."""
        await sign_in_as(page, site, "operator", ["operate"])
        await page.goto(site.base + "/#/assets")
        await page.wait_for_selector("#assets-message:has-text('may not read assets')")
        await page.goto(site.base + "/#/assets/orders")
        message = await page.wait_for_selector("#asset-message:has-text(\"read asset 'orders'\")")
        assert await message.is_visible()
        assert await page.is_hidden("#edit-form")

    async def test_live_tail_with_a_per_asset_token(self, page: Any, site: Site) -> None:
        """A token scoped to one asset follows that asset's live events (the stream with its
        asset filter); "every asset" is not offered."""
        await sign_in_as(page, site, "loader", ["write:asset:orders"])
        await page.goto(site.base + "/#/events")
        await page.wait_for_selector("#tail-status:text-is('connected')")
        options = await page.eval_on_selector_all(
            "#tail-asset option", "items => items.map(o => o.value)"
        )
        assert options == ["orders"]
        append_lines(site.source, 3, 3)
        await page.wait_for_selector("#tail li:has-text('line 3')")


class TestLayoutAndNames:
    async def test_a_run_opens_beside_a_long_list(self, page: Any, site: Site) -> None:
        """With 100 runs, a run's detail opens beside the list and in view, also for a run
        far down the list."""
        backend = site.backend

        async def two() -> bool:
            return len(await backend.events.alist_events(asset="orders")) == 2

        await wait_until(two, "the watcher to emit lines 1 and 2")
        rows = tuple((encode_json({"bulk": n}), None) for n in range(100))
        await backend.events.acommit_batch(EventBatchCommit("bulk", ("orders",), rows))
        oldest = (await backend.events.alist_events(asset="orders"))[0].id
        await backend.tasks.async_tasks([TaskSpec("load", ("orders",), max_events=1, max_tries=1)])
        await backend.tasks.arewind_task("load", "orders", oldest)
        ids = []
        for _ in range(100):
            run = await backend.tasks.acreate_run("load")
            assert run is not None
            ids.append(run.id)
        await page.goto(site.base + "/#/tasks/load")
        await page.wait_for_selector(f"{run_row(ids[0])} td.state")
        viewport = page.viewport_size
        for run_id in (ids[-1], ids[10]):  # the top row, then one far down the list
            await page.click(f"{run_row(run_id)} td.id")
            await page.wait_for_selector(f"#run-id:text-is('#{run_id}')")
            await page.wait_for_selector("#run-summary:has-text('queued')")
            detail = await page.eval_on_selector(
                "#run-detail", "e => JSON.stringify(e.getBoundingClientRect())"
            )
            table = await page.eval_on_selector(
                "#runs", "e => JSON.stringify(e.getBoundingClientRect())"
            )
            box, runs = json.loads(detail), json.loads(table)
            assert box["left"] >= runs["right"], (box, runs)  # beside, not under
            assert 0 <= box["top"] < viewport["height"], box  # in view

    async def test_controls_are_named_for_what_they_act_on(
        self, page: Any, site: Site, runs: tuple[int, int]
    ) -> None:
        """Each button's accessible name says what it acts on; the token box has a label;
        the page links a favicon that is served."""
        failed, _ = runs
        await page.wait_for_selector(state_cell("orders_feed") + ":has-text('running')")
        pause = page.get_by_role("button", name="Pause watcher orders_feed", exact=True)
        assert await pause.count() == 1
        await page.goto(site.base + "/#/tasks/load")
        await page.wait_for_selector(f"{run_row(failed)} td.state:text-is('failed')")
        for name in ("Pause task load", f"Retry run #{failed}"):
            assert await page.get_by_role("button", name=name, exact=True).count() == 1, name
        href = await page.get_attribute("link[rel=icon]", "href")
        assert href is not None
        icon = await page.request.get(site.base + href)
        assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
        await page.click("#logout")
        token_box = page.get_by_label("API token", exact=True)
        assert await token_box.get_attribute("id") == "token"
