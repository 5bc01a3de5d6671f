"""Filling the fields of frozen slotted records without ``__init__``, for the hot paths.

A frozen dataclass's ``__init__`` (and ``object.__setattr__``, which it calls once per field)
checks on every call that no class of the instance's type overrides ``__setattr__`` in C:
a walk of the type's bases, paid per record on the hot paths (see BENCHMARKS.md). The member
descriptor of each slot sets its field directly. The paths that use these build records of
values they have checked already (the commit of an event whose names were checked once per
trigger, the events a batch returns): nothing is checked here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["slot_setters"]


def slot_setters(cls: type[Any]) -> tuple[Callable[[Any, Any], None], ...]:
    """The setter of each slot of ``cls``, in field order (a dataclass lists its fields in
    ``__slots__`` in order)."""
    slots: tuple[str, ...] = cls.__slots__
    return tuple(cls.__dict__[name].__set__ for name in slots)
