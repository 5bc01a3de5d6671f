"""HttpPollWatcher against a real HTTP server on 127.0.0.1, started by each test in a thread.

The server (``http.server``) answers from a script the test gives it and records every request
it got, so a test can check what the watcher sent (its cursor, its conditional headers) as well
as what it committed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import anyio
import pytest
import structlog
from watchkeeper.store import Asset, BaseStateBackend, MemoryStateBackend
from watchkeeper.triggerer import RunnerConfig, TriggerRunner, WatchSpec, configure_logging
from watchkeeper.triggerer.testing import CrashPoint, WatcherHarness, run_trigger
from watchkeeper.watchers import HttpPollWatcher, HttpSourceError
from watchkeeper.watchers.http_poll import retry_after

from tests.support.runtime import rebuilt

OpenBackend = Callable[[], contextlib.AbstractAsyncContextManager[BaseStateBackend]]
ASSET = Asset("feed")
NAME = "feed_poll"
FAST: dict[str, Any] = {"poll_interval": 0.01, "backoff": 0.01, "timeout": 5.0}


# -- the server ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What the server got: the path, the query parameters, the headers (lower-case names)."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class Reply:
    """What the server answers: a status, a JSON body (or raw bytes), headers, a delay first."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class Api:
    """A real HTTP server on a free port of 127.0.0.1; ``respond(request)`` makes each reply."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self.respond: Callable[[Request], Reply] = lambda _request: Reply(404, {"error": "none"})

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def answer(self, request: Request) -> Reply:
        with self._lock:
            self._requests.append(request)
        return self.respond(request)


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        request = Request(
            parts.path,
            dict(parse_qsl(parts.query)),
            {name.lower(): value for name, value in self.headers.items()},
        )
        reply = self.server.api.answer(request)
        if reply.delay:
            threading.Event().wait(reply.delay)  # this server thread only
        body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if reply.status != 304:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if reply.status != 304:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def api() -> Iterator[Api]:
    """A running server; each test sets ``api.respond``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.block_on_close = False
    served = Api(server)
    server.api = served  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Feed:
    """A cursor API: ``GET /feed?cursor=N`` gives up to ``page`` items with ``id > N`` and
    ``next``, the last id it gave (``N`` again when it had none)."""

    def __init__(self, ids: list[int], page: int = 2) -> None:
        self.ids = ids
        self.page = page

    def __call__(self, request: Request) -> Reply:
        after = int(request.query.get("cursor", 0))
        items = [{"id": n, "name": f"item {n}"} for n in self.ids if n > after][: self.page]
        return Reply(body={"items": items, "next": items[-1]["id"] if items else after})


class LogStream(io.StringIO):
    """Keeps what structlog writes, and sets ``seen`` once an event named ``name`` is written."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.seen = anyio.Event()

    def write(self, text: str) -> int:
        if f'"event": "{self.name}"' in text:
            self.seen.set()
        return super().write(text)


async def payloads(
    trigger: HttpPollWatcher, backend: BaseStateBackend, max_events: int | None, **kwargs: Any
) -> list[Any]:
    events = await run_trigger(
        trigger,
        assets=ASSET,
        backend=backend,
        max_events=max_events,
        timeout=kwargs.pop("timeout", 10.0),
        watcher_name=NAME,
    )
    return [event.payload for event in events]


def next_from_link(body: Any, headers: Mapping[str, str]) -> str | None:
    """A cursor function: the ``rel="next"`` URL of a ``Link`` header, as GitHub sends it."""
    for link in headers.get("Link", "").split(","):
        url, _, rel = link.partition(";")
        if 'rel="next"' in rel:
            return url.strip().strip("<>")
    return None


@pytest.fixture
def backend() -> MemoryStateBackend:
    return MemoryStateBackend()


# -- the tests -----------------------------------------------------------------------------------


class TestHttpPollWatcherItems:
    async def test_items_flow_page_by_page_and_a_restart_resumes_at_the_cursor(
        self, api: Api, reopenable_backend: OpenBackend
    ) -> None:
        """Pages follow each other through the cursor; a restarted watcher on a reopened store
        asks from the committed cursor and emits only what is new."""
        feed = Feed([1, 2, 3, 4, 5])
        api.respond = feed
        watcher = HttpPollWatcher(f"{api.url}/feed", items="items", cursor="next", **FAST)
        async with reopenable_backend() as first:
            got = await payloads(watcher, first, 5)
            assert [item["id"] for item in got] == [1, 2, 3, 4, 5]
            position = await first.aget(ASSET.scope, f"{NAME}.cursor")
            assert position["cursor"] == 5
        assert [r.query.get("cursor") for r in api.requests[:3]] == [None, "2", "4"]
        feed.ids += [6, 7]
        before = len(api.requests)
        async with reopenable_backend() as second:
            again = await payloads(rebuilt(watcher), second, 2)
            assert [item["id"] for item in again] == [6, 7]
        assert api.requests[before].query == {"cursor": "5"}

    async def test_each_response_commits_as_one_batch(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """A page's items and the cursor after them are one commit: three pages, three writes."""
        api.respond = Feed([1, 2, 3, 4, 5])
        watcher = HttpPollWatcher(f"{api.url}/feed", items="items", cursor="next", **FAST)
        assert len(await payloads(watcher, backend, 5)) == 5
        entry = await backend.aget_entry(ASSET.scope, f"{NAME}.cursor")
        assert entry is not None and (entry.value["cursor"], entry.version) == (5, 3)

    async def test_link_urls_and_a_cursor_function_paginate(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """A cursor that is a URL is requested as it is; a function may take it from headers."""

        def pages(request: Request) -> Reply:
            page = int(request.query.get("page", 1))
            link = {"Link": f'<{api.url}/list?page={page + 1}>; rel="next"'} if page < 3 else {}
            return Reply(body=[{"page": page}], headers=link)

        api.respond = pages
        watcher = HttpPollWatcher(f"{api.url}/list", items="", cursor=next_from_link, **FAST)
        assert await payloads(watcher, backend, 3) == [{"page": 1}, {"page": 2}, {"page": 3}]
        assert watcher.serialize()[1]["cursor_function"] == f"{__name__}:next_from_link"
        assert rebuilt(watcher) == watcher

    async def test_a_snapshot_without_items_is_one_event_per_change(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """Without an items path each changed response is one event holding the whole body."""
        versions = iter([{"v": 1}, {"v": 1}, {"v": 2}])
        api.respond = lambda _request: Reply(body=next(versions, {"v": 2}))
        watcher = HttpPollWatcher(f"{api.url}/status", **FAST)
        assert await payloads(watcher, backend, 2) == [{"v": 1}, {"v": 2}]


class TestHttpPollWatcherConditionalRequests:
    async def test_a_304_is_nothing_new_and_the_validators_go_back(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """The stored (weak) ETag and Last-Modified are sent back; 304s yield nothing, and the
        next change comes as the next event, also after a restart."""
        document: dict[str, Any] = {"etag": 'W/"v1"', "body": {"v": 1}, "not_modified": 0}
        modified = "Wed, 01 May 2024 12:00:00 GMT"

        def snapshot(request: Request) -> Reply:
            if request.headers.get("if-none-match") == document["etag"]:
                document["not_modified"] += 1
                if document["not_modified"] == 3:  # after three 304s, a new version
                    document.update(etag='W/"v2"', body={"v": 2})
                return Reply(304, headers={"ETag": str(document["etag"])})
            return Reply(
                body=document["body"],
                headers={"ETag": str(document["etag"]), "Last-Modified": modified},
            )

        api.respond = snapshot
        watcher = HttpPollWatcher(f"{api.url}/doc", **FAST)
        assert await payloads(watcher, backend, 1) == [{"v": 1}]
        position = await backend.aget(ASSET.scope, f"{NAME}.cursor")
        assert position == {
            "cursor": None,
            "etag": 'W/"v1"',
            "last_modified": modified,
            "sha256": hashlib.sha256(json.dumps({"v": 1}).encode()).hexdigest(),
        }
        assert await payloads(rebuilt(watcher), backend, 1) == [{"v": 2}]
        conditional = [r for r in api.requests if "if-none-match" in r.headers]
        assert conditional[0].headers["if-none-match"] == 'W/"v1"'
        assert conditional[0].headers["if-modified-since"] == modified
        assert document["not_modified"] == 3

    async def test_a_server_ignoring_conditionals_is_recognised_by_the_body_hash(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """A 200 with the same body (no ETag, no Last-Modified) is nothing new, even after a
        restart: the body's hash is committed with the event."""
        answered = {"count": 0}

        def stubborn(_request: Request) -> Reply:
            answered["count"] += 1
            return Reply(body={"v": 1 if answered["count"] < 6 else 2})

        api.respond = stubborn
        watcher = HttpPollWatcher(f"{api.url}/doc", **FAST)
        assert await payloads(watcher, backend, 1) == [{"v": 1}]
        assert await payloads(rebuilt(watcher), backend, 1) == [{"v": 2}]
        assert answered["count"] >= 6


class TestHttpPollWatcherBackoff:
    async def test_a_429_waits_what_retry_after_asks(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """A 429 with Retry-After: 1 is retried after 1 s (more than the 0.01 s backoff)."""
        replies = iter([Reply(429, {"error": "slow down"}, {"Retry-After": "1"})])
        api.respond = lambda request: next(replies, None) or Feed([1])(request)
        watcher = HttpPollWatcher(f"{api.url}/feed", items="items", cursor="next", **FAST)
        with structlog.testing.capture_logs() as logs:
            assert [p["id"] for p in await payloads(watcher, backend, 1)] == [1]
        retries = [entry for entry in logs if entry["event"] == "http_retry"]
        assert [(r["problem"], r["delay"]) for r in retries] == [
            ("HTTP 429 Too Many Requests", 1.0)
        ]

    async def test_5xx_is_retried_with_a_doubling_backoff(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """Two 503s and a 500 are retried after 0.01, 0.02 and 0.04 s; then the items come."""
        replies = iter([Reply(503), Reply(503), Reply(500)])
        api.respond = lambda request: next(replies, None) or Feed([1, 2])(request)
        watcher = HttpPollWatcher(f"{api.url}/feed", items="items", cursor="next", **FAST)
        with structlog.testing.capture_logs() as logs:
            assert [p["id"] for p in await payloads(watcher, backend, 2)] == [1, 2]
        assert [e["delay"] for e in logs if e["event"] == "http_retry"] == [0.01, 0.02, 0.04]

    async def test_a_timeout_is_retried(self, api: Api, backend: MemoryStateBackend) -> None:
        """A request unanswered within timeout is retried; the next answer's items come."""
        replies = iter([Reply(body={"items": []}, delay=2.0)])
        api.respond = lambda request: next(replies, None) or Feed([1])(request)
        watcher = HttpPollWatcher(
            f"{api.url}/feed", items="items", cursor="next", **{**FAST, "timeout": 0.2}
        )
        with structlog.testing.capture_logs() as logs:
            assert [p["id"] for p in await payloads(watcher, backend, 1)] == [1]
        (retry,) = [e for e in logs if e["event"] == "http_retry"]
        assert retry["problem"].startswith("no answer within 0.2 s")

    async def test_failures_past_retries_fail_the_run(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """With retries=2, a third 500 in a row raises HttpSourceError and commits nothing."""
        api.respond = lambda _request: Reply(500, {"error": "down"})
        watcher = HttpPollWatcher(f"{api.url}/feed", items="items", retries=2, **FAST)
        with pytest.raises(HttpSourceError, match="HTTP 500 Internal Server Error, 3 times"):
            await payloads(watcher, backend, 1)
        assert len(api.requests) == 3
        assert await backend.events.alist_events() == []

    @pytest.mark.parametrize(
        ("reply", "match"),
        [
            (Reply(404, {"error": "gone"}), "HTTP 404 Not Found"),
            (Reply(200, b"<html>oops</html>"), "the response is not JSON"),
            (Reply(200, b'{"items": [NaN]}'), "the response is not JSON"),
            (Reply(200, {"items": {"not": "a list"}}), "items 'items' is a dict, not a list"),
        ],
        ids=["404", "html", "nan", "not-a-list"],
    )
    async def test_a_response_it_cannot_use_fails_at_once(
        self, api: Api, backend: MemoryStateBackend, reply: Reply, match: str
    ) -> None:
        """A status that is not retried, or a body that is not what the paths name, fails the
        run on its first answer, with nothing committed."""
        api.respond = lambda _request: reply
        watcher = HttpPollWatcher(f"{api.url}/feed", items="items", **FAST)
        with pytest.raises(HttpSourceError, match=match):
            await payloads(watcher, backend, 1)
        assert len(api.requests) == 1
        assert await backend.events.alist_events() == []

    def test_retry_after_reads_seconds_and_http_dates(self) -> None:
        """Retry-After is delay-seconds or an HTTP date (measured from ``now``)."""
        now = datetime(2015, 10, 21, 7, 27, 30, tzinfo=UTC)
        assert retry_after("120") == 120.0
        assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 30.0
        assert retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now=now) == 0.0
        assert retry_after("soon") is None
        assert retry_after(None) is None


class TestHttpPollWatcherExactlyOnce:
    @pytest.mark.parametrize("point", ["before_commit", "after_commit", "between_items"])
    async def test_a_crash_at_any_point_loses_and_repeats_nothing(
        self, api: Api, point: CrashPoint
    ) -> None:
        """Killed around its second page, the restarted watcher commits items 1..5 once."""
        api.respond = Feed([1, 2, 3, 4, 5])
        harness = WatcherHarness(MemoryStateBackend())
        watcher = HttpPollWatcher(f"{api.url}/feed", items="items", cursor="next", **FAST)
        crashed = await harness.crash(watcher, assets=ASSET, at=point, event=2)
        rest = 5 - len(crashed.all_events)
        after = await harness.restart(watcher, assets=ASSET, max_events=rest)
        assert [p["id"] for p in after.all_payloads] == [1, 2, 3, 4, 5]

    async def test_item_keys_suppress_items_read_twice(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """A list re-read whole (no cursor) commits each keyed item once, under the watcher's
        name, and new items as they appear."""
        listing = [{"id": "a"}, {"id": "b"}]
        api.respond = lambda _request: Reply(body={"data": list(listing)})
        watcher = HttpPollWatcher(f"{api.url}/all", items="data", item_key="id", **FAST)
        assert await payloads(watcher, backend, 2) == [{"id": "a"}, {"id": "b"}]
        listing.append({"id": "c"})
        assert await payloads(rebuilt(watcher), backend, 1) == [{"id": "c"}]
        keys = [event.dedup_key for event in await backend.events.alist_events()]
        assert keys == [f"{NAME}:a", f"{NAME}:b", f"{NAME}:c"]


SECRETS = ("pa55word", "k3y-value", "t0ken-from-env")


def failing_with_secrets(api: Api, monkeypatch: pytest.MonkeyPatch, status: int) -> HttpPollWatcher:
    """A watcher of an endpoint that answers ``status``, given each kind of secret: a URL
    password, a header value, and a header value read from the environment."""
    monkeypatch.setenv("WK_TEST_FEED_TOKEN", "t0ken-from-env")
    api.respond = lambda _request: Reply(status)
    return HttpPollWatcher(
        f"http://reader:pa55word@{api.url.removeprefix('http://')}/feed",
        items="items",
        headers={"X-Api-Key": "k3y-value"},
        env_headers={"X-Token": "WK_TEST_FEED_TOKEN"},
        retries=1,
        **FAST,
    )


class TestHttpPollWatcherSecrets:
    async def test_passwords_and_header_values_stay_out_of_repr_errors_and_logs(
        self, api: Api, backend: MemoryStateBackend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The URL's password and the header values reach the server and nowhere else."""
        watcher = failing_with_secrets(api, monkeypatch, 503)
        with structlog.testing.capture_logs() as logs, pytest.raises(HttpSourceError) as caught:
            await payloads(watcher, backend, 1)
        shown = " ".join([repr(watcher), str(caught.value), json.dumps(logs, default=str)])
        for secret in SECRETS:
            assert secret not in shown
        assert "reader:***@" in repr(watcher)
        assert f"{api.url}/feed: HTTP 503" in str(caught.value)
        sent = api.requests[0].headers
        assert sent["authorization"] == "Basic " + base64.b64encode(b"reader:pa55word").decode()
        assert sent["x-token"] == "t0ken-from-env"
        assert sent["x-api-key"] == "k3y-value"
        assert "t0ken" not in json.dumps(watcher.serialize())

    async def test_the_daemons_log_of_a_failed_run_holds_no_secret(
        self, api: Api, backend: MemoryStateBackend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Run by a TriggerRunner with the daemon's JSON logging, a failing run's error log
        (its traceback rendered with each frame's locals) shows no password or header value."""
        watcher = failing_with_secrets(api, monkeypatch, 500)
        out = LogStream("trigger_failed")
        configure_logging("info", "json", stream=out)
        await backend.events.aregister_assets([ASSET])
        config = RunnerConfig(max_failures=1, status_interval=0, lag_threshold=0)
        async with TriggerRunner(backend, config) as runner:
            await runner.start_trigger(WatchSpec("http", watcher, (ASSET,), (NAME,)))
            with anyio.fail_after(10):
                await out.seen.wait()
        logged = out.getvalue()
        assert '"trigger_error"' in logged  # the failure's traceback is logged (without locals)
        for secret in SECRETS:
            assert secret not in logged

    async def test_credentials_in_the_query_string_stay_out_of_logs_and_status(
        self, api: Api, backend: MemoryStateBackend
    ) -> None:
        """An endpoint answering 500 to a URL whose query carries credentials (any case): the
        retry warnings, the failure, the rendered log lines and the watcher's status show
        none of their values, and the other parameters as they are."""
        api.respond = lambda _request: Reply(500)
        host = api.url.removeprefix("http://")
        secrets = ("k3y-v4lue", "t0k3n-v4lue", "s1g-v4lue", "pa55word")
        watcher = HttpPollWatcher(
            f"http://reader:pa55word@{host}/feed?api_key=k3y-v4lue&page=2"
            "&Access_Token=t0k3n-v4lue&sig=s1g-v4lue",
            items="items",
            retries=2,
            **FAST,
        )
        out = LogStream("trigger_failed")
        configure_logging("debug", "json", stream=out)
        await backend.events.aregister_assets([ASSET])
        config = RunnerConfig(max_failures=1, status_interval=0, lag_threshold=0)
        async with TriggerRunner(backend, config) as runner:
            await runner.start_trigger(WatchSpec("http", watcher, (ASSET,), (NAME,)))
            with anyio.fail_after(10):
                await out.seen.wait()
            statuses = runner.statuses()
        logged = out.getvalue()
        lines = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
        retries = [line for line in lines if line["event"] == "http_retry"]
        assert len(retries) == 2
        assert any("HTTP Request: GET" in line["event"] for line in lines)  # httpx's own line
        status = statuses[0]
        assert status.last_error is not None and "HTTP 500" in status.last_error
        shown = " ".join([logged, repr(status), repr(watcher)])
        for secret in secrets:
            assert secret not in shown
        assert "api_key=***&page=2&Access_Token=***&sig=***" in retries[0]["url"]
        assert "api_key=***&page=2" in status.last_error
        assert len(api.requests) == 3  # the credentials did reach the server

    async def test_a_missing_environment_variable_is_named(
        self, api: Api, backend: MemoryStateBackend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An env_headers variable that is not set fails the run before any request."""
        monkeypatch.delenv("WK_TEST_UNSET", raising=False)
        watcher = HttpPollWatcher(
            f"{api.url}/feed", env_headers={"Authorization": "WK_TEST_UNSET"}, **FAST
        )
        with pytest.raises(HttpSourceError, match="'WK_TEST_UNSET', which is not set"):
            await payloads(watcher, backend, 1)
        assert api.requests == []


class TestHttpPollWatcherArguments:
    def test_serialize_is_json_and_rebuilds_an_equal_trigger(self) -> None:
        """serialize() is plain JSON (paths as text) and rebuilds an equal watcher."""
        watcher = HttpPollWatcher(
            "https://api.example/v1/events",
            items="data.events",
            item_key="id",
            cursor="meta.next",
            cursor_param="after",
            headers={"Accept-Language": "en"},
            env_headers={"Authorization": "EVENTS_TOKEN"},
            retries=3,
        )
        classpath, kwargs = watcher.serialize()
        assert classpath == "watchkeeper.watchers.http_poll.HttpPollWatcher"
        assert json.loads(json.dumps(kwargs)) == kwargs
        assert kwargs["items"] == "data.events" and kwargs["cursor"] == "meta.next"
        assert rebuilt(watcher) == watcher

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"url": "ftp://x/y"}, ValueError, "url must start with http"),
            ({"url": ""}, ValueError, "url must not be empty"),
            ({"items": 3}, TypeError, "items must be a JSON path"),
            ({"items": "a..b"}, ValueError, "has an empty part"),
            ({"item_key": "id"}, ValueError, "item_key needs items"),
            ({"cursor": "next", "cursor_function": "json:loads"}, ValueError, "not both"),
            ({"cursor_function": "no_such_module_wk:f"}, ValueError, "does not import"),
            ({"cursor_function": "json.loads"}, ValueError, "'package.module:function'"),
            ({"cursor": lambda body, headers: None}, ValueError, "module level"),
            ({"headers": {"X": 1}}, TypeError, "headers must be a mapping"),
            ({"poll_interval": 0}, ValueError, "poll_interval must be greater than 0"),
            ({"timeout": -1}, ValueError, "timeout must be greater than 0"),
            ({"retries": 0}, ValueError, "retries must be at least 1"),
        ],
    )
    def test_bad_arguments_are_rejected_by_name(
        self, kwargs: dict[str, Any], error: type[Exception], match: str
    ) -> None:
        """Each invalid argument raises a TypeError or ValueError that names it."""
        arguments: dict[str, Any] = {"url": "https://api.example/feed", **kwargs}
        with pytest.raises(error, match=match):
            HttpPollWatcher(**arguments)
