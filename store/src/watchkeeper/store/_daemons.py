"""Daemon status rows: the rules every backend shares (the argument check, the refusals' JSON).

A daemon saves one :class:`~watchkeeper.store.DaemonStatus` row under its owner name every
heartbeat, so that ``watchkeeper status`` can tell a live daemon from one that died (its
``heartbeat_at`` stops moving) and show the definitions it refused. The refusals are kept as
one JSON text column, escaped to ASCII: file names and reasons may hold anything a file system
or a user's exception allows, and PostgreSQL's ``text`` refuses NUL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime

from ._leases import check_owner
from ._types import DaemonStatus, RefusedDefinition
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "check_daemon_status",
    "check_owners",
    "decode_refused",
    "decode_settings",
    "encode_refused",
]


def check_daemon_status(status: object) -> DaemonStatus:
    """Return ``status`` if it is a well-formed :class:`DaemonStatus`; raise otherwise."""
    if not isinstance(status, DaemonStatus):
        raise ArgumentTypeError("status", status, "a DaemonStatus")
    check_owner(status.owner)
    for name in ("started_at", "heartbeat_at"):
        value = getattr(status, name)
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ArgumentTypeError(f"DaemonStatus.{name}", value, "an aware datetime")
    ttl = status.lease_ttl
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise ArgumentTypeError("DaemonStatus.lease_ttl", ttl, "a finite number of seconds")
    if ttl <= 0:
        raise InvalidArgumentError("DaemonStatus.lease_ttl", ttl, "must be positive")
    if not isinstance(status.watchers_path, str):
        raise ArgumentTypeError("DaemonStatus.watchers_path", status.watchers_path, "a str")
    for refused in status.refused:
        if not isinstance(refused, RefusedDefinition):
            raise ArgumentTypeError("DaemonStatus.refused", refused, "RefusedDefinition objects")
    if not isinstance(status.settings, Mapping):
        raise ArgumentTypeError("DaemonStatus.settings", status.settings, "a mapping")
    for key, value in status.settings.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not isinstance(key, str) or not number or not math.isfinite(value):
            raise ArgumentTypeError(
                "DaemonStatus.settings", {key: value}, "str keys and finite numbers of seconds"
            )
    return status


def check_owners(owners: object) -> list[str]:
    """The distinct owner names, sorted; each a non-empty str."""
    if isinstance(owners, str | bytes) or not isinstance(owners, list | tuple | set | frozenset):
        raise ArgumentTypeError("owners", owners, "a list of str")
    return sorted({check_owner(owner) for owner in owners})


def encode_refused(
    refused: tuple[RefusedDefinition, ...], settings: Mapping[str, float] | None = None
) -> str:
    """The refusals as ASCII JSON text: ``[[file, watcher, reason], ...]``; with the daemon's
    ``settings``, ``{"refused": [...], "settings": {...}}`` (the same column holds both, so a
    database written before settings were kept reads as before)."""
    rows = [[r.file, r.watcher, r.reason] for r in refused]
    if not settings:
        return json.dumps(rows, ensure_ascii=True)
    return json.dumps({"refused": rows, "settings": dict(settings)}, ensure_ascii=True)


def decode_refused(text: str) -> tuple[RefusedDefinition, ...]:
    """The refusals of :func:`encode_refused`'s text."""
    data = json.loads(text)
    rows = data["refused"] if isinstance(data, dict) else data
    return tuple(RefusedDefinition(f, w, r) for f, w, r in rows)


def decode_settings(text: str) -> dict[str, float]:
    """The daemon settings of :func:`encode_refused`'s text ({} when none were kept)."""
    data = json.loads(text)
    return dict(data.get("settings", {})) if isinstance(data, dict) else {}
