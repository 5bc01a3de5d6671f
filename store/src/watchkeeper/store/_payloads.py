"""Event payloads on the way in: validated and encoded once, into the JSON text that is the
event's one form until it is read back.

A payload is any JSON value (``None`` too) within ``[events] max_payload_bytes``; the rules
of a JSON value are :mod:`._values`'s. A flat object of plain scalars (a table row, a
message's fields: the bulk of batch traffic) needs no decode-and-compare check: its encoding
is faithful by construction.
"""

from __future__ import annotations

from typing import Any

from ._values import (
    _C_ENCODE,
    _C_SCAN,
    _DECODE,
    _ENCODER,
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_VALUE_DEPTH,
    encode_json,
)
from .errors import PayloadTooLargeError

__all__ = ["encode_payload"]


def _encode_checked(value: object, max_payload_bytes: int | None) -> str:
    """The payload's text by :func:`encode_json`'s full checks (the error names the culprit)."""
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


def _flat_plain(value: dict[Any, Any]) -> bool:
    """Whether ``value`` maps str keys to None, str, int, bool or finite floats only (exact
    types: a subclass may encode as something else), so that its JSON text decodes to an
    equal dict."""
    for key, item in value.items():  # a loop: no generator frame per row
        if type(key) is not str:
            return False
        kind = type(item)
        if kind is str or kind is int or item is None or kind is bool:
            continue
        if kind is not float or item - item != 0.0:  # NaN and infinities are not JSON
            return False
    return True


def encode_payload(
    value: object, *, max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES
) -> str:
    """Validate an event payload (``None`` allowed) and return its compact JSON text.

    Raises what :func:`encode_json` raises, and :class:`PayloadTooLargeError` when the
    encoding is over ``max_payload_bytes`` (``None`` disables the limit). The text is what
    :func:`encode_json` gives; the common payloads get it by a shorter way: a scalar directly,
    a flat object of plain scalars without decoding it back, anything else decoded once with
    the C scanner and compared.
    """
    kind = type(value)
    if value is None or kind is int or kind is str or kind is bool:
        return _encode_checked(value, max_payload_bytes)
    try:
        if _C_ENCODE is not None and _C_SCAN is not None:
            text = "".join(_C_ENCODE(value, 0))
            if kind is dict and isinstance(value, dict) and _flat_plain(value):
                same = True  # a flat object of plain scalars encodes faithfully
            else:
                decoded, end = _C_SCAN(text, 0)
                same = end == len(text) and decoded == value
        else:
            text = _ENCODER.encode(value)
            same = _DECODE(text) == value
    except (TypeError, ValueError, RecursionError, StopIteration):
        same = False
    if (
        not same  # not plain JSON: the full check raises the error that names the culprit
        or (len(text) > MAX_VALUE_DEPTH and text.count("[") + text.count("{") > MAX_VALUE_DEPTH)
        or not text.isascii()  # maybe deeper than allowed, or a lone surrogate: check it all
    ):
        return _encode_checked(value, max_payload_bytes)
    if max_payload_bytes is not None and len(text) * 4 > max_payload_bytes:
        _check_payload_size(text, max_payload_bytes)
    return text
