"""Hostile or careless API clients: streams that outlive their token, streams of unknown assets,
too many streams per token, the security headers and the scoping rule.

A real server (uvicorn on a free port) over a real SQLite store.
"""

from __future__ import annotations

import functools
import re
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import httpx
import pytest
from structlog.testing import capture_logs
from watchkeeper.store import Asset, SqliteStateBackend
from watchkeeper.store.protocols import (
    DaemonStatus,
    TaskSpec,
    TriggerStatus,
)
from watchkeeper.triggerer.api import (
    ApiListenError,
    api_context,
    serve_app,
)
from watchkeeper.triggerer.settings import ApiSettings

from tests.support.api import ServedApi, serve_api
from tests.support.daemons import wait_until

ASSETS = [Asset("orders"), Asset("bills")]
SCOPES = {"reader": ["read"], "ops": ["operate"], "orders": ["write:asset:orders"]}


Served = ServedApi[SqliteStateBackend]


@asynccontextmanager
async def serve(tmp_path: Path, settings: ApiSettings) -> AsyncIterator[Served]:
    async with SqliteStateBackend(tmp_path / "state.db") as backend:
        await backend.events.aregister_assets(ASSETS)
        async with serve_api(backend, SCOPES, settings) as served:
            served.ctx.sse_poll = 0.02
            yield served


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """A served API with three assets and a token per scope."""
    async with serve(tmp_path, ApiSettings(port=0)) as one:
        yield one


async def opened(lines: AsyncIterator[str]) -> None:
    """Wait for a stream's first comment: the server is serving it. (Keep ``lines``: a line
    iterator that is dropped closes its response.)"""
    with anyio.fail_after(10):
        async for line in lines:
            if line.startswith(": watching from event"):
                return
    pytest.fail("the stream ended before it started")


async def ends(lines: AsyncIterator[str]) -> list[str]:
    """The rest of a stream until the server ends it (bounded)."""
    with anyio.fail_after(15):
        return [line async for line in lines]


class TestStreamTokens:
    """An open stream checks its token again: revoked or expired, the stream ends."""

    async def test_a_revoked_token_loses_its_open_stream(self, served: Served) -> None:
        served.ctx.token_recheck = 0.1
        async with (
            served.client("reader") as client,
            client.stream("GET", "/api/v1/events/stream") as stream,
        ):
            lines = stream.aiter_lines()
            await opened(lines)
            await served.commit("orders", 1)
            assert await served.backend.controls.arevoke_token("reader")
            rest = await ends(lines)
            refused = await client.get("/api/v1/events")
        assert any("revoked or expired" in line for line in rest), rest
        assert refused.status_code == 401
        await wait_until(lambda: not served.ctx.open_streams, "the stream to be released")

    async def test_an_expired_token_loses_its_open_stream(self, served: Served) -> None:
        served.ctx.token_recheck = 0.1
        await served.add_token("brief", ["read"], timedelta(seconds=5))
        async with (
            served.client("brief") as client,
            client.stream("GET", "/api/v1/events/stream", params={"asset": "orders"}) as stream,
        ):
            lines = stream.aiter_lines()
            await opened(lines)
            rest = await ends(lines)
        assert any("revoked or expired" in line for line in rest), rest


class TestStreamLimits:
    async def test_a_stream_of_an_unknown_asset_is_404(self, served: Served) -> None:
        """A stream of an asset the store does not know is refused before it starts."""
        async with served.client("reader") as client:
            missing = await client.get("/api/v1/events/stream", params={"asset": "nope"})
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        assert "nope" in missing.json()["detail"]
        assert not served.ctx.feeds and not served.ctx.open_streams

    async def test_a_token_holds_at_most_max_streams(self, tmp_path: Path) -> None:
        """Past ``max_streams_per_token`` a stream is 429; closing one frees its place; the
        cap is per token."""
        async with serve(tmp_path, ApiSettings(port=0, max_streams_per_token=2)) as served:
            path = "/api/v1/events/stream"
            async with served.client("reader") as client, served.client("orders") as other:
                async with client.stream("GET", path) as first:
                    first_lines = first.aiter_lines()  # kept: a dropped iterator closes it
                    await opened(first_lines)
                    async with client.stream("GET", path) as second:
                        second_lines = second.aiter_lines()
                        await opened(second_lines)
                        third = await client.get(path)
                        assert third.status_code == 429, third.text
                        assert third.json()["error"] == "too_many_streams"
                        assert "max_streams_per_token" in third.json()["detail"]
                        assert third.headers["retry-after"] == "5"
                        params = {"asset": "orders"}
                        async with other.stream("GET", path, params=params) as theirs:
                            theirs_lines = theirs.aiter_lines()
                            await opened(theirs_lines)
                            assert sorted(served.ctx.open_streams.values()) == [1, 2]
                await wait_until(
                    lambda: sum(served.ctx.open_streams.values()) == 0, "the streams to close"
                )
                async with client.stream("GET", path) as again:
                    assert again.status_code == 200


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the ``openssl`` command."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


class TestTransport:
    async def test_security_headers_on_the_page_and_the_api(self, served: Served) -> None:
        """The page, its files, the API and health answers forbid framing, sniffing and
        referrers; the page's policy allows only its own origin."""
        async with served.client("reader") as client:
            answers = [
                await client.get(path)
                for path in ("/", "/static/app.js", "/static/app.css", "/healthz", "/metrics")
            ]
            answers += [await client.get("/api/v1/assets"), await client.get("/api/v1/nope")]
            async with client.stream("GET", "/api/v1/events/stream") as stream:
                answers.append(stream)
        for answer in answers:
            headers = answer.headers
            assert "frame-ancestors 'none'" in headers["content-security-policy"], answer.url
            assert "default-src 'self'" in headers["content-security-policy"]
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "no-referrer"
        assert "<script" not in answers[0].text.replace('<script src="/static/app.js">', "")
        assert "style=" not in answers[0].text

    async def test_metrics_behind_a_token_when_set(self, tmp_path: Path) -> None:
        """With ``metrics_token_required``, /metrics needs a token with read scope."""
        settings = ApiSettings(port=0, metrics_token_required=True)
        async with serve(tmp_path, settings) as served:
            async with served.client() as anonymous:
                refused = await anonymous.get("/metrics")
                health = await anonymous.get("/healthz")
            async with served.client("ops") as ops:
                forbidden = await ops.get("/metrics")
            async with served.client("reader") as reader:
                scraped = await reader.get("/metrics")
        assert refused.status_code == 401 and health.status_code == 200
        assert forbidden.status_code == 403
        assert scraped.status_code == 200 and "watchkeeper_" in scraped.text

    async def test_metrics_open_by_default(self, served: Served) -> None:
        async with served.client() as anonymous:
            assert (await anonymous.get("/metrics")).status_code == 200

    async def test_https_with_a_certificate(self, tmp_path: Path) -> None:
        """With ``tls_certfile``/``tls_keyfile`` the API speaks HTTPS (and asks browsers to
        keep to it); plain HTTP on that port gets no answer."""
        cert, key = self_signed(tmp_path)
        settings = ApiSettings(port=0, tls_certfile=cert, tls_keyfile=key)
        trust = ssl.create_default_context(cafile=str(cert))
        async with serve(tmp_path, settings) as served:
            secure = served.base.replace("http://", "https://")
            async with httpx.AsyncClient(base_url=secure, verify=trust, timeout=10) as client:
                health = await client.get("/healthz")
                auth = {"Authorization": f"Bearer {served.tokens['reader']}"}
                assets = await client.get("/api/v1/assets", headers=auth)
            async with served.client() as plain:
                with pytest.raises(httpx.TransportError):
                    await plain.get("/healthz")
        assert health.status_code == 200 and assets.status_code == 200
        assert health.headers["strict-transport-security"].startswith("max-age=")

    async def test_a_bad_certificate_is_an_error_naming_it(self, tmp_path: Path) -> None:
        cert, key = self_signed(tmp_path)
        wrong = tmp_path / "wrong.pem"
        wrong.write_text("not a certificate\n")
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            for certfile, keyfile in ((wrong, key), (tmp_path / "missing.pem", key)):
                settings = ApiSettings(port=0, tls_certfile=certfile, tls_keyfile=keyfile)
                with pytest.raises(ApiListenError, match=re.escape(str(certfile))):
                    await serve_app(
                        api_context(backend, settings), host="127.0.0.1", port=0, settings=settings
                    )
        with pytest.raises(ValueError, match="tls_keyfile"):
            ApiSettings(tls_certfile=cert)

    async def test_plain_http_on_every_interface_is_warned(self, tmp_path: Path) -> None:
        """Serving without TLS on a non-loopback address logs the risk; loopback does not."""
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            for host in ("0.0.0.0", "127.0.0.1"):
                settings = ApiSettings(port=0)
                with capture_logs() as logs:
                    async with anyio.create_task_group() as tg:
                        await tg.start(
                            functools.partial(
                                serve_app, api_context(backend, settings), host=host, port=0
                            )
                        )
                        tg.cancel_scope.cancel()
                warned = [e for e in logs if e["event"] == "api_plain_http"]
                if host == "0.0.0.0":
                    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
                    assert "unencrypted" in warned[0]["risk"]
                    assert "tls_certfile" in warned[0]["fix"]
                else:
                    assert warned == []


class TestScopingRule:
    """Data (state values, payloads, the text of errors) needs read; operate alone sees the
    operational record and each error's type, on every route that returns runs or watchers."""

    SECRET = "customer 4711 owes 99.50"

    async def _seed(self, served: Served) -> int:
        backend = served.backend
        await backend.tasks.async_tasks([TaskSpec("load", ("orders",), max_events=1)])
        await served.commit("orders", 1)
        run = await backend.tasks.acreate_run("load")
        assert run is not None
        (claimed,) = await backend.tasks.aclaim_runs("w1", limit=1, ttl=30)
        await backend.tasks.afinish_run(
            claimed.id,
            "w1",
            claimed.lease_token,
            success=False,
            error=f"ValueError: {self.SECRET}",
            traceback=f"Traceback (most recent call last):\nValueError: {self.SECRET}\n",
        )
        now = datetime.now(UTC)
        status = TriggerStatus(
            "t1", "m.C", ("orders",), ("feed",), "failed", 3,
            last_error=f"KeyError: {self.SECRET!r}", updated_at=now, owner="d1",
        )  # fmt: skip
        await backend.status.asave_trigger_status([status])
        await backend.status.asave_daemon_status(DaemonStatus("d1", now, now, 60.0, "watchers"))
        return run.id

    async def test_operate_alone_sees_no_data(self, served: Served) -> None:
        run_id = await self._seed(served)
        async with served.client("ops") as ops:
            answers = [
                await ops.get(f"/api/v1/runs/{run_id}"),
                await ops.get("/api/v1/runs"),
                await ops.get("/api/v1/watchers"),
                await ops.get("/api/v1/tasks"),
                await ops.get("/api/v1/daemons"),
                await ops.post(f"/api/v1/runs/{run_id}/retry"),
            ]
        for answer in answers:
            assert answer.status_code in (200, 202), answer.text
            assert "4711" not in answer.text, answer.url
        detail, listed, watchers = (a.json() for a in answers[:3])
        assert detail["errors"][0]["error"] == "ValueError"
        assert detail["errors"][0]["traceback"] is None
        assert "events" not in detail and detail["data_withheld"] is True
        assert listed["runs"][0]["errors"][0]["error"] == "ValueError"
        assert watchers["watchers"][0]["last_error"] == "KeyError"
        assert watchers["watchers"][0]["failures"] == 3

    async def test_read_sees_the_data(self, served: Served) -> None:
        run_id = await self._seed(served)
        async with served.client("reader") as reader:
            detail = (await reader.get(f"/api/v1/runs/{run_id}")).json()
            listed = (await reader.get("/api/v1/runs")).json()
            watchers = (await reader.get("/api/v1/watchers")).json()
        assert self.SECRET in detail["errors"][0]["error"]
        assert self.SECRET in detail["errors"][0]["traceback"]
        assert [e["payload"] for e in detail["events"]] == [{"n": 1}]
        assert "data_withheld" not in detail
        assert self.SECRET in listed["runs"][0]["errors"][0]["error"]
        assert self.SECRET in watchers["watchers"][0]["last_error"]
