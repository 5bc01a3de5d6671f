"""The parts of :class:`~.http_poll.HttpPollWatcher` that need no network: JSON paths into a
response, cursor functions named by their import path, header checks, ``Retry-After``."""

from __future__ import annotations

import email.utils
import importlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "MISSING",
    "CursorFunction",
    "JsonPath",
    "check_headers",
    "function_path",
    "import_function",
    "json_path",
    "retry_after",
    "without_credentials",
]

CursorFunction = Callable[[Any, Mapping[str, str]], str | int | None]
"""``next_cursor(body, headers)``: the cursor after this response, or None (keep the last)."""

MISSING: Final = object()
"""What :meth:`JsonPath.find` returns when a part of the path is absent."""


class JsonPath:
    """A dotted path into a JSON document: ``data.items``, ``meta.next``, ``links.0.href``.

    Each part names a key of an object, or (digits) an index of a list; ``""`` is the document
    itself. Keys that contain a dot cannot be named; use a function then.
    """

    __slots__ = ("parts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts: tuple[str | int, ...] = tuple(
            int(part) if part.isdigit() else part for part in text.split(".") if text
        )
        if any(part == "" for part in self.parts):
            raise ValueError(f"JSON path {text!r} has an empty part")

    def __repr__(self) -> str:
        return f"JsonPath({self.text!r})"

    def find(self, document: Any) -> Any:
        """The value at this path, or ``MISSING`` when a part is absent."""
        value = document
        for part in self.parts:
            if isinstance(part, int) and isinstance(value, list):
                if part >= len(value):
                    return MISSING
                value = value[part]
            elif isinstance(value, dict) and str(part) in value:
                value = value[str(part)]
            else:
                return MISSING
        return value


def json_path(owner: str, name: str, value: object) -> JsonPath | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{owner}: {name} must be a JSON path (str) or None, got {value!r}")
    try:
        return JsonPath(value)
    except ValueError as exc:
        raise ValueError(f"{owner}: {name}: {exc}") from None


def function_path(owner: str, function: Callable[..., Any]) -> str:
    """``module:qualname`` of a module-level function, so serialize() can name it."""
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"{owner}: a cursor function must be defined at module level (it is rebuilt from "
            f"its import path), got {function!r}"
        )
    return f"{module}:{qualname}"


def import_function(owner: str, path: object) -> CursorFunction:
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(
            f"{owner}: cursor_function must be an import path 'package.module:function', "
            f"got {path!r}"
        )
    module_name, _, qualname = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{owner}: cursor_function {path!r} does not import: {exc}") from exc
    if not callable(target):
        raise TypeError(f"{owner}: cursor_function {path!r} is not callable")
    function: CursorFunction = target
    return function


def check_headers(owner: str, name: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError(f"{owner}: {name} must be a mapping of header names to str values")
    return dict(value)


def without_credentials(url: str) -> str:
    """``url`` without its ``user:password@`` part."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=host))


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delay-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
