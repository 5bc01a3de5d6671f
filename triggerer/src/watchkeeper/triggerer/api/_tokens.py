"""API tokens: made once, kept as a salted hash, checked in constant time; their scopes.

A token is ``wk_<id>_<secret>``: ``id`` (16 hex digits) is the public half, the key of its row;
``secret`` (43 URL-safe characters, 256 random bits) is never stored, only
``sha256(salt + secret)`` with a random 16-byte salt. A check reads the row by id and compares
the digests with :func:`hmac.compare_digest`. Neither the token nor the digest appears in any
log line, error or repr.

Scopes:

- ``read``: every read-only route;
- ``write:asset:<glob>``: read and write the state (and read the events) of the assets whose
  names match the glob (``orders_*``);
- ``push:asset:<glob>``: ``POST /hooks/<asset>`` for the assets whose names match the glob,
  and nothing else (a sender's token: it reads nothing);
- ``operate``: list watchers, daemons, tasks and runs without their data (:mod:`._scoping`);
  pause, resume and retry watchers, pause and resume tasks, retry runs;
- ``admin``: everything.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from watchkeeper.store.protocols import ApiToken, OperatorControls

__all__ = [
    "Principal",
    "check_scope",
    "make_token",
    "still_valid",
    "verify_token",
]

_TOKEN: Final = re.compile(r"wk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
_SCOPE: Final = re.compile(r"read|operate|admin|(?:write|push):asset:[^\s]+")


def check_scope(scope: str) -> str:
    """Check that ``scope`` is a valid scope.

    :param scope: ``read``, ``operate``, ``admin``, ``write:asset:<name or glob>`` or
        ``push:asset:<name or glob>``.
    :returns: ``scope`` itself.
    :raises ValueError: not a valid scope; the message names it and the valid forms.
    """
    if not isinstance(scope, str) or not _SCOPE.fullmatch(scope):
        raise ValueError(
            f"invalid scope {scope!r}: use read, operate, admin, write:asset:<name or glob> "
            "or push:asset:<name or glob>"
        )
    return scope


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


def make_token(
    name: str, scopes: list[str], *, now: datetime, expires_in: timedelta | None = None
) -> tuple[str, ApiToken]:
    """Make a new token: the text to show once, and the row to store (without the secret).

    :param name: the token's name (at most 200 characters), recorded as ``api:<name>`` on writes.
    :param scopes: at least one scope (see :func:`check_scope`); duplicates are dropped.
    :param now: the creation time.
    :param expires_in: how long the token is valid; None for no expiry.
    :returns: ``(text, row)``: the token to hand over, and the row to store with
        ``acreate_token`` (a salted digest, never the secret).

    :raises ValueError: an empty or too long name, no scope, or an invalid scope.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValueError(f"invalid token name {name!r}: a non-empty name of at most 200 chars")
    if not scopes:
        raise ValueError("a token needs at least one --scope")
    checked = tuple(dict.fromkeys(check_scope(scope) for scope in scopes))
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    row = ApiToken(
        name=name,
        token_id=token_id,
        scopes=checked,
        salt=salt,
        digest=_digest(salt, secret),
        created_at=now,
        expires_at=None if expires_in is None else now + expires_in,
    )
    return f"wk_{token_id}_{secret}", row


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: the token's name and scopes, and the public half of its id (what
    :func:`still_valid` checks again, and what open streams are counted by)."""

    name: str
    scopes: tuple[str, ...]
    token_id: str = ""

    @property
    def writer_name(self) -> str:
        """The writer recorded for this principal's writes: ``api:<token name>``."""
        return f"api:{self.name}"

    def _has(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    def can_read(self) -> bool:
        """Whether the token reads everything (``read`` or ``admin``)."""
        return self._has("read")

    def can_operate(self) -> bool:
        """Whether the token controls watchers, tasks and runs (``operate`` or ``admin``)."""
        return self._has("operate")

    def can_see_watchers(self) -> bool:
        """Whether the token lists watchers, daemons, tasks and runs (``read`` or
        ``operate``)."""
        return self.can_read() or self.can_operate()

    def can_write_asset(self, asset: str) -> bool:
        """Whether the token writes ``asset``'s state (a matching ``write:asset:`` glob, or
        ``admin``)."""
        if "admin" in self.scopes:
            return True
        return any(
            scope.startswith("write:asset:") and fnmatch.fnmatchcase(asset, scope[12:])
            for scope in self.scopes
        )

    def can_push_asset(self, asset: str) -> bool:
        """Whether the token pushes events to ``asset`` through ``POST /hooks/<asset>`` (a
        matching ``push:asset:`` glob, or ``admin``)."""
        if "admin" in self.scopes:
            return True
        return any(
            scope.startswith("push:asset:") and fnmatch.fnmatchcase(asset, scope[11:])
            for scope in self.scopes
        )

    def can_read_asset(self, asset: str) -> bool:
        """Whether the token reads ``asset``'s state and events (``read``, or writes it)."""
        return self.can_read() or self.can_write_asset(asset)


async def verify_token(store: OperatorControls, text: str, now: datetime) -> Principal | None:
    """Check a presented token and return who it acts as.

    Every path that reads a row compares digests, so timing tells nothing about the secret.

    :param store: the store holding the tokens' rows.
    :param text: the token as presented (``wk_<id>_<secret>``).
    :param now: the time its expiry is compared with.
    :returns: the token's principal; None for a malformed, unknown, wrong, revoked or expired token.
    """
    match = _TOKEN.fullmatch(text)
    if match is None:
        return None
    token_id, secret = match.groups()
    row = await store.aget_token(token_id)
    if row is None:
        return None
    valid = hmac.compare_digest(row.digest, _digest(row.salt, secret))
    if not valid or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= now:
        return None
    return Principal(row.name, row.scopes, row.token_id)


async def still_valid(store: OperatorControls, principal: Principal, now: datetime) -> bool:
    """Whether the token ``principal`` was verified with is still neither revoked nor expired
    (its secret was checked once; a token's row never changes but for its revocation)."""
    row = await store.aget_token(principal.token_id)
    if row is None or row.revoked_at is not None:
        return False
    return row.expires_at is None or row.expires_at > now
