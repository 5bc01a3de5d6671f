"""Passwords out of everything watchkeeper prints: DSNs, error messages, reprs, log lines.

Two tools, one for each kind of input:

- :func:`redact_dsn` takes one connection string, parses it, and returns it with its password
  replaced by ``***``: a URL's ``user:password@``, a ``?password=`` query parameter, or the
  ``password=`` of a keyword DSN (``host=db password=s``). A string that parses as neither
  form is never echoed: the result is ``<unparsable dsn>``.
- :func:`redact_secrets` takes free text (an exception message, a repr, a rendered log line)
  and replaces the password of every URL and every ``password=value`` in it. It cannot know
  every secret; it removes the ones a connection string carries, which is how a password
  usually travels through a program.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

__all__ = ["MASK", "UNPARSABLE_DSN", "redact_data", "redact_dsn", "redact_secrets"]

MASK: Final = "***"
"""What a password is replaced with."""

UNPARSABLE_DSN: Final = "<unparsable dsn>"
"""What :func:`redact_dsn` returns for text that is neither a URL nor a keyword DSN."""

# Keys that carry a password in libpq's keyword DSNs and in URL query strings (``password``,
# ``sslpassword``, and the ``db_password``/``passwd``/``pwd`` spellings of other drivers).
_PASSWORD_KEY: Final = r"[A-Za-z0-9_]*(?:password|passwd|pwd)"

# scheme://user:password@ — the user part has no ':', '/', '@', quote or space; the password
# runs to the last '@' before a '/', a quote or a space (an unencoded '@' stays inside the match,
# so more is masked rather than less).
_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):[^\s/'\"]*@")

# password=value, as a query parameter or in a keyword DSN. The value is a quoted string
# (single quotes, or double quotes possibly JSON-escaped as \"...\"), or a bare word.
_KEYWORD_VALUE = re.compile(
    rf"(?P<head>(?<![A-Za-z0-9_]){_PASSWORD_KEY}\s*=\s*)"
    r"(?:'(?:[^'\\]|\\.)*'|\\?\"[^\"]*?\\?\"|[^\s&;,'\"\\)\]}]+)",
    re.IGNORECASE,
)

# One ``key = value`` pair of a libpq keyword DSN: a bare value, or one in single quotes with
# backslash escapes.
_CONNINFO_PAIR = re.compile(
    r"\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>'(?:[^'\\]|\\.)*'|[^\s']*)"
)
_IS_PASSWORD_KEY = re.compile(_PASSWORD_KEY, re.IGNORECASE)


def redact_secrets(text: str) -> str:
    """``text`` with the password of every URL and every ``password=...`` replaced by ``***``.

    ``"cannot reach redis://:hunter2@cache:6379/0"`` becomes
    ``"cannot reach redis://:***@cache:6379/0"``. Text without either form comes back
    unchanged, so calling this on every log line costs a scan and nothing more.
    """
    if "@" in text:
        text = _URL_USERINFO.sub(rf"\g<head>:{MASK}@", text)
    if "=" in text:
        text = _KEYWORD_VALUE.sub(rf"\g<head>{MASK}", text)
    return text


def redact_dsn(dsn: str) -> str:
    """The connection string ``dsn`` with its password replaced by ``***``, for messages.

    Handles URLs (``postgresql://user:secret@host/db``, ``...?password=secret``) and libpq
    keyword DSNs (``host=db user=app password='s e c'``). Anything else, including a URL that
    does not parse (a bad port, a space), is returned as ``<unparsable dsn>``: text that cannot
    be parsed cannot be shown to be free of a password.
    """
    if "://" in dsn:
        return _redact_url(dsn)
    return _redact_conninfo(dsn)


def _redact_url(dsn: str) -> str:
    """A URL with its userinfo password and ``password=`` parameters masked, or the marker."""
    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return UNPARSABLE_DSN
    if not parts.scheme or any(ch.isspace() for ch in dsn):
        return UNPARSABLE_DSN
    head = dsn[: dsn.index("://") + 3]
    after = dsn[len(head) :]
    end = next((i for i, ch in enumerate(after) if ch in "/?#"), len(after))
    userinfo, at, hostport = after[:end].rpartition("@")  # the host follows the last '@'
    if at and ":" in userinfo:
        user = userinfo.partition(":")[0]
        head += f"{user}:{MASK}@{hostport}"
    else:
        head += after[:end]
    return head + _KEYWORD_VALUE.sub(rf"\g<head>{MASK}", after[end:])


def _redact_conninfo(dsn: str) -> str:
    """A libpq ``key=value`` DSN with its password masked, or the unparsable marker."""
    pairs: list[str] = []
    pos, end = 0, len(dsn.rstrip())
    while pos < end:
        match = _CONNINFO_PAIR.match(dsn, pos)
        if match is None:
            return UNPARSABLE_DSN
        key, value = match["key"], match["value"]
        pairs.append(f"{key}={MASK if _IS_PASSWORD_KEY.fullmatch(key) else value}")
        pos = match.end()
    return " ".join(pairs) if pairs else UNPARSABLE_DSN


def redact_data(value: object) -> object:
    """``value`` (JSON data) with :func:`redact_secrets` applied to every string in it, keys
    included: what the CLI and the HTTP API show of events, statuses and errors."""
    if isinstance(value, str):
        return redact_secrets(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(item) for item in value]
    return value
