"""Event payloads on the way in: validated, encoded once, and decoded once for the events a
commit returns.

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
    JSONValue,
    encode_json,
)
from .errors import PayloadTooLargeError

__all__ = ["encode_payload", "encode_payload_decoded"]


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
            if kind is dict and isinstance(value, dict) and _flat_plain(value):
                # A flat object of str keys and plain scalars (a table row, a message's
                # fields) encodes faithfully: nothing to decode and compare, and a copy of
                # it is the decoded payload (its values are immutable).
                decoded, same = value.copy(), True
            else:
                decoded, end = _C_SCAN(text, 0)
                same = end == len(text) and decoded == value
        else:
            text = _ENCODER.encode(value)
            decoded = _DECODE(text)
            same = decoded == value
    except (TypeError, ValueError, RecursionError, StopIteration):
        same = False
    if (
        not same  # not plain JSON: encode_payload raises the error that names the culprit
        or (len(text) > MAX_VALUE_DEPTH and text.count("[") + text.count("{") > MAX_VALUE_DEPTH)
        or not text.isascii()  # maybe deeper than allowed, or a lone surrogate: check it all
    ):
        text = encode_payload(value, max_payload_bytes=max_payload_bytes)
        return text, _DECODE(text)
    if max_payload_bytes is not None and len(text) * 4 > max_payload_bytes:
        _check_payload_size(text, max_payload_bytes)
    return text, decoded
