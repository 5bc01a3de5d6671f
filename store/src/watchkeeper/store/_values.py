"""Validation and encoding of keys and values: the one place that decides what is JSON."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any, Final, Self

from .errors import (
    InvalidKeyError,
    InvalidValueError,
    KeyTypeError,
    RetentionTypeError,
    ValueTooLargeError,
    ValueTypeError,
)

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_KEY_LENGTH",
    "NEVER_EXPIRE",
    "JSONValue",
    "check_key",
    "check_retention",
    "decode_value",
    "encode_json",
    "encode_value",
]

JSONValue = Any
"""A value the store accepts: str, int, float, bool, list or dict (str keys), nested."""

MAX_KEY_LENGTH: Final = 512
DEFAULT_MAX_VALUE_BYTES: Final = 65536

_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_DECODE: Final = json.JSONDecoder().decode


class _NeverExpire:
    """The type of :data:`NEVER_EXPIRE`; a singleton that reads well in reprs."""

    _instance: _NeverExpire | None = None

    def __new__(cls) -> Self:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "NEVER_EXPIRE"

    def __reduce__(self) -> str:
        return "NEVER_EXPIRE"


NEVER_EXPIRE: Final = _NeverExpire()
"""Pass as ``retention=`` to keep a task-state key until it is deleted; GC never collects it."""


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid key; raise :class:`KeyTypeError` or :class:`InvalidKeyError`."""
    if not isinstance(key, str):
        raise KeyTypeError(key)
    if not key:
        raise InvalidKeyError(key, "a key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(key, f"{len(key)} characters, over the limit of {MAX_KEY_LENGTH}")
    return key


def check_retention(retention: object) -> timedelta | _NeverExpire | None:
    """Return ``retention`` if it is a ``timedelta``, ``NEVER_EXPIRE`` or ``None``."""
    if retention is None or retention is NEVER_EXPIRE:
        return retention
    if isinstance(retention, timedelta):
        return retention
    raise RetentionTypeError(retention)


def _check_json(value: object, path: str) -> None:
    # Walk the value ourselves: json.dumps would silently turn tuples into lists and int dict
    # keys into strings, so the value read back would differ from the one written.
    if value is None:
        raise InvalidValueError(f"value at {path} is None; JSON null is not stored")
    kind = type(value)
    if kind is str or kind is bool or kind is int:
        return
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise InvalidValueError(f"value at {path} is {value!r}, which JSON cannot represent")
        return
    if kind is list:
        items: list[object] = value  # type: ignore[assignment]
        for index, item in enumerate(items):
            if item is None:
                continue  # null inside a container is ordinary JSON
            _check_json(item, f"{path}[{index}]")
        return
    if kind is dict:
        for name, item in value.items():  # type: ignore[attr-defined]
            if not isinstance(name, str):
                raise ValueTypeError(f"{path} key {name!r}", name)
            if item is None:
                continue
            _check_json(item, f"{path}[{name!r}]")
        return
    raise ValueTypeError(path, value)


def _encode_checked(value: object, what: str) -> str:
    # Fast path, all in C: encode, decode, compare. json.dumps alone would turn tuples into
    # lists and int dict keys into strings, but then the decoded value differs from the
    # original. Any failure or difference takes the slow walk, which names the culprit.
    kind = type(value)
    if kind is int:  # watermarks, mostly: nothing to walk or compare
        return int.__repr__(value)
    if kind is str or kind is bool:
        return _ENCODER.encode(value)
    try:
        text = _ENCODER.encode(value)
        if _DECODE(text) == value:
            return text
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        _check_json(value, what)
    except RecursionError:
        raise ValueTypeError(what, value) from None
    raise ValueTypeError(what, value)  # equal-looking but not plain JSON (e.g. a cycle)


def encode_json(value: object, *, what: str = "value") -> str:
    """Encode any JSON value (``None`` allowed at the top, as for event payloads)."""
    if value is None:
        return "null"
    return _encode_checked(value, what)


def encode_value(
    key: str, value: object, *, max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES
) -> str:
    """Validate a state value and return its compact JSON text.

    ``None`` at the top level and NaN/infinities anywhere raise :class:`InvalidValueError`;
    anything that is not JSON raises :class:`ValueTypeError`; an encoding over
    ``max_value_bytes`` raises :class:`ValueTooLargeError` (``None`` disables the limit).
    """
    if value is None:
        raise InvalidValueError(f"value for key {key!r} is None; delete the key instead")
    text = _encode_checked(value, "value")
    # A UTF-8 character is at most 4 bytes: short texts need no encoding to be measured.
    if max_value_bytes is not None and len(text) * 4 > max_value_bytes:
        size = len(text.encode())
        if size > max_value_bytes:
            raise ValueTooLargeError(key, size, max_value_bytes)
    return text


def decode_value(text: str) -> JSONValue:
    """Decode JSON text written by :func:`encode_value`."""
    return json.loads(text)
