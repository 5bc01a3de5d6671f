"""The page's pictures in a real browser (Playwright's async API driving Debian's chromium):
a watcher's charts, state history and watermark; the asset graph with a chain of two tasks;
a task's run history over more than 5,000 runs with filters, pages and a timeline; and names
holding markup shown as text everywhere, never run.

A daemon runs in this process on a SQLite file with one watcher that emits each line of a
text file, its API on a free port sampling the watchers every 0.2 s. With
``WATCHKEEPER_SCREENSHOTS=DIR`` the views are also saved there (the docs' pictures come from
``docs/screenshots``).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from watchkeeper.store import Asset
from watchkeeper.store.protocols import EventBatchCommit, OutletEvent, TaskSpec, encode_json
from watchkeeper.triggerer.settings import ApiSettings

from tests.support.browser import Site, open_site, screenshot, signed_in
from tests.support.daemons import append_lines, wait_until
from tests.support.requires import unavailable

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SAMPLED = ApiSettings(port=0, watcher_sample_seconds=0.2)
"""The API, sampling the watchers every 0.2 s (so their charts fill within a test)."""
ZONE = "Asia/Tokyo"
"""The browser's time zone: the exact times on hover are in it, not in UTC."""
MARKUP = '<img src=x onerror="window.__xss=1">'
"""A name that would run script if the page put it in as HTML."""
AXE = (
    Path(os.environ.get("WATCHKEEPER_AXE_DIR", Path.home() / ".cache/watchkeeper/axe"))
    / "node_modules/axe-core/axe.min.js"
)
"""axe-core (npm, installed by ``.ci/run``): injected by the test, never served by the page."""


@pytest.fixture
async def site(tmp_path: Path, watchers: Path) -> AsyncIterator[Site]:
    async with open_site(tmp_path, watchers, api=SAMPLED) as one:
        yield one


@pytest.fixture
async def hostile(tmp_path: Path, watchers: Path) -> AsyncIterator[Site]:
    """The same daemon, its asset and watcher named with markup."""
    async with open_site(tmp_path, watchers, MARKUP + "a", MARKUP + "w", api=SAMPLED) as one:
        yield one


def signed_in_page(chromium: Path, site: Site, *, bypass_csp: bool = False) -> Any:
    """A page signed in to ``site``, in the viewer's zone (``bypass_csp``: only to inject
    axe-core)."""
    return signed_in(
        chromium,
        site.base,
        site.token,
        viewport={"width": 1200, "height": 800},
        timezone_id=ZONE,
        locale="en-US",
        bypass_csp=bypass_csp,
    )


@pytest.fixture
async def page(chromium: Path, site: Site) -> AsyncIterator[Any]:
    async with signed_in_page(chromium, site) as tab:
        yield tab


@pytest.fixture
async def hostile_page(chromium: Path, hostile: Site) -> AsyncIterator[Any]:
    async with signed_in_page(chromium, hostile) as tab:
        yield tab


async def events_of(site: Site, asset: str, n: int) -> None:
    async def enough() -> bool:
        return len(await site.backend.events.alist_events(asset=asset)) >= n

    await wait_until(enough, f"{n} events of {asset!r}")


async def finish_one(
    site: Site,
    task: str,
    outlets: tuple[str, ...],
    *,
    ok: bool = True,
    error: str = "boom",
    logs: tuple[tuple[str, str], ...] = (),
) -> int:
    """Create, claim and finish one run of ``task``, its try writing ``logs``; its id."""
    backend = site.backend
    run = await backend.tasks.acreate_run(task)
    assert run is not None
    (claimed,) = await backend.tasks.aclaim_runs("w1", limit=1, ttl=30, tasks=[task])
    if logs:
        await backend.logs.aappend(claimed.id, claimed.try_number, logs)
    await backend.tasks.afinish_run(
        claimed.id,
        "w1",
        claimed.lease_token,
        success=ok,
        outlets=tuple(OutletEvent(a, encode_json({"from": task})) for a in outlets),
        error=None if ok else f"RuntimeError: {error}",
    )
    return claimed.id


async def chain(site: Site) -> int:
    """Tasks ``load`` (orders -> loaded) and ``publish`` (loaded -> published), each with one
    successful run that emitted its outlet (``load``'s wrote some logs: its id is returned)."""
    backend = site.backend
    await events_of(site, site.asset, 2)
    await backend.events.aregister_assets([Asset("loaded"), Asset("published")])
    oldest = (await backend.events.alist_events(asset=site.asset))[0].id
    await backend.tasks.async_tasks(
        [
            TaskSpec("load", (site.asset,), max_events=10),
            TaskSpec("publish", ("loaded",), max_events=10),
        ]
    )
    await backend.tasks.arewind_task("load", site.asset, oldest)
    logs = (("stdout", "loaded 2 rows\n"), ("stderr", "one warning\n"), ("log", "INFO done\n"))
    load = await finish_one(site, "load", ("loaded",), logs=logs)
    await finish_one(site, "publish", ("published",))
    return load


class TestWatcherView:
    async def test_charts_history_and_watermark(self, page: Any, site: Site) -> None:
        """The watcher's view draws its rate and last-event age from samples holding data,
        lists its state changes (a pause with who asked) and shows its watermark."""
        await events_of(site, "orders", 2)
        # In a daemon the rate is the runner's own count: its watcher commits more lines while
        # the server samples (the two first ones may predate the first sample).
        append_lines(site.source, 3, 120)
        await events_of(site, "orders", 120)
        await page.click('#watchers tr[data-watcher="orders_feed"] td.name a')
        await page.wait_for_selector("#watcher-view:not([hidden])")
        assert await page.text_content("#watcher-name") == "orders_feed"
        # A line needs two samples; the bulk commit lands in one, so some point is above 0.
        await page.wait_for_selector("#rate-chart svg polyline", state="attached")
        label = await page.get_attribute("#rate-chart svg", "aria-label") or ""
        highest = re.search(r"highest ([0-9.]+)/min", label)
        assert highest is not None and float(highest.group(1)) > 0, label
        await page.wait_for_selector("#lag-chart svg polyline", state="attached")
        await page.wait_for_selector("#watcher-changes td.state:text-is('running')")
        await page.wait_for_selector(
            '#watcher-watermark tr[data-key="watermark"] td.asset:text-is("orders")'
        )
        await screenshot(page, "watcher")

        await page.goto(site.base + "/#/watchers")
        await page.click('#watchers tr[data-watcher="orders_feed"] button.pause')
        await page.goto(site.base + "/#/watchers/orders_feed")
        paused = '#watcher-changes tr:has(td.state:text-is("paused")) td.why'
        await page.wait_for_selector(f"{paused}:text-is('paused by api:ops')")

    async def test_an_unknown_watcher_says_so(self, page: Any, site: Site) -> None:
        """A watcher name nobody reported is a message naming the closest, not empty charts."""
        await page.goto(site.base + "/#/watchers/orders_fed")
        await page.wait_for_selector("#watcher-message:has-text('orders_feed')")
        assert await page.get_attribute("#rate-chart svg", "aria-label") == "no samples yet"


class TestAssetGraph:
    async def test_a_chain_of_two_tasks(self, page: Any, site: Site) -> None:
        """watcher -> orders -> load -> loaded -> publish -> published, each a column further
        right, each node with its state; Enter on a focused task opens it."""
        await chain(site)
        await page.click("a[href='#/graph']")
        edge = '#graph path.edge[data-from="{}"][data-to="{}"]'
        hops = [
            ("watcher:orders_feed", "asset:orders"),
            ("asset:orders", "task:load"),
            ("task:load", "asset:loaded"),
            ("asset:loaded", "task:publish"),
            ("task:publish", "asset:published"),
        ]
        for a, b in hops:
            await page.wait_for_selector(edge.format(a, b), state="attached")
        xs = []
        for node in ["watcher:orders_feed"] + [b for _, b in hops]:
            transform = await page.get_attribute(f'#graph g[data-id="{node}"]', "transform") or ""
            found = re.match(r"translate\(([0-9.]+),", transform)
            assert found is not None, (node, transform)
            xs.append(float(found.group(1)))
        assert xs == sorted(xs) and len(set(xs)) == len(xs), xs
        status = await page.text_content('#graph g[data-id="task:publish"] text.kind')
        assert status == "task: success, backlog 0"
        await screenshot(page, "graph")
        await page.focus('#graph a[href="#/tasks/load"]')  # a node is a link: the keyboard
        await page.keyboard.press("Enter")  # reaches and opens it
        await page.wait_for_selector("#task-view:not([hidden])")
        assert await page.text_content("#task-name") == "load"


RUNS = 5_100


class TestRunHistory:
    async def test_pages_over_5000_runs_with_filters_and_timeline(
        self, page: Any, site: Site
    ) -> None:
        """5,100 runs page by page (newest first, each run once), the timeline draws the
        page's runs, the state filter keeps the failed ones, and times read "... ago" with
        the exact time in the viewer's zone on hover."""
        backend = site.backend
        await events_of(site, "orders", 2)
        rows = tuple((encode_json({"n": n}), None) for n in range(RUNS))
        await backend.events.acommit_batch(EventBatchCommit("bulk", ("orders",), rows))
        oldest = (await backend.events.alist_events(asset="orders"))[0].id
        await backend.tasks.async_tasks([TaskSpec("load", ("orders",), max_events=1, max_tries=1)])
        await backend.tasks.arewind_task("load", "orders", oldest)
        failed = await finish_one(site, "load", (), ok=False)
        succeeded = await finish_one(site, "load", ())
        assert len(await backend.tasks.acreate_runs("load", RUNS)) == RUNS  # the rest, queued
        await page.goto(site.base + "/#/tasks/load")
        await page.wait_for_selector("#runs-timeline[data-runs='100']")
        seen: list[int] = []
        for number in range(1, 200):
            await page.wait_for_selector(f"#runs-page:has-text('page {number}:')")
            ids = await page.eval_on_selector_all(
                "#runs tbody tr", "rows => rows.map(r => Number(r.dataset.run))"
            )
            bars = await page.eval_on_selector_all(
                "#runs-timeline a", "bars => bars.map(b => Number(b.dataset.run))"
            )
            assert bars == ids[::-1]  # oldest left
            seen.extend(ids)
            if await page.is_disabled("#runs-older"):
                break
            await page.click("#runs-older")
        assert len(seen) == RUNS + 2 and seen == sorted(set(seen), reverse=True)
        await page.click("#runs-newer")
        await page.wait_for_selector(f"#runs-page:has-text('page {number - 1}:')")

        await page.select_option("#runs-state", "failed")
        await page.wait_for_selector(f"#runs tr[data-run='{failed}']")
        await page.wait_for_selector("#runs-timeline[data-runs='1']")
        assert await page.eval_on_selector_all("#runs tbody tr", "rows => rows.length") == 1
        assert await page.is_disabled("#runs-older")
        await page.select_option("#runs-state", "success")
        await page.select_option("#runs-range", "3600")
        created = f"#runs tr[data-run='{succeeded}'] td.created time"
        time = await page.wait_for_selector(created)
        assert time is not None
        assert re.fullmatch(r"just now|\d+ s ago|\d+ min ago", await time.text_content() or "")
        stamp = await time.get_attribute("datetime") or ""
        local = datetime.fromisoformat(stamp).astimezone(ZoneInfo(ZONE))
        hour = local.hour % 12 or 12
        assert f"{hour}:{local.minute:02d}:" in (await time.get_attribute("title") or "")
        await screenshot(page, "run-history")


class TestMarkupInNames:
    async def test_names_with_markup_are_text_everywhere(
        self, hostile_page: Any, hostile: Site
    ) -> None:
        """An asset, a watcher, tasks, a state key and an error holding HTML show as text
        in every view; no element is made from them and no script runs."""
        site, page = hostile, hostile_page
        await chain(site)
        bad_task = MARKUP + "t"
        await site.backend.tasks.async_tasks(
            [TaskSpec(bad_task, (site.asset,), max_events=1, max_tries=1)]
        )
        await site.backend.tasks.arewind_task(bad_task, site.asset, 1)
        run = await finish_one(site, bad_task, (), ok=False, error="boom " + MARKUP)

        async def clean(where: str, text: str, wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            found = await page.evaluate(
                "() => ({xss: window.__xss, imgs: document.querySelectorAll('img').length,"
                " handlers: document.querySelectorAll('[onerror]').length,"
                " text: document.querySelector('main').innerText})"
            )
            assert found["xss"] is None and found["imgs"] == 0 and found["handlers"] == 0, where
            assert text in found["text"], where

        w = f'#watchers tr[data-watcher="{css(site.watcher)}"]'
        await clean("watchers", site.watcher, lambda: page.wait_for_selector(w))
        await page.goto(site.base + "/#/watchers/" + quote(site.watcher))
        await clean(
            "watcher",
            site.watcher,
            lambda: page.wait_for_selector("#watcher-changes td.state"),
        )
        await page.goto(site.base + "/#/graph")
        await clean(
            "graph",
            MARKUP[:15],  # a long name is cut; its title holds it whole
            lambda: page.wait_for_selector("#graph path.edge", state="attached"),
        )
        names = await page.eval_on_selector_all(
            "#graph g.node title", "ts => ts.map(t => t.textContent)"
        )
        assert any(n.startswith(site.asset + " (") for n in names), names
        await page.goto(site.base + "/#/assets/" + quote(site.asset))
        await clean("asset", site.asset, lambda: page.wait_for_selector("#asset-events li"))
        await page.goto(site.base + "/#/tasks")
        await clean(
            "tasks",
            bad_task,
            lambda: page.wait_for_selector(f'#tasks tr[data-task="{css(bad_task)}"]'),
        )
        await page.goto(site.base + f"/#/tasks/{quote(bad_task)}/runs/{run}")
        await clean(
            "run",
            "RuntimeError: boom",
            lambda: page.wait_for_selector("#run-errors li:has-text('boom')"),
        )
        assert await page.eval_on_selector_all("#runs-timeline a", "a => a.length") == 1


def quote(name: str) -> str:
    from urllib.parse import quote as url_quote

    return url_quote(name, safe="")


def css(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


@pytest.fixture
def axe() -> Path:
    if not AXE.is_file():
        unavailable(f"{AXE} is missing (npm install --prefix DIR axe-core; see .ci/run)")
    return AXE


class TestAccessibility:
    async def test_no_axe_violation_in_any_view(
        self, chromium: Path, site: Site, axe: Path
    ) -> None:
        """axe-core finds no violation (WCAG 2 A and AA rules) in the watchers, a watcher's
        view, the graph, the assets, an asset, the tasks, a task's run history and a run's
        tries and logs."""
        load = await chain(site)
        views = {
            "watchers": ("#/watchers", "#watchers td.state"),
            "watcher": ("#/watchers/orders_feed", "#watcher-changes td.state"),
            "graph": ("#/graph", "#graph g.node"),
            "assets": ("#/assets", "#assets li"),
            "asset": ("#/assets/orders", "#state tr[data-key]"),
            "tasks": ("#/tasks", "#tasks tr[data-task]"),
            "task": ("#/tasks/load", "#runs-timeline a"),
            "run": (f"#/tasks/load/runs/{load}", "#run-logs span.stream-log"),
        }
        async with signed_in_page(chromium, site, bypass_csp=True) as page:
            found = {}
            for name, (hash_, ready) in views.items():
                await page.goto(site.base + "/" + hash_)
                await page.wait_for_selector(ready, state="attached")
                if not await page.evaluate("() => typeof window.axe === 'object'"):
                    await page.add_script_tag(path=str(axe))
                result = await page.evaluate(
                    """async () => (await axe.run(document, {runOnly: {type: "tag",
                    values: ["wcag2a", "wcag2aa"]}})).violations.map(v => ({id: v.id,
                    nodes: v.nodes.map(n => n.target.join(" "))}))"""
                )
                if result:
                    found[name] = result
            assert found == {}
