"""``POST /hooks/{asset}``: events pushed to an asset by a sender (a webhook), committed before
the answer.

Two ways in:

- ``Authorization: Bearer <token>`` with a ``push:asset:<glob>`` scope matching the asset (or
  ``admin``); the delivery id is the ``Idempotency-Key`` header, when sent;
- a signature by the scheme of the asset's ``[api.hooks.<asset>]`` (:mod:`._signatures`); the
  delivery id is GitHub's ``X-GitHub-Delivery``, the ``id`` of a Stripe event, or the
  ``hmac`` hook's ``delivery_header``.

The body is read up to ``[events] max_payload_bytes`` (413 as soon as it passes, or at once
from ``Content-Length``), checked, and committed as one event of the asset with the delivery
id as its dedup key; only then is the answer 200. A sender that saw no 200 (a timeout, a
daemon killed mid-request) sends again: the commit either happened, and the retry is answered
200 ``duplicate: true`` with nothing written, or it did not, and the retry commits it. So each
delivery is one event, whatever the kills and retries (without a delivery id, a retry may
commit twice: send one).

The event's payload is ``{"provider", "delivery", "event", "body"}``: ``body`` is the JSON
value of a JSON body (``Content-Type`` ``application/json`` or ``*+json``), else its UTF-8
text; ``event`` the sender's event type (``X-GitHub-Event``, a Stripe event's ``type``), or
None. Its watcher is ``webhook``.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import AssetNotFoundError, PayloadTooLargeError
from watchkeeper.store.protocols import EventCommit, Writer, encode_payload, get_logger

from ._base import ApiError, authenticate, ctx_of, require
from ._parse import decode_json, path_param, raw_body
from ._signatures import Hook

__all__ = ["WATCHER", "receive_hook"]

log = get_logger(__name__)

WATCHER: Final = "webhook"
"""The watcher name of every event a webhook commits."""
_SETTING: Final = " ([events] max_payload_bytes)"
MAX_DELIVERY: Final = 200
"""The longest delivery id (the event's dedup key) taken."""
_DELIVERY: Final = re.compile(f"[!-~]{{1,{MAX_DELIVERY}}}")


async def receive_hook(request: Request) -> Response:
    """``POST /hooks/{asset}``: authenticate, read the body within the limit, commit, answer."""
    ctx = ctx_of(request)
    asset = path_param(request, "asset")
    limit = ctx.backend.max_payload_bytes
    headers = request.headers
    hook: Hook | None = None
    if "authorization" in headers:
        principal = await authenticate(request)
        require(principal.can_push_asset(asset), principal, f"push events to asset {asset!r}")
        writer = principal.name
    else:
        hook = ctx.hooks.get(asset)
        if hook is None:
            raise ApiError(
                404,
                "not_found",
                f"asset {asset!r} takes no signed webhooks: configure "
                f"[api.hooks.{asset!r}], or send a bearer token with scope "
                f"push:asset:{asset}",
            )
        writer = f"webhook:{hook.provider}"
    body = await raw_body(request, limit, _SETTING)
    if hook is not None:
        try:
            hook.check(headers, body, now=time.time())
        except ApiError as exc:
            log.debug("webhook_refused", asset=asset, provider=hook.provider, reason=exc.detail)
            raise
    payload = _payload(hook, headers, body)
    try:
        text = encode_payload(payload, max_payload_bytes=limit)
    except PayloadTooLargeError as exc:
        raise ApiError(413, "too_large", str(exc)) from None
    delivery = payload["delivery"]
    commit = EventCommit(WATCHER, (asset,), text, dedup_key=delivery, writer=Writer("api", writer))
    try:
        events = await ctx.events.acommit(commit)
    except AssetNotFoundError:
        raise ApiError(
            404,
            "not_found",
            f"no active asset named {asset!r}: declare it in a definition file, or "
            f"`watchkeeper assets register {asset}`",
        ) from None
    return JSONResponse(
        {
            "asset": asset,
            "delivery": delivery,
            "duplicate": not events,
            "event_id": events[0].id if events else None,
        }
    )


def _payload(hook: Hook | None, headers: Any, body: bytes) -> dict[str, Any]:
    """The event's payload: the provider, the delivery id, the event type and the body."""
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    is_json = content_type == "application/json" or content_type.endswith("+json")
    value = decode_json(body, "the webhook's body") if is_json else _text(body)
    provider = "token" if hook is None else hook.provider
    event: Any = None
    if provider == "github":
        delivery = _required_header(headers, "X-GitHub-Delivery", "GitHub's delivery id")
        event = headers.get("x-github-event")
    elif provider == "stripe":
        if not isinstance(value, dict) or not isinstance(value.get("id"), str):
            raise ApiError(
                400,
                "bad_request",
                "a Stripe webhook's body must be a JSON event object with a string id "
                "(send Content-Type: application/json)",
            )
        delivery, event = value["id"], value.get("type")
    else:
        name = "Idempotency-Key" if hook is None else hook.delivery_header
        delivery = headers.get(name.lower())
    if delivery is not None and not _DELIVERY.fullmatch(delivery):
        raise ApiError(
            400,
            "bad_request",
            f"the delivery id must be 1 to {MAX_DELIVERY} printable ASCII characters "
            f"without spaces, got {delivery[: MAX_DELIVERY + 1]!r}",
        )
    return {"provider": provider, "delivery": delivery, "event": event, "body": value}


def _required_header(headers: Any, name: str, what: str) -> str:
    value: str | None = headers.get(name.lower())
    if not value:
        raise ApiError(400, "bad_request", f"the request has no {name} header ({what})")
    return value


def _text(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise ApiError(
            400,
            "bad_request",
            "the webhook's body is neither JSON (by its Content-Type) nor UTF-8 text",
        ) from None
