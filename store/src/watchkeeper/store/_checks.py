"""The argument checks every service applies before calling a driver: one vocabulary.

Names follow the naming rule of :func:`~._values.check_name` (asset, watcher, task and
consumer names alike); counts, limits and ids are :func:`check_limit`; sequences of records
are :func:`check_items`. Each raises a :class:`~.errors.StateStoreError` that is also the
built-in ``TypeError`` or ``ValueError``, naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._values import check_bigint, check_name
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["check_events_query", "check_items", "check_limit"]


def check_limit(value: object, *, what: str = "limit", least: int = 1) -> int:
    """Return ``value`` if it is an int (not a bool) of at least ``least``: a count, a limit,
    an id or a cursor position. :class:`ArgumentTypeError` or :class:`InvalidArgumentError`."""
    if type(value) is not int:
        raise ArgumentTypeError(what, value, f"an int >= {least}")
    if value < least:
        raise InvalidArgumentError(what, value, f"must be an int >= {least}")
    return value


def check_items(name: str, items: object, kind: type, expected: str) -> list[object]:
    """``items`` as a list, each an instance of ``kind``; :class:`ArgumentTypeError` if not."""
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise ArgumentTypeError(name, items, f"a sequence of {expected}")
    batch = list(items)
    for item in batch:
        if not isinstance(item, kind):
            raise ArgumentTypeError(name, item, f"a sequence of {expected}")
    return batch


def check_events_query(asset: object, since_id: object, limit: object) -> None:
    """Check the arguments of ``alist_events`` the same way for every backend."""
    if asset is not None:
        check_name(asset, what="asset name")
    check_bigint(since_id, what="since_id")
    if limit is not None:
        check_bigint(limit, what="limit")
