"""``POST /hooks/{asset}`` on a real server (uvicorn on a free port) over a real SQLite store.

Every way in (a ``push:asset`` token; GitHub's, Stripe's and the generic HMAC signature) and
every refusal (no token and no hook, a token without the scope, a missing, malformed or wrong
signature, a replayed Stripe timestamp, a missing or malformed delivery id, a body over the
limit, an unknown asset): each refusal writes nothing. A delivery sent twice is one event.
Secrets never reach a log line or ``config show``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from pydantic import SecretStr, ValidationError
from structlog.testing import capture_logs
from watchkeeper.store import Asset, AssetEvent, SqliteStateBackend
from watchkeeper.triggerer.settings import ApiSettings, HookSettings, load_settings

from tests.support.api import ServedApi, serve_api

Served = ServedApi[SqliteStateBackend]

GITHUB_SECRET = "gh-secret-7f3a"
STRIPE_SECRET = "whsec_stripe_91b2"
HMAC_SECRET = "generic-secret-55"
LIMIT = 4096

SCOPES = {
    "admin": ["admin"],
    "reader": ["read"],
    "ops": ["operate"],
    "writer": ["write:asset:pushes"],
    "pusher": ["push:asset:pushes"],
    "glob": ["push:asset:push*"],
    "other": ["push:asset:bills"],
}


def _settings() -> ApiSettings:
    return ApiSettings(
        port=0,
        hooks={
            "gh": HookSettings(provider="github", secret=SecretStr(GITHUB_SECRET)),
            "stripe": HookSettings(
                provider="stripe", secret=SecretStr(STRIPE_SECRET), tolerance=300
            ),
            "generic": HookSettings(
                provider="hmac",
                secret=SecretStr(HMAC_SECRET),
                signature_header="X-Sig",
                delivery_header="X-Delivery",
            ),
            "unregistered": HookSettings(provider="github", secret=SecretStr(GITHUB_SECRET)),
        },
    )


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """Assets gh, stripe, generic, pushes, pushes2 and bills; events up to 4096 bytes."""
    async with SqliteStateBackend(tmp_path / "state.db", max_payload_bytes=LIMIT) as backend:
        names = ["gh", "stripe", "generic", "pushes", "pushes2", "bills"]
        await backend.events.aregister_assets([Asset(n) for n in names])
        async with serve_api(backend, SCOPES, _settings()) as one:
            yield one


def _sig(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(
    body: bytes, delivery: str = "d-1", secret: str = GITHUB_SECRET
) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": "sha256=" + _sig(secret, body),
    }


def stripe_headers(
    body: bytes, *, at: float | None = None, secret: str = STRIPE_SECRET
) -> dict[str, str]:
    stamp = str(int(time.time() if at is None else at))
    signature = _sig(secret, stamp.encode() + b"." + body)
    return {"Content-Type": "application/json", "Stripe-Signature": f"t={stamp},v1={signature}"}


async def events(served: Served, asset: str | None = None) -> list[AssetEvent]:
    return await served.backend.events.alist_events(asset=asset)


async def post(
    served: Served,
    asset: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    token: str | None = None,
) -> httpx.Response:
    async with served.client(token) as client:
        return await client.post(f"/hooks/{asset}", content=body, headers=headers or {})


PUSH = json.dumps({"ref": "refs/heads/main", "after": "abc"}).encode()
STRIPE_EVENT = json.dumps({"id": "evt_1", "type": "invoice.paid", "data": {"n": 1}}).encode()


class TestTokens:
    async def test_a_push_token_commits_one_event(self, served: Served) -> None:
        """``push:asset:pushes`` commits the body as one event with Idempotency-Key as its
        dedup key; the answer names the event."""
        response = await post(
            served,
            "pushes",
            b'{"n": 1}',
            {"Content-Type": "application/json", "Idempotency-Key": "k1"},
            "pusher",
        )
        assert response.status_code == 200, response.text
        [event] = await events(served)
        assert response.json() == {
            "asset": "pushes",
            "delivery": "k1",
            "duplicate": False,
            "event_id": event.id,
        }
        assert event.asset == "pushes" and event.watcher == "webhook" and event.dedup_key == "k1"
        assert event.payload == {
            "provider": "token",
            "delivery": "k1",
            "event": None,
            "body": {"n": 1},
        }

    async def test_a_retry_with_the_same_key_commits_nothing(self, served: Served) -> None:
        """The same Idempotency-Key twice: 200 both times, the second says duplicate, one event."""
        headers = {"Idempotency-Key": "k1"}
        first = await post(served, "pushes", b"a", headers, "pusher")
        second = await post(served, "pushes", b"a", headers, "pusher")
        assert first.status_code == second.status_code == 200
        assert second.json()["duplicate"] is True and second.json()["event_id"] is None
        assert len(await events(served)) == 1

    async def test_text_bodies_are_kept_as_text(self, served: Served) -> None:
        """A body that is not JSON by its Content-Type is its UTF-8 text."""
        await post(served, "pushes", "héllo".encode(), {"Content-Type": "text/plain"}, "pusher")
        [event] = await events(served)
        assert event.payload["body"] == "héllo" and event.dedup_key is None

    async def test_glob_and_admin_push(self, served: Served) -> None:
        """``push:asset:push*`` pushes to pushes2; ``admin`` pushes anywhere."""
        assert (await post(served, "pushes2", b"x", token="glob")).status_code == 200
        assert (await post(served, "bills", b"x", token="admin")).status_code == 200
        assert [e.asset for e in await events(served)] == ["pushes2", "bills"]

    @pytest.mark.parametrize("token", ["reader", "ops", "writer", "other"])
    async def test_other_scopes_are_403(self, served: Served, token: str) -> None:
        """read, operate, write:asset:pushes and push:asset:bills may not push to pushes."""
        response = await post(served, "pushes", b"x", token=token)
        assert response.status_code == 403 and response.json()["error"] == "forbidden"
        assert await events(served) == []

    async def test_a_wrong_token_is_401(self, served: Served) -> None:
        """A forged token is 401 with the bearer challenge, even where a hook is configured."""
        forged = {"Authorization": "Bearer wk_0123456789abcdef_" + "A" * 43}
        response = await post(served, "gh", PUSH, {**github_headers(PUSH), **forged})
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert await events(served) == []

    async def test_a_push_token_reads_nothing(self, served: Served) -> None:
        """``push:asset:pushes`` is 403 on the asset's state and events."""
        async with served.client("pusher") as client:
            for path in ("/api/v1/assets", "/api/v1/assets/pushes", "/api/v1/events"):
                assert (await client.get(path)).status_code == 403, path
            put = await client.put("/api/v1/assets/pushes/state/k", json=1)
        assert put.status_code == 403

    async def test_an_unknown_asset_is_404(self, served: Served) -> None:
        """An asset the store does not know is 404 naming it; nothing written."""
        response = await post(served, "nope", b"x", token="admin")
        assert response.status_code == 404 and "'nope'" in response.json()["detail"]


class TestGithub:
    async def test_a_signed_delivery_commits(self, served: Served) -> None:
        """A correct X-Hub-Signature-256 commits; dedup key X-GitHub-Delivery; event type."""
        response = await post(served, "gh", PUSH, github_headers(PUSH, "72d3162e"))
        assert response.status_code == 200, response.text
        [event] = await events(served)
        assert event.dedup_key == "72d3162e"
        assert event.payload == {
            "provider": "github",
            "delivery": "72d3162e",
            "event": "push",
            "body": json.loads(PUSH),
        }

    async def test_a_redelivery_is_one_event(self, served: Served) -> None:
        """GitHub's redelivery (same delivery id) is 200 duplicate and commits nothing."""
        await post(served, "gh", PUSH, github_headers(PUSH))
        again = await post(served, "gh", PUSH, github_headers(PUSH))
        assert again.status_code == 200 and again.json()["duplicate"] is True
        assert len(await events(served)) == 1

    @pytest.mark.parametrize(
        ("change", "words"),
        [
            ({"X-Hub-Signature-256": None}, "no X-Hub-Signature-256"),
            ({"X-Hub-Signature-256": "sha1=" + "0" * 40}, "sha256=<64 hex digits>"),
            ({"X-Hub-Signature-256": "sha256=" + "0" * 64}, "does not match"),
            ({"X-Hub-Signature-256": "sha256=" + _sig("other", PUSH)}, "does not match"),
        ],
    )
    async def test_bad_signatures_are_401(
        self, served: Served, change: dict[str, str | None], words: str
    ) -> None:
        """A missing, malformed, wrong or other-secret signature is 401 saying which; nothing
        committed."""
        headers = {k: v for k, v in (github_headers(PUSH) | change).items() if v is not None}
        response = await post(served, "gh", PUSH, headers)
        assert response.status_code == 401, response.text
        assert response.json()["error"] == "bad_signature" and words in response.json()["detail"]
        assert await events(served) == []

    async def test_a_changed_body_is_401(self, served: Served) -> None:
        """The signature of another body does not pass."""
        response = await post(served, "gh", PUSH + b" ", github_headers(PUSH))
        assert response.status_code == 401
        assert await events(served) == []

    async def test_no_delivery_id_is_400(self, served: Served) -> None:
        """A signed request without X-GitHub-Delivery is 400 naming the header."""
        headers = github_headers(PUSH)
        del headers["X-GitHub-Delivery"]
        response = await post(served, "gh", PUSH, headers)
        assert response.status_code == 400 and "X-GitHub-Delivery" in response.json()["detail"]
        assert await events(served) == []

    async def test_a_malformed_delivery_id_is_400(self, served: Served) -> None:
        """A delivery id with a space, or longer than 200 characters, is 400."""
        for delivery in ("a b", "x" * 201):
            response = await post(served, "gh", PUSH, github_headers(PUSH, delivery))
            assert response.status_code == 400, delivery
            assert "delivery id" in response.json()["detail"]
        assert await events(served) == []

    async def test_a_configured_asset_the_store_does_not_know_is_404(self, served: Served) -> None:
        """A correctly signed delivery to a hook whose asset is not registered is 404."""
        response = await post(served, "unregistered", PUSH, github_headers(PUSH))
        assert response.status_code == 404
        assert "'unregistered'" in response.json()["detail"]


class TestStripe:
    async def test_a_signed_event_commits_with_its_id(self, served: Served) -> None:
        """A correct Stripe-Signature commits; the event's id is the dedup key, its type the
        event."""
        response = await post(served, "stripe", STRIPE_EVENT, stripe_headers(STRIPE_EVENT))
        assert response.status_code == 200, response.text
        [event] = await events(served)
        assert event.dedup_key == "evt_1"
        assert event.payload["event"] == "invoice.paid" and event.payload["provider"] == "stripe"

    async def test_a_retry_is_one_event(self, served: Served) -> None:
        """Stripe's retry of the same event, signed again later, commits nothing more."""
        await post(served, "stripe", STRIPE_EVENT, stripe_headers(STRIPE_EVENT))
        again = await post(
            served, "stripe", STRIPE_EVENT, stripe_headers(STRIPE_EVENT, at=time.time() + 5)
        )
        assert again.json()["duplicate"] is True
        assert len(await events(served)) == 1

    async def test_a_second_v1_signature_may_match(self, served: Served) -> None:
        """While a secret is rolled, the header holds several v1 signatures: one match is
        enough."""
        headers = stripe_headers(STRIPE_EVENT)
        headers["Stripe-Signature"] = headers["Stripe-Signature"].replace(
            "v1=", "v1=" + "0" * 64 + ",v1="
        )
        assert (await post(served, "stripe", STRIPE_EVENT, headers)).status_code == 200

    @pytest.mark.parametrize("offset", [-310, 310, -3600])
    async def test_a_timestamp_past_the_tolerance_is_401(
        self, served: Served, offset: float
    ) -> None:
        """A request signed 310 s ago (a replay), or 310 s ahead, is 401 naming the tolerance."""
        headers = stripe_headers(STRIPE_EVENT, at=time.time() + offset)
        response = await post(served, "stripe", STRIPE_EVENT, headers)
        assert response.status_code == 401
        assert "tolerance of 300 s" in response.json()["detail"]
        assert await events(served) == []

    async def test_a_timestamp_within_the_tolerance_passes(self, served: Served) -> None:
        """Signed 200 s ago is within 300 s."""
        headers = stripe_headers(STRIPE_EVENT, at=time.time() - 200)
        assert (await post(served, "stripe", STRIPE_EVENT, headers)).status_code == 200

    @pytest.mark.parametrize(
        "header",
        [None, "v1=" + "0" * 64, "t=12x,v1=" + "0" * 64, "t=1", "garbage"],
    )
    async def test_a_malformed_header_is_401(self, served: Served, header: str | None) -> None:
        """No header, no t, a t that is not a number, no v1: 401 saying what it must hold."""
        headers = {"Content-Type": "application/json"}
        if header is not None:
            headers["Stripe-Signature"] = header
        response = await post(served, "stripe", STRIPE_EVENT, headers)
        assert response.status_code == 401
        assert "Stripe-Signature" in response.json()["detail"]
        assert await events(served) == []

    async def test_the_wrong_secret_is_401(self, served: Served) -> None:
        """A signature with another endpoint's secret is 401."""
        headers = stripe_headers(STRIPE_EVENT, secret="whsec_other")
        response = await post(served, "stripe", STRIPE_EVENT, headers)
        assert response.status_code == 401 and "signing secret" in response.json()["detail"]

    async def test_the_timestamp_is_signed(self, served: Served) -> None:
        """Moving t to now without signing again (refreshing a replay) is 401."""
        old = stripe_headers(STRIPE_EVENT, at=time.time() - 3600)["Stripe-Signature"]
        fresh = old.replace(old.split(",")[0], f"t={int(time.time())}")
        headers = {"Content-Type": "application/json", "Stripe-Signature": fresh}
        response = await post(served, "stripe", STRIPE_EVENT, headers)
        assert response.status_code == 401 and "matches" in response.json()["detail"]

    async def test_a_body_without_an_event_id_is_400(self, served: Served) -> None:
        """A signed body that is not an event object with an id is 400."""
        body = b'{"type": "x"}'
        response = await post(served, "stripe", body, stripe_headers(body))
        assert response.status_code == 400 and "id" in response.json()["detail"]
        assert await events(served) == []


class TestGenericHmac:
    async def test_the_configured_headers(self, served: Served) -> None:
        """The configured signature header (``sha256=`` or bare hex) and delivery header."""
        body = b"plain text"
        bare = {"X-Sig": _sig(HMAC_SECRET, body), "X-Delivery": "g1"}
        prefixed = {"X-Sig": "sha256=" + _sig(HMAC_SECRET, body), "X-Delivery": "g2"}
        assert (await post(served, "generic", body, bare)).status_code == 200
        assert (await post(served, "generic", body, prefixed)).status_code == 200
        assert [e.dedup_key for e in await events(served)] == ["g1", "g2"]

    async def test_a_wrong_or_missing_signature_is_401(self, served: Served) -> None:
        """The signature of another secret, or none, is 401 naming the header."""
        body = b"plain text"
        wrong = await post(served, "generic", body, {"X-Sig": _sig("nope", body)})
        missing = await post(served, "generic", body, {"X-Hub-Signature-256": "x"})
        assert wrong.status_code == missing.status_code == 401
        assert "X-Sig" in wrong.json()["detail"] and "X-Sig" in missing.json()["detail"]
        assert await events(served) == []


class TestRefusals:
    async def test_no_token_and_no_hook_is_404(self, served: Served) -> None:
        """An unsigned request without a token to an asset with no hook is 404 saying how to
        push; nothing written."""
        response = await post(served, "pushes", b"x", github_headers(b"x"))
        assert response.status_code == 404
        assert "push:asset:pushes" in response.json()["detail"]
        assert await events(served) == []

    async def test_a_declared_length_over_the_limit_is_413(self, served: Served) -> None:
        """Content-Length over max_payload_bytes is 413 naming the limit and the setting."""
        body = b"x" * (LIMIT + 1)
        response = await post(served, "gh", body, github_headers(body))
        assert response.status_code == 413
        assert str(LIMIT) in response.json()["detail"]
        assert "max_payload_bytes" in response.json()["detail"]
        assert await events(served) == []

    async def test_a_declared_length_is_refused_before_the_body_is_sent(
        self, served: Served
    ) -> None:
        """Headers declaring 100 MB and no body byte sent: the 413 comes at once (the server
        reads nothing of the body)."""
        host, port = served.base.removeprefix("http://").split(":")
        request = (
            f"POST /hooks/pushes HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {served.tokens['pusher']}\r\n"
            "Content-Length: 100000000\r\n\r\n"
        ).encode()
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(request)
            with anyio.fail_after(5):
                head = await stream.receive()
        assert head.startswith(b"HTTP/1.1 413"), head[:100]
        assert b"the body is 100000000 bytes; at most 4096" in head
        assert await events(served) == []

    async def test_a_streamed_body_over_the_limit_is_413(self, served: Served) -> None:
        """A chunked body (no Content-Length) is cut off at the limit: 413, nothing written."""

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(64):
                yield b"y" * 1024

        async with served.client("pusher") as client:
            response = await client.post("/hooks/pushes", content=chunks())
        assert response.status_code == 413 and "over 4096 bytes" in response.json()["detail"]
        assert await events(served) == []

    async def test_a_payload_over_the_limit_once_wrapped_is_413(self, served: Served) -> None:
        """A body within the limit whose event payload (body and headers) is over it: 413."""
        body = json.dumps("z" * (LIMIT - 10)).encode()
        response = await post(
            served, "pushes", body, {"Content-Type": "application/json"}, "pusher"
        )
        assert response.status_code == 413 and "max_payload_bytes" in response.json()["detail"]
        assert await events(served) == []

    @pytest.mark.parametrize(
        ("body", "content_type", "words"),
        [
            (b"{not json", "application/json", "not a JSON value"),
            (b"[" * 300 + b"]" * 300, "application/json", "256"),
            (b"\xff\xfe", "application/octet-stream", "UTF-8"),
        ],
    )
    async def test_bad_bodies_are_400(
        self, served: Served, body: bytes, content_type: str, words: str
    ) -> None:
        """Invalid JSON, JSON nested too deep, and bytes that are not UTF-8 text are 400."""
        response = await post(served, "pushes", body, {"Content-Type": content_type}, "pusher")
        assert response.status_code == 400 and words in response.json()["detail"]
        assert await events(served) == []

    async def test_an_asset_with_a_slash(self, served: Served) -> None:
        """``a%2Fb`` is asset ``a/b``."""
        await served.backend.events.aregister_assets([Asset("a/b")])
        response = await post(served, "a%2Fb", b"x", token="admin")
        assert response.status_code == 200 and response.json()["asset"] == "a/b"

    async def test_get_is_405_with_allow(self, served: Served) -> None:
        """Only POST: another method is 405 naming it in Allow."""
        async with served.client() as client:
            response = await client.get("/hooks/gh")
        assert response.status_code == 405 and response.headers["allow"] == "POST"


class TestSecrets:
    async def test_secrets_and_signatures_never_reach_the_logs(
        self, served: Served, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Neither a secret nor a signature (right or wrong) appears in any log record."""
        caplog.set_level(logging.DEBUG)
        with capture_logs() as logs:
            good = github_headers(PUSH)
            await post(served, "gh", PUSH, good)
            await post(served, "gh", PUSH, github_headers(PUSH, secret="x"))
            await post(served, "stripe", STRIPE_EVENT, stripe_headers(STRIPE_EVENT, at=1))
        text = caplog.text + json.dumps(logs, default=str)
        assert logs, "the refusals are logged (at debug)"
        for secret in (GITHUB_SECRET, STRIPE_SECRET, good["X-Hub-Signature-256"][7:]):
            assert secret not in text

    def test_settings_need_exactly_one_secret(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Neither or both of secret and secret_env, an empty secret, or a variable that is not
        set: an error naming what to fix, and never the secret."""
        with pytest.raises(ValidationError, match="either secret or secret_env"):
            HookSettings(provider="github")
        with pytest.raises(ValidationError, match="either secret or secret_env"):
            HookSettings(provider="github", secret=SecretStr("s3cr3t-value"), secret_env="X")
        monkeypatch.delenv("WK_TEST_HOOK_SECRET", raising=False)
        with pytest.raises(ValidationError, match="'WK_TEST_HOOK_SECRET', which is not set"):
            HookSettings(provider="github", secret_env="WK_TEST_HOOK_SECRET")
        with pytest.raises(ValidationError, match="secret is empty"):
            HookSettings(provider="github", secret=SecretStr(""))
        with pytest.raises(ValidationError) as caught:
            HookSettings(provider="gitlab", secret=SecretStr("s3cr3t-value"))  # type: ignore[arg-type]
        assert "s3cr3t-value" not in str(caught.value)

    async def test_secret_env_is_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A hook whose secret is in the environment variable it names checks with it."""
        monkeypatch.setenv("WK_TEST_HOOK_SECRET", GITHUB_SECRET)
        settings = ApiSettings(
            port=0,
            hooks={"gh": HookSettings(provider="github", secret_env="WK_TEST_HOOK_SECRET")},
        )
        async with SqliteStateBackend(tmp_path / "s.db") as backend:
            await backend.events.aregister_assets([Asset("gh")])
            async with serve_api(backend, {}, settings) as one:
                assert (await post(one, "gh", PUSH, github_headers(PUSH))).status_code == 200
                bad = await post(one, "gh", PUSH, github_headers(PUSH, secret="other"))
                assert bad.status_code == 401

    def test_the_table_from_the_environment(
        self, isolated: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``WATCHKEEPER__API__HOOKS`` holds the table as JSON; asset names keep their case."""
        monkeypatch.setenv("WK_TEST_HOOK_SECRET", "from-env")
        monkeypatch.setenv(
            "WATCHKEEPER__API__HOOKS",
            '{"GitHub_Pushes": {"provider": "github", "secret_env": "WK_TEST_HOOK_SECRET"}}',
        )
        hook = load_settings().api.hooks["GitHub_Pushes"]
        assert hook.provider == "github" and hook.secret_bytes() == b"from-env"

    def test_config_show_hides_the_secret(self, isolated: Path) -> None:
        """``config show --json`` lists the hook without its secret."""
        from tests.triggerer.test_config import watchkeeper

        (isolated / "watchkeeper.toml").write_text(
            '[api.hooks.gh]\nprovider = "github"\nsecret = "s3cr3t-value"\n', encoding="utf-8"
        )
        result = watchkeeper(isolated, "config", "show", "--json")
        assert result.returncode == 0, result.stderr
        shown: dict[str, Any] = json.loads(result.stdout)["settings"]["api.hooks"]
        assert shown["value"]["gh"]["provider"] == "github"
        assert shown["value"]["gh"]["secret"] == "**********"
        assert "s3cr3t-value" not in result.stdout + result.stderr
