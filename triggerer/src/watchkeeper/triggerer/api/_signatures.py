"""Checking a webhook's signature by its sender's scheme, without the network or the store.

Each scheme is an HMAC-SHA256 keyed with the secret the sender and the asset's
``[api.hooks.<asset>]`` share:

- ``github``: ``X-Hub-Signature-256: sha256=<hex>`` of the raw body;
- ``stripe``: ``Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]``, the HMAC of
  ``"<t>." + body``; a ``t`` further than the tolerance from now is refused (a recorded
  request replayed later), after the signature matched (so an unsigned request learns
  nothing of the clock);
- ``hmac``: ``sha256=<hex>`` (or the bare hex) of the raw body in a header the asset names.

Digests are compared with :func:`hmac.compare_digest`. A refusal is an :class:`ApiError` 401
that names the header and what was wrong with it, never the secret nor the digest expected.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from ._errors import ApiError

__all__ = [
    "CHALLENGE",
    "Hook",
    "check_github",
    "check_hmac",
    "check_stripe",
    "sign",
    "signature_error",
]

CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="watchkeeper"'}
_HEX: Final = re.compile(r"[0-9a-fA-F]{64}")
_DIGITS: Final = re.compile(r"[0-9]{1,12}")


def signature_error(detail: str) -> ApiError:
    """The 401 of a missing or wrong signature."""
    return ApiError(401, "bad_signature", detail, headers=dict(CHALLENGE))


def sign(secret: bytes, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``body`` keyed with ``secret``."""
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def _matches(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected, given.lower())


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name.lower())
    if value is None or not value.strip():
        raise signature_error(f"the request has no {name} header: send the signature")
    return value.strip()


def check_github(headers: Mapping[str, str], body: bytes, secret: bytes) -> None:
    """``X-Hub-Signature-256`` is ``sha256=`` and the HMAC of ``body``; 401 otherwise."""
    value = _header(headers, "X-Hub-Signature-256")
    scheme, _, digest = value.partition("=")
    if scheme != "sha256" or not _HEX.fullmatch(digest):
        raise signature_error("X-Hub-Signature-256 must be sha256=<64 hex digits>")
    if not _matches(sign(secret, body), digest):
        raise signature_error(
            "X-Hub-Signature-256 does not match the body: check the secret on both sides"
        )


def check_hmac(headers: Mapping[str, str], body: bytes, secret: bytes, header: str) -> None:
    """``header`` is ``sha256=<hex>`` (or the bare hex) of ``body``; 401 otherwise."""
    value = _header(headers, header)
    digest = value.removeprefix("sha256=")
    if not _HEX.fullmatch(digest):
        raise signature_error(f"{header} must be sha256=<64 hex digits>")
    if not _matches(sign(secret, body), digest):
        raise signature_error(f"{header} does not match the body: check the secret on both sides")


def check_stripe(
    headers: Mapping[str, str], body: bytes, secret: bytes, *, now: float, tolerance: float
) -> None:
    """``Stripe-Signature`` holds a ``v1`` HMAC of ``"<t>." + body`` and a ``t`` within
    ``tolerance`` seconds of ``now``; 401 otherwise."""
    value = _header(headers, "Stripe-Signature")
    stamp: str | None = None
    signatures: list[str] = []
    for item in value.split(","):
        key, _, text = item.strip().partition("=")
        if key == "t":
            stamp = text
        elif key == "v1":
            signatures.append(text)
    if stamp is None or not _DIGITS.fullmatch(stamp) or not signatures:
        raise signature_error(
            "Stripe-Signature must hold t=<unix seconds> and at least one v1=<signature>"
        )
    expected = sign(secret, stamp.encode() + b"." + body)
    if not any(_HEX.fullmatch(s) and _matches(expected, s) for s in signatures):
        raise signature_error(
            "no v1 signature of Stripe-Signature matches the body: check the endpoint's "
            "signing secret"
        )
    skew = now - int(stamp)
    if abs(skew) > tolerance:
        raise signature_error(
            f"the Stripe-Signature timestamp is {abs(skew):.0f} s "
            f"{'old' if skew > 0 else 'ahead'}, over the tolerance of {tolerance:g} s "
            "(a replayed request, or a clock that is wrong)"
        )


@dataclass(frozen=True, slots=True)
class Hook:
    """An asset's webhook as the server checks it: the scheme, and the secret (never shown)."""

    provider: Literal["github", "stripe", "hmac"]
    secret: bytes = field(repr=False)
    tolerance: float = 300.0
    signature_header: str = "X-Signature-256"
    delivery_header: str = "Idempotency-Key"

    def check(self, headers: Mapping[str, str], body: bytes, *, now: float) -> None:
        """The request's signature by this hook's scheme; a 401 :class:`ApiError` when it is
        missing, malformed, wrong or (``stripe``) too old."""
        if self.provider == "github":
            check_github(headers, body, self.secret)
        elif self.provider == "stripe":
            check_stripe(headers, body, self.secret, now=now, tolerance=self.tolerance)
        else:
            check_hmac(headers, body, self.secret, self.signature_header)
