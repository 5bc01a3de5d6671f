"""Validation and encoding of keys and values: the one place that decides what is JSON."""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import math
import re
from datetime import timedelta
from typing import Any, Final, Self

from .errors import (
    InvalidKeyError,
    InvalidNameError,
    InvalidValueError,
    KeyTypeError,
    PayloadTooLargeError,
    RetentionTypeError,
    ValueTooLargeError,
    ValueTypeError,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_KEY_LENGTH",
    "MAX_NAME_BYTES",
    "NEVER_EXPIRE",
    "JSONValue",
    "check_key",
    "check_name",
    "check_retention",
    "decode_value",
    "encode_json",
    "encode_payload",
    "encode_payload_decoded",
    "encode_value",
]

JSONValue = Any
"""A value the store accepts: str, int, float, bool, list or dict (str keys), nested."""

MAX_KEY_LENGTH: Final = 512
MAX_NAME_BYTES: Final = 1024
"""The UTF-8 size limit of every name (keys, asset and watcher names, dedup keys).

Well under PostgreSQL's btree row limit (~2,700 bytes), so an indexed name never fails there.
"""

# C0 controls and DEL: a name is printed in logs, tables and URLs, and PostgreSQL refuses NUL.
_CONTROL = re.compile("[\x00-\x1f\x7f]")
DEFAULT_MAX_VALUE_BYTES: Final = 65536
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1_048_576
"""The default ``[events] max_payload_bytes``: 1 MiB of JSON per event payload."""

_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_DECODE: Final = json.JSONDecoder().decode
# The C encoder and scanner behind _ENCODER.encode and _DECODE, built once: the same text and
# values, without building an encoder per call and matching whitespace around every decode
# (a batch pays those once per event). No circular-reference table: a cycle ends in a
# RecursionError, which the slow path then reports. None when the C accelerator is missing.
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_make_scanner: Any = getattr(json.scanner, "c_make_scanner", None)
_C_ENCODE: Final[Any] = (
    None
    if _make_encoder is None
    else _make_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
)
_C_SCAN: Final[Any] = None if _make_scanner is None else _make_scanner(json.JSONDecoder())


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


def _name_problem(name: str, max_chars: int | None) -> str | None:
    """Why ``name`` breaks the naming rule, or None when it keeps it."""
    if not name:
        return "must not be empty"
    if max_chars is not None and len(name) > max_chars:
        return f"{len(name)} characters, over the limit of {max_chars}"
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "not valid UTF-8 (it contains a lone surrogate)"
    if size > MAX_NAME_BYTES:
        return f"{size} bytes in UTF-8, over the limit of {MAX_NAME_BYTES}"
    found = _CONTROL.search(name)
    if found is not None:
        return f"contains the control character {found.group()!r} at {found.start()}"
    return None


def check_name(name: object, *, what: str) -> str:
    """Return ``name`` if it keeps the naming rule, else raise :class:`InvalidNameError`.

    ``what`` names the kind of name in the message ("asset name", "watcher name", "dedup key").
    A name that is not a ``str`` is a :class:`KeyTypeError` (a ``TypeError``).
    """
    if not isinstance(name, str):
        raise KeyTypeError(name, what=what)
    problem = _name_problem(name, None)
    if problem is not None:
        raise InvalidNameError(what, name, problem)
    return name


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid key; raise :class:`KeyTypeError` or :class:`InvalidKeyError`.

    Keys follow the naming rule of :func:`check_name` and are at most ``MAX_KEY_LENGTH``
    characters.
    """
    if not isinstance(key, str):
        raise KeyTypeError(key)
    problem = _name_problem(key, MAX_KEY_LENGTH)
    if problem is not None:
        raise InvalidKeyError(key, problem)
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


def encode_payload(
    value: object, *, max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES
) -> str:
    """Validate an event payload (``None`` allowed) and return its compact JSON text.

    Raises what :func:`encode_json` raises, and :class:`PayloadTooLargeError` when the
    encoding is over ``max_payload_bytes`` (``None`` disables the limit).
    """
    text = encode_json(value, what="payload")
    # As in encode_value: a UTF-8 character is at most 4 bytes, so a payload under a quarter
    # of the limit (nearly all of them) costs one len(); only a long one is encoded to measure.
    if max_payload_bytes is not None and len(text) * 4 > max_payload_bytes:
        _check_payload_size(text, max_payload_bytes)
    return text


def _check_payload_size(text: str, max_payload_bytes: int) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))  # a measure; never raises
    if size > max_payload_bytes:
        raise PayloadTooLargeError(size, max_payload_bytes)


def encode_payload_decoded(
    value: object, *, max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES
) -> tuple[str, JSONValue]:
    """:func:`encode_payload`, and the payload decoded back from that text.

    The check decodes the text anyway (to compare it with ``value``); returning that copy
    spares a caller that hands the payload on (a batch's events) a second decoding. The copy
    shares no container with ``value``; immutable scalars are returned as they are.
    """
    kind = type(value)
    if value is None or kind is int or kind is str or kind is bool:
        return encode_payload(value, max_payload_bytes=max_payload_bytes), value
    try:
        if _C_ENCODE is not None and _C_SCAN is not None:
            text = "".join(_C_ENCODE(value, 0))
            decoded, end = _C_SCAN(text, 0)
            same = end == len(text) and decoded == value
        else:
            text = _ENCODER.encode(value)
            decoded = _DECODE(text)
            same = decoded == value
    except (TypeError, ValueError, RecursionError, StopIteration):
        same = False
    if not same:  # not plain JSON: encode_payload raises the error that names the culprit
        text = encode_payload(value, max_payload_bytes=max_payload_bytes)
        return text, _DECODE(text)
    if max_payload_bytes is not None and len(text) * 4 > max_payload_bytes:
        _check_payload_size(text, max_payload_bytes)
    return text, decoded


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
