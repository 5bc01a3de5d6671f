"""Reading a request: every route parses ids, ETags, names in paths and JSON bodies here.

One rule for each kind of input, so a route cannot accept what another refuses:

- integers (ids, ``after``, ``limit``, ``Content-Length``, ``Last-Event-ID``) are ASCII
  decimal digits (``²`` or ``٣`` are not digits here), at most 19 of them, and within what a
  64-bit database integer holds (``0 .. 2**63 - 1``);
- ETags follow RFC 9110: ``If-Match``/``If-None-Match`` hold ``*`` or a comma-separated list
  of ``"opaque"`` or ``W/"opaque"`` tags (a bare version number ``3`` is read as ``"3"``);
  ``If-Match`` compares strongly (a weak tag never
  matches), ``If-None-Match`` weakly;
- a name in a path is one segment: a ``/`` inside a name travels as ``%2F`` (what
  ``encodeURIComponent`` sends), so ``/api/v1/assets/a%2Fb/state`` is asset ``a/b``;
- a JSON body is at most the route's byte limit and nested at most ``MAX_VALUE_DEPTH`` deep,
  checked before it is decoded.

Every refusal is an :class:`ApiError` 400 (413 for size) naming what was wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final
from urllib.parse import quote, unquote

from starlette.requests import Request
from watchkeeper.store import MAX_BIGINT, MAX_VALUE_DEPTH

from ._errors import ApiError

__all__ = [
    "MAX_ID",
    "PathSegments",
    "Preconditions",
    "check_length",
    "decode_json",
    "int_param",
    "json_body",
    "parse_int",
    "path_param",
    "raw_body",
    "stream_start",
]

MAX_ID: Final = MAX_BIGINT
"""The largest id, position or version the API reads: what a 64-bit database integer holds."""

_DIGITS: Final = re.compile(r"-?[0-9]{1,19}")
# RFC 9110 entity-tag list: "*" or 1#( [ "W/" ] DQUOTE *etagc DQUOTE ), with optional spaces.
# A bare version number (``If-Match: 3``) is read as its ETag (``"3"``): clients send it.
_ETAG: Final = re.compile(r'[ \t]*(?:(W/)?"([\x21\x23-\x7e\x80-\xff]*)"|([0-9]+))[ \t]*(?:,|$)')


def parse_int(text: str, what: str, *, low: int = 0, high: int = MAX_ID) -> int:
    """``text`` as an integer in ``[low, high]``: ASCII decimal digits with an optional ``-``.

    Raises :class:`ApiError` 400 naming ``what``, the bounds and the text otherwise.
    """
    if not _DIGITS.fullmatch(text):
        raise ApiError(
            400, "bad_request", f"{what} must be a decimal integer (ASCII digits), got {text!r}"
        )
    value = int(text)
    if value < low or value > high:
        raise ApiError(400, "bad_request", f"{what} must be between {low} and {high}, got {text}")
    return value


def int_param(request: Request, name: str, default: int, low: int, high: int | None = None) -> int:
    """The query parameter ``name`` as an integer in ``[low, high]`` (``high`` None: the largest
    id), or ``default`` when it is absent (an empty one is refused)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    return parse_int(raw, name, low=low, high=MAX_ID if high is None else high)


def stream_start(request: Request) -> int | None:
    """Where a live stream starts: after ``Last-Event-ID`` if sent, else after ``?after=``;
    None when neither is given (the stream starts at the newest event)."""
    last_id = request.headers.get("last-event-id")
    if last_id is not None:
        return parse_int(last_id.strip(), "Last-Event-ID")
    return int_param(request, "after", -1, 0) if "after" in request.query_params else None


def path_param(request: Request, name: str) -> str:
    """The path parameter ``name``, decoded: a ``%2F`` in it is a ``/`` of the name."""
    return unquote(request.path_params[name])


# -- conditional requests (RFC 9110 section 13) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tags:
    """A parsed ``If-Match``/``If-None-Match``: ``any`` for ``*``, else ``(weak, opaque)``s."""

    any: bool
    tags: tuple[tuple[bool, str], ...]

    def matches(self, version: int | None, *, strong: bool) -> bool:
        if version is None:
            return False  # no current representation: nothing matches, not even "*"
        if self.any:
            return True
        text = str(version)
        return any(opaque == text and not (strong and weak) for weak, opaque in self.tags)


def _parse_tags(value: str, header: str) -> _Tags:
    text = value.strip(" \t")
    if text == "*":
        return _Tags(True, ())
    tags: list[tuple[bool, str]] = []
    pos = 0
    while pos < len(text):
        found = _ETAG.match(text, pos)
        if found is None or found.end() == pos:
            raise ApiError(
                400,
                "bad_request",
                f"{header} must be * or a list of ETags such as '\"3\"' or 'W/\"3\"', "
                f"got {value!r}",
            )
        opaque = found.group(2) if found.group(3) is None else found.group(3)
        tags.append((found.group(1) is not None, opaque))
        pos = found.end()
    if not tags or text.endswith(","):
        raise ApiError(400, "bad_request", f"{header} holds no ETag, got {value!r}")
    return _Tags(False, tuple(tags))


@dataclass(frozen=True, slots=True)
class Preconditions:
    """A request's ``If-Match`` and ``If-None-Match``, evaluated in the order of RFC 9110."""

    if_match: _Tags | None
    if_none_match: _Tags | None

    @classmethod
    def of(cls, request: Request) -> Preconditions:
        """The request's preconditions; 400 when a header is not an ETag list."""
        match = request.headers.get("if-match")
        none_match = request.headers.get("if-none-match")
        return cls(
            None if match is None else _parse_tags(match, "If-Match"),
            None if none_match is None else _parse_tags(none_match, "If-None-Match"),
        )

    @property
    def given(self) -> bool:
        return self.if_match is not None or self.if_none_match is not None

    def failure(self, version: int | None, *, safe: bool) -> int | None:
        """The status when the preconditions fail for the current ``version`` (None: absent):
        412, or 304 for a failed ``If-None-Match`` on a read (``safe``); None when they hold."""
        if self.if_match is not None and not self.if_match.matches(version, strong=True):
            return 412
        if self.if_none_match is not None and self.if_none_match.matches(version, strong=False):
            return 304 if safe else 412
        return None


# -- bodies ---------------------------------------------------------------------------------------

_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DEPTH_STEP: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in _DEPTH_STEP)


def _depth(body: bytes) -> int:
    """How deeply brackets nest in ``body`` (outside strings), without decoding it."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_length(request: Request, limit: int, setting: str = "") -> None:
    """413 when the request's ``Content-Length`` passes ``limit`` (before any byte is read);
    ``setting`` names what sets the limit, for the message."""
    declared = request.headers.get("content-length")
    if declared is not None and parse_int(declared.strip(), "Content-Length") > limit:
        raise ApiError(
            413, "too_large", f"the body is {declared.strip()} bytes; at most {limit}{setting}"
        )


async def raw_body(request: Request, limit: int, setting: str = "") -> bytes:
    """The request's body, at most ``limit`` bytes: 413 when ``Content-Length`` passes it
    (nothing read) or as soon as the bytes read do (the rest is never read)."""
    check_length(request, limit, setting)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "too_large", f"the body is over {limit} bytes{setting}")
    return bytes(body)


async def json_body(request: Request, limit: int) -> Any:
    """The request's body decoded as one JSON value of at most ``limit`` bytes.

    413 when ``Content-Length`` or the bytes read pass ``limit``; 400 when the body is not
    JSON (``NaN`` and ``Infinity`` are not JSON) or nests deeper than ``MAX_VALUE_DEPTH``.
    """
    return decode_json(await raw_body(request, limit))


def decode_json(body: bytes, what: str = "the body") -> Any:
    """``body`` decoded as one JSON value: 400 when it is not JSON (``NaN`` and ``Infinity``
    are not JSON) or nests deeper than ``MAX_VALUE_DEPTH`` (checked before decoding)."""
    depth = _depth(body)
    if depth > MAX_VALUE_DEPTH:
        raise ApiError(
            400,
            "invalid_json",
            f"{what} nests {depth} lists or objects deep; at most {MAX_VALUE_DEPTH}",
        )
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"{what} is not a JSON value: {exc}") from None


# -- names with "/" in paths ----------------------------------------------------------------------

_App = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class PathSegments:
    """ASGI middleware: route ``/api/v1`` and ``/hooks`` paths by their segments as sent, not
    as decoded.

    A server decodes ``%2F`` into ``/`` before routing, which would split a name holding a
    ``/`` into two segments. This keeps each segment's ``/`` (and ``%``) escaped in the path
    the routes match, and :func:`path_param` decodes them.
    """

    def __init__(self, app: _App) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        raw = scope.get("raw_path")
        if scope["type"] == "http" and raw and scope.get("path", "").startswith(_SEGMENTED):
            segments = raw.split(b"?", 1)[0].decode("latin-1").split("/")
            path = "/".join(quote(unquote(s), safe="".join(_SAFE)) for s in segments)
            scope = dict(scope, path=path)
        await self.app(scope, receive, send)


_SEGMENTED: Final = ("/api/v1/", "/hooks/")
# Every printable ASCII character but "/" and "%" stays as it is in the matched path (so the
# path of every ordinary request is unchanged); non-ASCII stays decoded.
_SAFE: Final = frozenset(chr(c) for c in range(0x20, 0x7F)) - {"/", "%"}
