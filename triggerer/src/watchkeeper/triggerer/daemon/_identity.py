"""Trigger identity, and rebuilding a trigger from its serialization through an allow-list.

A trigger is known by the canonical JSON of its ``serialize()``, ``(classpath, kwargs)``
(:func:`canonical_trigger_json`), and runs under an id hashed from that JSON and its watcher's
name (:func:`watcher_trigger_id`). The trigger that runs is rebuilt from that serialization,
never taken from the file that defined it (:func:`rebuild_trigger`): its class is imported only
from allowed module prefixes, must be a :class:`~..trigger.BaseEventTrigger` subclass, and
gets JSON kwargs (never pickle).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from watchkeeper.store.protocols import encode_json

from .._core import describe_error
from ..errors import TriggerImportError
from ..trigger import BaseEventTrigger
from ._adapters import TriggerAdapter, adapter_for_classpath, prepare_adapter

__all__ = [
    "canonical_trigger_json",
    "rebuild_trigger",
    "trigger_id_for",
    "watcher_trigger_id",
]

BUILTIN_ALLOWED = ("watchkeeper.watchers",)
"""The module prefixes every daemon allows (the ready-made watchers)."""


def canonical_trigger_json(classpath: object, kwargs: object) -> str:
    """The canonical JSON of ``(classpath, kwargs)``; ``ValueError``/``TypeError`` if not JSON."""
    if not isinstance(classpath, str) or not classpath:
        raise TypeError(f"serialize() classpath must be a non-empty str, got {classpath!r}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"serialize() kwargs must be a dict, got {type(kwargs).__name__}")
    encode_json(kwargs, what="kwargs")  # strict: no tuples, no int keys, no NaN, no objects
    return json.dumps(
        [classpath, kwargs], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def trigger_id_for(canonical: str) -> str:
    """A short stable id for a trigger's canonical JSON (16 hex digits of its SHA-256)."""
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def watcher_trigger_id(canonical: str, watcher_name: str) -> str:
    """The id of the trigger ``canonical`` running as the watcher ``watcher_name``.

    The name is part of the identity because it is part of what the trigger does: it namespaces
    the trigger's state keys (``self.watcher_name``), so two watchers of one asset never share a
    watermark even when their triggers serialize the same.
    """
    return trigger_id_for(json.dumps([watcher_name, canonical], ensure_ascii=False))


def _is_allowed(classpath: str, allowed: Iterable[str]) -> bool:
    return any(classpath == p or classpath.startswith(p.rstrip(".") + ".") for p in allowed)


def _wrapped_classpath(adapter: TriggerAdapter, classpath: str, kwargs: Mapping[str, Any]) -> str:
    try:
        wrapped = adapter.wrapped_classpath(kwargs)
    except Exception as exc:
        raise TriggerImportError(
            f"{classpath}: kwargs name no {adapter.framework} trigger: {describe_error(exc)}"
        ) from exc
    return wrapped


def rebuild_trigger(
    classpath: str, kwargs: Mapping[str, Any], allowed_modules: Sequence[str]
) -> BaseEventTrigger:
    """Import ``classpath`` (only under ``allowed_modules``) and return ``cls(**kwargs)``.

    A trigger of another framework, wrapped by an installed adapter (see :mod:`._adapters`),
    is checked by the class it wraps, and the adapter's framework is imported first (with our
    logging kept). Raises :class:`TriggerImportError` naming the classpath when it is outside
    the allowed prefixes, cannot be imported, is not a :class:`BaseEventTrigger` subclass, or its
    constructor rejects the kwargs.
    """
    adapter = adapter_for_classpath(classpath)
    if adapter is not None:
        # Another framework's trigger, wrapped: the adapter is installed code (allowed as the
        # ready-made watchers are); the class it wraps is checked as any trigger class is.
        wrapped = _wrapped_classpath(adapter, classpath, kwargs)
        if not _is_allowed(wrapped, allowed_modules):
            raise TriggerImportError(
                f"trigger class {wrapped!r} is outside allowed_trigger_modules "
                f"({', '.join(allowed_modules) or 'none'})"
            )
        try:
            prepare_adapter(adapter)
        except ImportError as exc:
            raise TriggerImportError(f"cannot run {wrapped!r}: {exc}") from exc
    elif not _is_allowed(classpath, allowed_modules):
        raise TriggerImportError(
            f"trigger class {classpath!r} is outside allowed_trigger_modules "
            f"({', '.join(allowed_modules) or 'none'})"
        )
    module_name, _, attr = classpath.rpartition(".")
    if not module_name:
        raise TriggerImportError(f"trigger classpath {classpath!r} has no module part")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise TriggerImportError(f"cannot import trigger class {classpath!r}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # the module's own code failed as it was imported
        raise TriggerImportError(
            f"cannot import trigger class {classpath!r}: {describe_error(exc)}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseEventTrigger)):
        raise TriggerImportError(f"{classpath!r} is not a BaseEventTrigger subclass")
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise TriggerImportError(f"{classpath}(**kwargs) failed: {describe_error(exc)}") from exc
