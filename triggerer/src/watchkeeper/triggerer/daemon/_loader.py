"""Loading watcher definitions: Python files under a watchers path, like a DAGs folder.

The files are found, imported and read by :mod:`._watcher_files` (here, in this process) or
by :mod:`._evaluate` (in a child process, under a timeout: what the daemon does); this module
checks what they define, groups it, and rebuilds the triggers (:mod:`._identity`) into a
:class:`LoadResult`.

Identical triggers (same ``serialize()``) under one :class:`AssetWatcher` name run once for all
the assets they watch: they form one :class:`WatcherGroup` whose ``trigger_id`` is a short hash
of the watcher name and the canonical JSON of ``(classpath, kwargs)``. Identical triggers under
two names are two groups: each running trigger has exactly one ``watcher_name``, the namespace
of its state keys (see :func:`~._identity.watcher_trigger_id`). The trigger that runs is
rebuilt from that serialization, never taken from the file: its class is imported only from
``allowed_modules`` prefixes, must be a :class:`BaseEventTrigger` subclass, and gets JSON
kwargs (never pickle).

A definition that cannot be used is logged as ``watcher_refused`` (file, watcher, reason) and
skipped; the rest still load:

- a whole file, when it does not import (syntax error, exception, timeout) or one of its
  names breaks the store's naming rule (asset and watcher names, URIs: non-empty UTF-8, no
  control characters, at most 1,024 bytes; see ``check_name``);
- one watcher, when its trigger is not an :class:`AssetWatcher`, its ``serialize()`` fails or
  is not JSON, or its class is outside the allowed modules or rejects its own kwargs;
- one asset, when another file already defines an asset of that name differently (a
  copy-pasted watcher would otherwise write into the other's watermark and event stream):
  the file that defined it in the previous load keeps it, otherwise the first file in path
  order; an identical definition (``from orders import orders``) is no conflict.

When a file that loaded before now fails as a whole, its last good definitions are kept (pass
``previous=``), so a typo being edited does not stop a watcher or deactivate its asset.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchkeeper.store import Asset
from watchkeeper.store.errors import InvalidNameError, KeyTypeError
from watchkeeper.store.protocols import check_name, get_logger

from ..errors import TriggerImportError
from ..trigger import BaseEventTrigger
from ._identity import rebuild_trigger, watcher_trigger_id
from ._watcher_files import (
    MODULES,
    AssetDefinition,
    FileDefinitions,
    FileReads,
    WatcherError,
    default_allowed_modules,
    read_definitions,
    watcher_files,
)

__all__ = [
    "LoadPlan",
    "LoadResult",
    "PendingTrigger",
    "WatcherError",
    "WatcherGroup",
    "finish",
    "group_of",
    "load_watchers",
    "missing_path",
    "plan_load",
    "refuse_group",
    "reused_trigger",
]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WatcherGroup:
    """One distinct trigger and every asset (and watcher name) it serves."""

    trigger_id: str
    classpath: str
    kwargs: Mapping[str, Any]
    trigger: BaseEventTrigger
    assets: tuple[Asset, ...]
    watchers: tuple[str, ...]
    files: tuple[str, ...]

    @property
    def key(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """What must stay equal for a running trigger to be kept across a reload."""
        return (self.trigger_id, tuple(a.name for a in self.assets), self.watchers)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """The outcome of one load: the groups to run, the assets to register, the refusals.

    ``asset_files`` maps each asset to the file whose definition of it is in force (the next
    load keeps it there when another file defines the same asset).
    """

    path: Path
    groups: tuple[WatcherGroup, ...] = ()
    assets: tuple[Asset, ...] = ()
    errors: tuple[WatcherError, ...] = ()
    files: Mapping[str, FileDefinitions] = field(default_factory=dict)
    asset_files: Mapping[str, str] = field(default_factory=dict)
    reads: FileReads | None = None
    """What this load read and when (the next isolated load reads only what changed)."""


# -- grouping ------------------------------------------------------------------------------------


def _check_names(defs: FileDefinitions) -> FileDefinitions:
    """``defs``, or the file refused as a whole when one of its names breaks the naming rule
    (it would fail in the database, or print as something else than it is)."""
    try:
        for asset in defs.assets:
            check_name(asset.name, what="asset name")
            if asset.uri is not None:
                check_name(asset.uri, what=f"uri of asset {asset.name!r}")
            for watcher in asset.watchers:
                check_name(watcher.name, what=f"watcher name (asset {asset.name!r})")
        for refusal in defs.refused:
            if refusal.watcher is not None:
                check_name(refusal.watcher, what="watcher name")
    except (InvalidNameError, KeyTypeError) as exc:
        return FileDefinitions(defs.file, error=WatcherError(defs.file, None, str(exc)))
    return defs


@dataclass(slots=True)
class PendingTrigger:
    classpath: str
    canonical: str
    assets: list[Asset] = field(default_factory=list)
    watchers: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    carried: bool = False
    _id: str | None = field(default=None, repr=False, compare=False)

    @property
    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = json.loads(self.canonical)[1]
        return kwargs

    @property
    def trigger_id(self) -> str:
        """The group's id: its one watcher name and its canonical JSON (see
        :func:`watcher_trigger_id`)."""
        if self._id is None:  # the one name is set as the entry is made, and kept
            self._id = watcher_trigger_id(self.canonical, self.watchers[0])
        return self._id


@dataclass(slots=True)
class LoadPlan:
    """What the files define, checked and grouped; the triggers are not rebuilt yet."""

    files: dict[str, FileDefinitions]
    pending: list[PendingTrigger]
    assets: list[Asset]
    asset_files: dict[str, str]
    errors: list[WatcherError]
    before: dict[str, BaseEventTrigger]


def plan_load(read: Mapping[str, FileDefinitions], previous: LoadResult | None) -> LoadPlan:
    """Check the files' names, keep the last good definitions of files that failed, refuse
    conflicting definitions of one asset, and group identical triggers."""
    errors: list[WatcherError] = []
    files: dict[str, FileDefinitions] = {}
    carried: set[str] = set()
    for rel, raw in read.items():
        defs = _check_names(raw)
        if defs.error is not None:
            errors.append(defs.error)
            last_good = previous.files.get(rel) if previous else None
            if last_good is not None and last_good.error is None:
                files[rel] = last_good  # keep running what this file defined before
                carried.add(rel)
                continue
        files[rel] = defs
        errors.extend(defs.refused)
    # One definition per asset: the file that held it in the previous load keeps it.
    held_by = dict(previous.asset_files) if previous else {}
    chosen: dict[str, tuple[str, AssetDefinition]] = {}
    for rel, defs in files.items():
        for defined in defs.assets:
            if held_by.get(defined.name) == rel and defined.name not in chosen:
                chosen[defined.name] = (rel, defined)
    for rel, defs in files.items():
        for defined in defs.assets:
            holder = chosen.setdefault(defined.name, (rel, defined))
            if holder[1] is defined or holder[1].same_as(defined):
                continue
            where = "earlier in this file" if holder[0] == rel else f"in {holder[0]}"
            errors.append(
                WatcherError(
                    rel,
                    None,
                    f"asset {defined.name!r} is already defined {where}, differently; this "
                    f"definition is refused (define an asset in one file only)",
                )
            )
    pending: dict[tuple[str, str], PendingTrigger] = {}  # one watcher name per group
    for rel, defs in files.items():
        for asset_def in defs.assets:
            if chosen[asset_def.name][1] is not asset_def:
                continue
            asset = Asset(asset_def.name, uri=asset_def.uri)
            for watcher in asset_def.watchers:
                entry = pending.get((watcher.canonical, watcher.name))
                if entry is None:
                    entry = pending[watcher.canonical, watcher.name] = PendingTrigger(
                        watcher.classpath, watcher.canonical
                    )
                if not any(a.name == asset.name for a in entry.assets):
                    entry.assets.append(asset)
                if watcher.name not in entry.watchers:
                    entry.watchers.append(watcher.name)
                if rel not in entry.files:
                    entry.files.append(rel)
                entry.carried = entry.carried or rel in carried
    assets = sorted((Asset(a.name, uri=a.uri) for _, a in chosen.values()), key=lambda a: a.name)
    return LoadPlan(
        files=files,
        pending=list(pending.values()),
        assets=assets,
        asset_files={name: rel for name, (rel, _) in chosen.items()},
        errors=errors,
        before={g.trigger_id: g.trigger for g in previous.groups} if previous else {},
    )


def group_of(entry: PendingTrigger, trigger: BaseEventTrigger) -> WatcherGroup:
    return WatcherGroup(
        trigger_id=entry.trigger_id,
        classpath=entry.classpath,
        kwargs=entry.kwargs,
        trigger=trigger,
        assets=tuple(entry.assets),
        watchers=tuple(entry.watchers),
        files=tuple(entry.files),
    )


def refuse_group(entry: PendingTrigger, reason: str) -> list[WatcherError]:
    """The refusals of every (file, watcher) of a trigger that could not be rebuilt."""
    return [WatcherError(f, w, reason) for f in entry.files for w in entry.watchers]


def reused_trigger(plan: LoadPlan, entry: PendingTrigger) -> BaseEventTrigger | None:
    """The running instance to keep for a trigger whose file failed to load this time."""
    return plan.before.get(entry.trigger_id) if entry.carried else None


def finish(
    path: Path, plan: LoadPlan, groups: list[WatcherGroup], errors: list[WatcherError]
) -> LoadResult:
    """The :class:`LoadResult` of a plan and its rebuilt groups; logs every refusal."""
    groups.sort(key=lambda g: g.trigger_id)
    refused = plan.errors + errors
    for error in refused:
        log.warning("watcher_refused", file=error.file, watcher=error.watcher, reason=error.reason)
    return LoadResult(
        path=path,
        groups=tuple(groups),
        assets=tuple(plan.assets),
        errors=tuple(refused),
        files=plan.files,
        asset_files=plan.asset_files,
    )


def missing_path(path: Path, previous: LoadResult | None) -> LoadResult:
    """The result of a load whose watchers path is not a directory (logged)."""
    error = WatcherError(str(path), None, "watchers path is not a directory")
    log.warning("watcher_refused", file=error.file, watcher=None, reason=error.reason)
    if previous is not None and previous.path == path:  # gone for a moment (a deploy)
        return dataclasses.replace(previous, errors=(error,))
    return LoadResult(path=path, errors=(error,))


def load_watchers(
    path: Path | str,
    *,
    allowed_modules: Sequence[str] | None = None,
    previous: LoadResult | None = None,
) -> LoadResult:
    """Import every watcher file under ``path``, in this process, and return what they define.

    Blocking and unbounded in time (it runs the files' code): a file that hangs at import
    hangs this call. The daemon uses :func:`~._evaluate.aload_watchers` instead, which reads
    the files in a separate process under a timeout. A missing directory loads nothing and
    reports one error. ``allowed_modules=None`` means :func:`default_allowed_modules`. Every
    refusal is logged as ``watcher_refused``.
    """
    path = Path(path).resolve()
    if not path.is_dir():
        return missing_path(path, previous)
    allowed = list(allowed_modules) if allowed_modules else default_allowed_modules(path)
    with MODULES.lock:
        MODULES.reset(path)
        read = {}
        for file in watcher_files(path):
            defs = read_definitions(path, file)
            read[defs.file] = defs
        plan = plan_load(read, previous)
        groups: list[WatcherGroup] = []
        errors: list[WatcherError] = []
        for entry in plan.pending:
            trigger = reused_trigger(plan, entry)
            if trigger is None:
                try:
                    trigger = rebuild_trigger(entry.classpath, entry.kwargs, allowed)
                except TriggerImportError as exc:
                    errors.extend(refuse_group(entry, str(exc)))
                    continue
            groups.append(group_of(entry, trigger))
    return finish(path, plan, groups, errors)
