"""Triggers of other frameworks in the watcher files, run through an installed adapter.

A watcher file may define its assets with another framework's types (Apache Airflow's
``Asset`` and ``AssetWatcher``, whose triggers subclass Airflow's ``BaseEventTrigger``). The
loader reads such objects by their attributes (an asset's ``name``, ``uri`` and ``watchers``;
a watcher's ``name`` and ``trigger``), and a trigger that is not one of ours is handed to the
:class:`TriggerAdapter` that owns its class. An adapter is installed code, found through the
``watchkeeper.trigger_adapters`` entry point group (the ``watchkeeper-airflow`` distribution
declares one); it wraps the foreign trigger into one of ours, a :class:`~..trigger.BaseEventTrigger`
whose ``serialize()`` carries the foreign one's, so the daemon identifies, rebuilds, places and
supervises it as any other. A foreign trigger no installed adapter owns is refused, by name.

Adapters are looked up only when a file defines something foreign, so a daemon that runs only
our triggers never imports one.
"""

from __future__ import annotations

import functools
import importlib.metadata
import types
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from watchkeeper.store import Asset

from .._core import describe_error, kept_logging
from ..trigger import AssetWatcher

__all__ = [
    "ENTRY_POINT_GROUP",
    "TriggerAdapter",
    "adapter_for_classpath",
    "adapter_for_trigger",
    "asset_of",
    "foreign_refusal",
    "installed_adapters",
    "is_foreign_asset",
    "prepare_adapter",
    "watcher_of",
]

ENTRY_POINT_GROUP = "watchkeeper.trigger_adapters"
"""The entry point group adapters are declared in (each names a :class:`TriggerAdapter`)."""


@runtime_checkable
class TriggerAdapter(Protocol):
    """What lets the daemon run another framework's triggers as its own.

    ``framework`` names the framework in messages ("Apache Airflow"); ``trigger_class`` is the
    classpath of the wrapping trigger (one of ours) whose ``serialize()`` :meth:`wrap` returns.
    """

    framework: str
    trigger_class: str

    def owns(self, trigger: object) -> bool:
        """Whether ``trigger`` is of this framework (decided without importing it)."""

    def wrap(self, trigger: object) -> tuple[str, dict[str, Any]]:
        """``(trigger_class, JSON kwargs)`` for a trigger this adapter owns; raises
        ``ValueError`` or ``TypeError`` saying why the trigger cannot run here."""

    def wrapped_classpath(self, kwargs: Mapping[str, Any]) -> str:
        """The foreign trigger's own classpath inside the kwargs :meth:`wrap` returned (the
        daemon checks it against ``allowed_trigger_modules`` before rebuilding)."""

    def prepare(self) -> None:
        """Import the framework (blocking: the daemon calls this in a thread, once per
        process, before the first rebuild, and undoes what the import did to logging)."""


@functools.cache
def installed_adapters() -> tuple[TriggerAdapter, ...]:
    """The adapters the installed distributions declare (loaded once per process).

    An entry point that fails to load, or names something that is not a
    :class:`TriggerAdapter`, is left out: the triggers it would own are then refused as
    foreign, with the reason.
    """
    found: list[TriggerAdapter] = []
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            adapter = point.load()
        except Exception:  # noqa: BLE001, S112 - reported when its triggers are refused
            continue
        if isinstance(adapter, TriggerAdapter):
            found.append(adapter)
    return tuple(found)


def adapter_for_trigger(trigger: object) -> TriggerAdapter | None:
    """The installed adapter that owns ``trigger``'s class, or None."""
    for adapter in installed_adapters():
        if adapter.owns(trigger):
            return adapter
    return None


def adapter_for_classpath(classpath: str) -> TriggerAdapter | None:
    """The installed adapter whose wrapping trigger is ``classpath``, or None."""
    for adapter in installed_adapters():
        if adapter.trigger_class == classpath:
            return adapter
    return None


def foreign_refusal(trigger: object) -> str:
    """Why a trigger that is not one of ours and that no adapter owns cannot run."""
    cls = type(trigger)
    classpath = f"{cls.__module__}.{cls.__qualname__}"
    root = cls.__module__.partition(".")[0]
    hint = ""
    if root == "airflow" or any(c.__module__.startswith("airflow.") for c in cls.__mro__):
        hint = (
            "; Apache Airflow triggers run with the watchkeeper-airflow distribution "
            "installed with its airflow extra (pip install 'watchkeeper-airflow[airflow]')"
        )
    return (
        f"trigger {classpath} is not a watchkeeper BaseEventTrigger and no installed trigger "
        f"adapter takes it{hint}"
    )


_prepared: set[str] = set()


def prepare_adapter(adapter: TriggerAdapter) -> None:
    """Call ``adapter.prepare()`` once per process, keeping our logging as it was (blocking:
    call it in a thread). Raises what ``prepare()`` raised, named."""
    if adapter.trigger_class in _prepared:
        return
    with kept_logging():
        try:
            adapter.prepare()
        except Exception as exc:
            raise ImportError(
                f"{adapter.framework} could not be imported: {describe_error(exc)}"
            ) from exc
    _prepared.add(adapter.trigger_class)


def is_foreign_asset(value: object) -> bool:
    """Whether ``value`` is another framework's asset (Airflow's ``Asset``): read by its
    attributes, a str ``name`` and a list of ``watchers``."""
    if isinstance(value, type | types.ModuleType):
        return False
    return isinstance(getattr(value, "name", None), str) and isinstance(
        getattr(value, "watchers", None), list | tuple
    )


def asset_of(value: object) -> Asset | str:
    """Our :class:`Asset` for a module-level asset (ours, or one read by its attributes), or
    why it cannot be one."""
    if isinstance(value, Asset):
        return value
    name = getattr(value, "name", None)
    uri = getattr(value, "uri", None)
    kind = type(value).__qualname__
    if uri is not None and not isinstance(uri, str):
        return f"{kind} {name!r}: uri must be a str, got {uri!r}"
    try:
        return Asset(str(name), uri=uri)
    except (TypeError, ValueError) as exc:
        return f"{kind} {name!r} cannot be an asset here: {exc}"


def watcher_of(asset: str, watcher: object) -> tuple[str, object] | str:
    """``(name, trigger)`` of one watcher (ours, or one read by its attributes), or why it
    is not one."""
    if isinstance(watcher, AssetWatcher):
        return watcher.name, watcher.trigger
    name = getattr(watcher, "name", None)
    trigger = getattr(watcher, "trigger", None)
    if not isinstance(name, str) or not name or trigger is None:
        return (
            f"asset {asset!r}: watchers must be AssetWatcher objects (a name and a trigger), "
            f"got {type(watcher).__name__}"
        )
    return name, trigger
