"""The OpenAPI description of ``POST /hooks/{asset}`` (see :mod:`._hooks`).

A client built from the document pushes with a bearer token (``push:asset:<glob>``); the
signature schemes of senders (GitHub, Stripe, a generic HMAC) are described in the
operation's text, since a client would need the asset's secret to use them.
"""

from __future__ import annotations

from typing import Any

from watchkeeper.store import MAX_NAME_BYTES

from ._hooks import MAX_DELIVERY
from ._schemas import ref

__all__ = ["hook_paths"]


def _json(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema}},
        **extra,
    }


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return _json(description, ref("Error"), **extra)


_DESCRIPTION = (
    "Commit the body as one event of the asset, then answer 200 (a sender retries anything "
    "else). With a bearer token of scope push:asset:<glob> (or admin), the delivery id is "
    "Idempotency-Key. Without a token, the asset's [api.hooks.<asset>] checks the sender's "
    "signature: github (X-Hub-Signature-256: sha256=<HMAC-SHA256 of the body>, delivery id "
    "X-GitHub-Delivery, event X-GitHub-Event), stripe (Stripe-Signature: t=<unix "
    "seconds>,v1=<HMAC-SHA256 of 't.body'>, t within the tolerance; delivery id the event's "
    "id) or hmac (sha256=<hex> in the configured header, delivery id in the configured "
    "header). A delivery id already committed for the asset commits nothing again and is "
    "answered 200 with duplicate true. The payload is {provider, delivery, event, body}: the "
    "JSON value of a JSON body, else its UTF-8 text."
)


def hook_paths() -> dict[str, Any]:
    """``/hooks/{asset}``: one operation."""
    return {
        "/hooks/{asset}": {
            "post": {
                "summary": "push one event to an asset (a webhook)",
                "description": _DESCRIPTION,
                "security": [{"bearer": []}, {}],
                "parameters": [
                    {
                        "name": "asset",
                        "in": "path",
                        "required": True,
                        "description": (
                            f"a registered asset's name (at most {MAX_NAME_BYTES} bytes of "
                            "UTF-8, no control character); a '/' in it is sent as %2F"
                        ),
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_NAME_BYTES,
                            "pattern": "^[^\\u0000-\\u001f\\u007f]+$",
                        },
                    },
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "description": (
                            "the delivery id, the event's dedup key: send the same one "
                            "with each retry of a delivery"
                        ),
                        "schema": {
                            "type": "string",
                            "pattern": f"^[!-~]{{1,{MAX_DELIVERY}}}$",
                        },
                    },
                ],
                "requestBody": {
                    "required": False,
                    "content": {
                        "application/json": {"schema": {}},
                        "text/plain": {"schema": {"type": "string"}},
                    },
                },
                "responses": {
                    "200": _json(
                        "committed (or committed before: duplicate true, nothing written)",
                        ref("HookReceipt"),
                    ),
                    "400": _error(
                        "a body that is not JSON by its Content-Type nor UTF-8 text, a "
                        "missing or malformed delivery id, or a name the store refuses"
                    ),
                    "401": _error(
                        "no valid bearer token, or a missing, wrong or too old signature",
                        headers={
                            "WWW-Authenticate": {"required": True, "schema": {"type": "string"}}
                        },
                    ),
                    "403": _error("the token has no push:asset scope for the asset"),
                    "404": _error(
                        "no such (active) asset, or no [api.hooks] entry for an unsigned "
                        "request without a token"
                    ),
                    "413": _error("the body is over [events] max_payload_bytes"),
                    "501": _error("the store keeps no event log or tokens"),
                    "503": _error("the store does not answer"),
                },
            }
        }
    }
