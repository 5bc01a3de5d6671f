"""Secrets out of everything watchkeeper prints: DSNs, URLs, error messages, reprs, log lines.

One rule for every URL, whoever prints it: its secrets are

- the password of its userinfo (``user:password@``), and the whole userinfo of a NATS URL
  (``nats://TOKEN@host``, ``tls://``, ``ws://``, ``wss://``), where a lone user is a token;
- the value of every query (or fragment) parameter that carries a credential, named, in any
  case, ``password``, ``passwd``, ``pwd``, ``secret``, ``token``, ``access_token``,
  ``api_key``, ``apikey``, ``key``, ``signature``, ``sig`` or ``auth``; a name that ends in
  one of the longer of these (``sslpassword``, ``client_secret``, ``refresh_token``,
  ``x-api-key``, ``X-Amz-Signature``) counts too.

Each secret becomes ``***``. Two tools apply it, one for each kind of input:

- :func:`redact_dsn` takes one connection string or URL, parses it, and returns it with its
  secrets masked, and also the ``password=`` of a keyword DSN (``host=db password=s``). A
  string that parses as neither form is never echoed: the result is ``<unparsable dsn>``.
- :func:`redact_secrets` takes free text (an exception message, a repr, a rendered log line)
  and masks the secrets of every URL in it, every credential parameter of a query string
  (``?token=…``, ``&api_key=…``, also of a relative URL) and every ``password=value``. It
  cannot know every secret; it removes the ones a URL or a connection string carries, which
  is how a credential usually travels through a program.
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

# Query (and fragment) parameters that carry a credential: the names of the module docstring;
# a longer one may end a longer name (client_secret, x-api-key), the short ones stand alone.
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&;#]"
    r"(?:[A-Za-z0-9_.-]*(?:password|passwd|pwd|secret|token|api_key|apikey|api-key|signature)"
    r"|key|sig|auth)=)"
    r"[^\s&#'\"\\)\]}<>]+",
    re.IGNORECASE,
)

# A lone user is a token in these schemes (nats://TOKEN@host).
_TOKEN_USER_SCHEMES: Final = frozenset({"nats", "tls", "ws", "wss"})
_TOKEN_USERINFO = re.compile(r"(?P<head>\b(?:nats|tls|wss?)://)[^\s:/@'\"]+@", re.IGNORECASE)

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
    ``"cannot reach redis://:***@cache:6379/0"``, ``"GET /feed?api_key=abc&n=1"`` becomes
    ``"GET /feed?api_key=***&n=1"``. Text without any of these forms comes back unchanged, so
    calling this on every log line costs a scan and nothing more.
    """
    if "@" in text:
        text = _URL_USERINFO.sub(rf"\g<head>:{MASK}@", text)
        text = _TOKEN_USERINFO.sub(rf"\g<head>{MASK}@", text)
    if "=" in text:
        text = _KEYWORD_VALUE.sub(rf"\g<head>{MASK}", text)
        text = _QUERY_SECRET.sub(rf"\g<head>{MASK}", text)
    return text


def redact_dsn(dsn: str) -> str:
    """The connection string or URL ``dsn`` with its secrets replaced by ``***``, for messages.

    Handles URLs (``postgresql://user:secret@host/db``, ``...?password=secret``,
    ``https://host/feed?api_key=secret``, ``nats://TOKEN@host``: the rule of the module
    docstring) and libpq keyword DSNs (``host=db user=app password='s e c'``). Anything else, including a URL that
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
    if at and parts.scheme.lower() in _TOKEN_USER_SCHEMES:
        head += f"{MASK}@{hostport}"
    elif at and ":" in userinfo:
        user = userinfo.partition(":")[0]
        head += f"{user}:{MASK}@{hostport}"
    else:
        head += after[:end]
    rest = _KEYWORD_VALUE.sub(rf"\g<head>{MASK}", after[end:])
    return head + _QUERY_SECRET.sub(rf"\g<head>{MASK}", rest)


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
