"""Validation and encoding of keys and values: the one place that decides what is JSON."""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import math
import re
import sys
from datetime import datetime, timedelta
from typing import Any, Final, Self

from .errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidNameError,
    InvalidValueError,
    KeyTypeError,
    RetentionTypeError,
    ValueTooLargeError,
    ValueTypeError,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_BIGINT",
    "MAX_KEY_LENGTH",
    "MAX_MAP_INDEX",
    "MAX_NAME_BYTES",
    "MAX_SCOPE_ID_BYTES",
    "MAX_VALUE_DEPTH",
    "NEVER_EXPIRE",
    "JSONValue",
    "check_bigint",
    "check_key",
    "check_name",
    "check_retention",
    "decode_value",
    "encode_json",
    "encode_value",
    "expiry_of",
    "value_from_text",
]

JSONValue = Any
"""A value the store accepts: str, int, float, bool, list or dict (str keys), nested."""

MAX_KEY_LENGTH: Final = 512
MAX_NAME_BYTES: Final = 1024
"""The UTF-8 size limit of every name (keys, asset and watcher names, dedup keys).

Well under PostgreSQL's btree row limit (~2,700 bytes), so an indexed name never fails there.
"""
MAX_SCOPE_ID_BYTES: Final = 512
"""The UTF-8 size limit of each of a task scope's ``dag_id``, ``run_id`` and ``task_id``.

Smaller than :data:`MAX_NAME_BYTES` because the three share one index entry with the map
index and the key: 3 x (512 + 4) + 4 + (1,024 + 4) + 8 = 2,588 bytes at most, under
PostgreSQL's btree limit of 2,704 even when nothing compresses. (Airflow allows 250
characters for each.)
"""
MAX_MAP_INDEX: Final = 2**31 - 1
"""The largest map index (PostgreSQL keeps it in an ``integer``); -1 means "not mapped"."""
MAX_BIGINT: Final = 2**63 - 1
"""The largest asset id or version: what a 64-bit database integer holds."""
MAX_VALUE_DEPTH: Final = 256
"""How deeply lists and dicts may nest in a value or a payload.

Far beyond real documents, and shallow enough that decoding a stored value never comes near
Python's recursion limit, whatever the stack of the reader.
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


def _name_problem(name: str, max_chars: int | None, max_bytes: int) -> str | None:
    """Why ``name`` breaks the naming rule, or None when it keeps it."""
    if not name:
        return "must not be empty"
    if max_chars is not None and len(name) > max_chars:
        return f"{len(name)} characters, over the limit of {max_chars}"
    # The common case, all in C: printable ASCII is one byte a character and has no controls.
    if name.isascii() and name.isprintable():
        if len(name) > max_bytes:
            return f"{len(name)} bytes in UTF-8, over the limit of {max_bytes}"
        return None
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "not valid UTF-8 (it contains a lone surrogate)"
    if size > max_bytes:
        return f"{size} bytes in UTF-8, over the limit of {max_bytes}"
    found = _CONTROL.search(name)
    if found is not None:
        return f"contains the control character {found.group()!r} at {found.start()}"
    return None


def check_name(name: object, *, what: str, max_bytes: int = MAX_NAME_BYTES) -> str:
    """Return ``name`` if it keeps the naming rule, else raise :class:`InvalidNameError`.

    ``what`` names the kind of name in the message ("asset name", "watcher name", "dedup key").
    A name that is not a ``str`` is a :class:`KeyTypeError` (a ``TypeError``).
    """
    # The common case inline (printable ASCII: one byte a character, no controls).
    if type(name) is str and name.isascii() and name.isprintable() and 0 < len(name) <= max_bytes:
        return name
    if not isinstance(name, str):
        raise KeyTypeError(name, what=what)
    problem = _name_problem(name, None, max_bytes)
    if problem is not None:
        raise InvalidNameError(what, name, problem)
    return name


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid key; raise :class:`KeyTypeError` or :class:`InvalidKeyError`.

    Keys follow the naming rule of :func:`check_name` and are at most ``MAX_KEY_LENGTH``
    characters.
    """
    if type(key) is str and key.isascii() and key.isprintable() and 0 < len(key) <= MAX_KEY_LENGTH:
        return key
    if not isinstance(key, str):
        raise KeyTypeError(key)
    problem = _name_problem(key, MAX_KEY_LENGTH, MAX_NAME_BYTES)
    if problem is not None:
        raise InvalidKeyError(key, problem)
    return key


def check_bigint(value: object, *, what: str, minimum: int = 0, maximum: int = MAX_BIGINT) -> int:
    """Return ``value`` if it is an int (not a bool) in ``[minimum, maximum]``.

    Raises :class:`ArgumentTypeError` or :class:`InvalidArgumentError`: an integer a database
    column cannot hold is refused here, the same way on every backend, before any I/O.
    """
    if type(value) is not int:
        raise ArgumentTypeError(what, value, "an int")
    if value < minimum:
        raise InvalidArgumentError(what, value, f"must be at least {minimum}")
    if value > maximum:
        raise InvalidArgumentError(what, value, f"must be at most {maximum}")
    return value


def check_retention(retention: object) -> timedelta | _NeverExpire | None:
    """Return ``retention`` if it is a ``timedelta``, ``NEVER_EXPIRE`` or ``None``."""
    if retention is None or retention is NEVER_EXPIRE:
        return retention
    if isinstance(retention, timedelta):
        return retention
    raise RetentionTypeError(retention)


def expiry_of(retention: object, now: datetime) -> datetime | None:
    """When a row written at ``now`` with ``retention`` expires (``None``: it does not).

    A retention so long that the expiry falls past ``datetime.max`` (year 9999) is an
    :class:`InvalidArgumentError` rather than an ``OverflowError`` from deep inside a write.
    """
    if not isinstance(retention, timedelta):
        return None
    try:
        return now + retention
    except OverflowError:
        raise InvalidArgumentError(
            "retention", retention, "the expiry would fall after the year 9999"
        ) from None


def _int_problem(value: int) -> str | None:
    """Why an int cannot be written as JSON text, or None."""
    try:
        int.__repr__(value)
    except ValueError:  # past sys.get_int_max_str_digits(): decoding it would fail too
        return (
            f"an int of {value.bit_length()} bits, longer than the "
            f"{sys.get_int_max_str_digits()} digits Python converts to text"
        )
    return None


def _str_problem(text: str) -> str | None:
    """Why a str cannot be stored as UTF-8 text, or None."""
    if text.isascii():
        return None
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return f"a str with a lone surrogate at {exc.start}, which is not UTF-8"
    return None


def _check_json(value: object, path: str, depth: int) -> None:
    # Walk the value ourselves: json.dumps would silently turn tuples into lists and int dict
    # keys into strings, so the value read back would differ from the one written.
    if value is None:
        raise InvalidValueError(f"value at {path} is None; JSON null is not stored")
    kind = type(value)
    if kind is bool:
        return
    if kind is int:
        problem = _int_problem(value)  # type: ignore[arg-type]
        if problem is not None:
            raise InvalidValueError(f"value at {path} is {problem}")
        return
    if kind is str:
        problem = _str_problem(value)  # type: ignore[arg-type]
        if problem is not None:
            raise InvalidValueError(f"value at {path} is {problem}")
        return
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise InvalidValueError(f"value at {path} is {value!r}, which JSON cannot represent")
        return
    if (kind is list or kind is dict) and depth >= MAX_VALUE_DEPTH:
        raise _too_deep()
    if kind is list:
        items: list[object] = value  # type: ignore[assignment]
        for index, item in enumerate(items):
            if item is None:
                continue  # null inside a container is ordinary JSON
            _check_json(item, f"{path}[{index}]", depth + 1)
        return
    if kind is dict:
        for name, item in value.items():  # type: ignore[attr-defined]
            if not isinstance(name, str):
                raise ValueTypeError(f"{path} key {name!r}", name)
            problem = _str_problem(name)
            if problem is not None:
                raise InvalidValueError(f"key {name!r} at {path} is {problem}")
            if item is None:
                continue
            _check_json(item, f"{path}[{name!r}]", depth + 1)
        return
    raise ValueTypeError(path, value)


def _too_deep() -> InvalidValueError:
    # The path of the culprit would be hundreds of "[0]": the limit says enough.
    return InvalidValueError(f"value is nested more than {MAX_VALUE_DEPTH} levels deep")


def _deeper_than(value: object, limit: int) -> bool:
    """True when lists and dicts nest more than ``limit`` levels in ``value`` (no recursion).

    Depth first, so a value that contains itself is found as soon as one path passes the
    limit; scalars are never pushed, so a wide value costs one look at each of its items.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item if type(item) is list else item.values()
        stack.extend((c, depth + 1) for c in children if type(c) is list or type(c) is dict)
    return False


def _levels_deeper_than(value: object, limit: int) -> bool:
    """:func:`_deeper_than` for a value known to hold no cycle (it encoded): level by level,
    about three times faster on wide values, since nothing but the containers is kept."""
    level: list[Any] = [value]
    for _ in range(limit):
        below: list[Any] = []
        for item in level:
            for child in item if type(item) is list else item.values():
                if type(child) is list or type(child) is dict:
                    below.append(child)  # noqa: PERF401 - measured faster than extend()
        if not below:
            return False
        level = below
    return True


def _refuse(value: object, what: str) -> InvalidValueError | ValueTypeError:
    """The error that names what makes ``value`` unstorable (the slow path, after a failure)."""
    # Depth first, without recursion: the walk below recurses once per level.
    if (type(value) is list or type(value) is dict) and _deeper_than(value, MAX_VALUE_DEPTH):
        return _too_deep()
    try:
        _check_json(value, what, 0)
    except (InvalidValueError, ValueTypeError) as exc:
        return exc
    return ValueTypeError(what, value)  # equal-looking but not plain JSON


def _encode_checked(value: object, what: str) -> str:
    # Fast path, all in C: encode, decode, compare. json.dumps alone would turn tuples into
    # lists and int dict keys into strings, but then the decoded value differs from the
    # original. Any failure or difference takes the slow walk, which names the culprit.
    kind = type(value)
    if kind is int:  # watermarks, mostly: nothing to walk or compare
        try:
            return int.__repr__(value)
        except ValueError:
            raise _refuse(value, what) from None
    if kind is str or kind is bool:
        text = _ENCODER.encode(value)
    else:
        try:
            if _C_ENCODE is not None and _C_SCAN is not None:  # the C parts, as below
                text = "".join(_C_ENCODE(value, 0))
                decoded, end = _C_SCAN(text, 0)
                same = end == len(text) and decoded == value
            else:
                text = _ENCODER.encode(value)
                same = _DECODE(text) == value
        except (TypeError, ValueError, RecursionError, StopIteration):
            same = False
        if not same:
            raise _refuse(value, what)
        # A value nested N deep has at least N brackets: most values skip the exact check.
        if (
            len(text) > MAX_VALUE_DEPTH
            and text.count("[") + text.count("{") > MAX_VALUE_DEPTH
            and _levels_deeper_than(value, MAX_VALUE_DEPTH)
        ):
            raise _too_deep()
    # ensure_ascii=False keeps a lone surrogate as it is; it would fail later, in the driver.
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise _refuse(value, what) from None
    return text


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


def value_from_text(
    key: str, text: object, *, max_value_bytes: int | None = DEFAULT_MAX_VALUE_BYTES
) -> str:
    """Validate a state value given as JSON text by :func:`encode_value`'s rules (a write
    that arrives encoded already: a consumer's acknowledgement, an event commit's state);
    return its compact JSON text.

    Raises:
        InvalidValueError: ``text`` is not a str of JSON text, or its value breaks a rule of
            :func:`encode_value` (:class:`ValueTooLargeError` over ``max_value_bytes``).
        ValueTypeError: as :func:`encode_value`.
    """
    if type(text) is not str:
        raise InvalidValueError(
            f"value for key {key!r} must be JSON text (a str), got {type(text).__name__}"
        )
    try:
        value = _DECODE(text)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:
        raise InvalidValueError(f"value for key {key!r} is not JSON text: {exc}") from None
    return encode_value(key, value, max_value_bytes=max_value_bytes)


def decode_value(text: str) -> JSONValue:
    """Decode JSON text written by :func:`encode_value`."""
    return json.loads(text)
