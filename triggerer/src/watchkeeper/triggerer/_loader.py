"""Loading watcher definitions: Python files under a watchers path, like a DAGs folder.

Each ``*.py`` file under the path is imported as ``watchkeeper_watchers.<relative.module>``
(a package whose ``__path__`` is the watchers path), and the path is put on ``sys.path`` so the
files can import helper modules that sit next to them. Module-level :class:`Asset` objects with
``watchers=[AssetWatcher(name, trigger)]`` define what is watched.

Reading a file yields its :class:`FileDefinitions`: each asset's name and URI and, for each of
its watchers, the watcher's name and its trigger's ``serialize()`` as canonical JSON. That is
plain data, so a file can be read in another process (the daemon does, see :mod:`._evaluate`:
a file that hangs at import then cannot hang the daemon) and handed back as JSON.

Identical triggers (same ``serialize()``) under one :class:`AssetWatcher` name run once for all
the assets they watch: they form one :class:`WatcherGroup` whose ``trigger_id`` is a short hash
of the watcher name and the canonical JSON of ``(classpath, kwargs)``. Identical triggers under
two names are two groups: each running trigger has exactly one ``watcher_name``, the namespace
of its state keys (see :func:`watcher_trigger_id`). The trigger that runs is rebuilt from that serialization, never taken
from the file: its class is imported only from ``allowed_modules`` prefixes, must be a
:class:`BaseEventTrigger` subclass, and gets JSON kwargs (never pickle).

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
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import sys
import threading
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchkeeper.store import Asset, InvalidValueError, ValueTypeError
from watchkeeper.store.backend import check_name, encode_json, get_logger
from watchkeeper.store.errors import InvalidNameError, KeyTypeError

from ._supervisor import describe_error
from .errors import TriggerImportError
from .trigger import AssetWatcher, BaseEventTrigger

__all__ = [
    "PACKAGE",
    "AssetDefinition",
    "FileDefinitions",
    "LoadResult",
    "WatcherDefinition",
    "WatcherError",
    "WatcherGroup",
    "canonical_trigger_json",
    "default_allowed_modules",
    "load_watchers",
    "read_definitions",
    "rebuild_trigger",
    "scan_watchers_path",
    "trigger_id_for",
    "unload_watchers",
    "watcher_trigger_id",
]

log = get_logger(__name__)

PACKAGE = "watchkeeper_watchers"
"""The package the watcher files are imported into (``watchkeeper_watchers.orders``)."""

_BUILTIN_ALLOWED = ("watchkeeper.watchers",)
_LOAD_LOCK = threading.Lock()  # sys.modules surgery must not interleave


@dataclass(frozen=True, slots=True)
class WatcherError:
    """Why a file or one of its watchers was refused; ``watcher`` is None for the whole file."""

    file: str
    watcher: str | None
    reason: str

    def __str__(self) -> str:
        where = self.file if self.watcher is None else f"{self.file}: watcher {self.watcher!r}"
        return f"{where}: {self.reason}"


@dataclass(frozen=True, slots=True)
class WatcherDefinition:
    """One :class:`AssetWatcher` as a file defined it: its name and its trigger, serialized."""

    name: str
    classpath: str
    canonical: str
    """The canonical JSON of ``(classpath, kwargs)`` (see :func:`canonical_trigger_json`)."""


@dataclass(frozen=True, slots=True)
class AssetDefinition:
    """One asset as a file defined it: name, URI and its watchers."""

    name: str
    uri: str | None = None
    watchers: tuple[WatcherDefinition, ...] = ()

    def same_as(self, other: AssetDefinition) -> bool:
        """True when both define the same asset with the same watchers (in any order)."""
        return (
            self.name == other.name
            and self.uri == other.uri
            and set(self.watchers) == set(other.watchers)
        )


@dataclass(frozen=True, slots=True)
class FileDefinitions:
    """What one file defined: its assets, or the error that refused the whole file.

    ``refused`` holds the single watchers refused while the file was read (their asset and
    the file's other watchers still load).
    """

    file: str
    assets: tuple[AssetDefinition, ...] = ()
    error: WatcherError | None = None
    refused: tuple[WatcherError, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The definitions as JSON data (what a reading process hands back)."""
        return {
            "file": self.file,
            "assets": [
                {
                    "name": a.name,
                    "uri": a.uri,
                    "watchers": [[w.name, w.classpath, w.canonical] for w in a.watchers],
                }
                for a in self.assets
            ],
            "error": None if self.error is None else self.error.reason,
            "refused": [[e.watcher, e.reason] for e in self.refused],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileDefinitions:
        """The inverse of :meth:`to_json`; raises KeyError, TypeError or ValueError if malformed."""
        file = data["file"]
        if not isinstance(file, str):
            raise TypeError("file must be a str")
        assets = tuple(
            AssetDefinition(
                name=a["name"],
                uri=a["uri"],
                watchers=tuple(WatcherDefinition(*w) for w in a["watchers"]),
            )
            for a in data["assets"]
        )
        error = data["error"]
        return cls(
            file,
            assets=assets,
            error=None if error is None else WatcherError(file, None, str(error)),
            refused=tuple(WatcherError(file, w, str(r)) for w, r in data["refused"]),
        )


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


# -- identity ------------------------------------------------------------------------------------


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


# -- allowed modules and rebuilding --------------------------------------------------------------


def default_allowed_modules(path: Path) -> list[str]:
    """``watchkeeper.watchers``, the watcher files' package, and the path's top-level modules."""
    names = [*_BUILTIN_ALLOWED, PACKAGE]
    if path.is_dir():
        for child in sorted(path.iterdir()):
            stem = child.stem if child.suffix == ".py" else child.name
            if child.is_dir() and not (child / "__init__.py").exists():
                continue
            if (child.suffix == ".py" or child.is_dir()) and stem.isidentifier():
                names.append(stem)
    return names


def _is_allowed(classpath: str, allowed: Iterable[str]) -> bool:
    return any(classpath == p or classpath.startswith(p.rstrip(".") + ".") for p in allowed)


def rebuild_trigger(
    classpath: str, kwargs: Mapping[str, Any], allowed_modules: Sequence[str]
) -> BaseEventTrigger:
    """Import ``classpath`` (only under ``allowed_modules``) and return ``cls(**kwargs)``.

    Raises :class:`TriggerImportError` naming the classpath when it is outside the allowed
    prefixes, cannot be imported, is not a :class:`BaseEventTrigger` subclass, or its
    constructor rejects the kwargs.
    """
    if not _is_allowed(classpath, allowed_modules):
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


# -- importing the files -------------------------------------------------------------------------


def scan_watchers_path(path: Path) -> dict[str, tuple[int, int]]:
    """``{relative file: (mtime_ns, size)}`` of every watcher file; blocking, use a thread."""
    found: dict[str, tuple[int, int]] = {}
    if not path.is_dir():
        return found
    for file in watcher_files(path):
        try:
            st = file.stat()
        except FileNotFoundError:  # removed between listing and stat
            continue
        found[file.relative_to(path).as_posix()] = (st.st_mtime_ns, st.st_size)
    return found


def watcher_files(path: Path) -> list[Path]:
    """The watcher files under ``path``, in path order (hidden ones and caches left out)."""
    files = []
    for file in sorted(path.rglob("*.py")):
        parts = file.relative_to(path).parts
        if any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        files.append(file)
    return files


def _module_name(relative: Path) -> str | None:
    parts = list(relative.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join([PACKAGE, *parts])


_roots: list[str] = []  # watchers paths this process put on sys.path


def _purge_modules() -> None:
    for name, module in list(sys.modules.items()):
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            del sys.modules[name]
            continue
        file = getattr(module, "__file__", None)
        if (
            file
            and not name.startswith("watchkeeper.")
            and any(file.startswith(root + "/") for root in _roots)
        ):
            del sys.modules[name]  # a helper module next to the watcher files


def unload_watchers() -> None:
    """Forget every module a load imported and take the watchers paths off ``sys.path``."""
    with _LOAD_LOCK:
        _purge_modules()
        for root in _roots:
            while root in sys.path:
                sys.path.remove(root)
        _roots.clear()


def reset_package(path: Path) -> None:
    """Forget the modules of earlier loads and point the package at ``path`` alone.

    Call with ``_LOAD_LOCK`` held (or in a process of its own).
    """
    root = str(path)
    if root not in _roots:
        _roots.append(root)
    _purge_modules()
    for old in [r for r in _roots if r != root]:
        while old in sys.path:
            sys.path.remove(old)
        _roots.remove(old)
    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [root]
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    if root not in sys.path:
        sys.path.append(root)
    importlib.invalidate_caches()


def _import_file(path: Path, file: Path) -> tuple[types.ModuleType | None, WatcherError | None]:
    relative = file.relative_to(path)
    rel = relative.as_posix()
    module_name = _module_name(relative)
    if module_name is None:
        return None, WatcherError(rel, None, "file name is not a valid Python module name")
    try:
        return importlib.import_module(module_name), None
    except SyntaxError as exc:
        return None, WatcherError(rel, None, f"SyntaxError: {exc.msg} (line {exc.lineno})")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a watcher file must not kill the daemon
        return None, WatcherError(rel, None, f"import failed: {describe_error(exc)}")


def _serialize(rel: str, watcher: AssetWatcher) -> WatcherDefinition | WatcherError:
    try:
        classpath, kwargs = watcher.trigger.serialize()
        canonical = canonical_trigger_json(classpath, kwargs)
    except (InvalidValueError, ValueTypeError) as exc:
        return WatcherError(rel, watcher.name, f"serialize() kwargs are not JSON: {exc}")
    except Exception as exc:  # noqa: BLE001 - user code; reported, never fatal
        return WatcherError(rel, watcher.name, f"serialize() failed: {describe_error(exc)}")
    try:
        canonical.encode()  # the trigger id hashes it
    except UnicodeEncodeError:
        return WatcherError(
            rel, watcher.name, "serialize() kwargs are not valid UTF-8 (a lone surrogate)"
        )
    return WatcherDefinition(watcher.name, classpath, canonical)


def _module_definitions(rel: str, module: types.ModuleType) -> FileDefinitions:
    assets: list[AssetDefinition] = []
    refused: list[WatcherError] = []
    seen: set[int] = set()
    for value in vars(module).values():
        if not isinstance(value, Asset) or id(value) in seen:
            continue
        seen.add(id(value))
        watchers: list[WatcherDefinition] = []
        for watcher in value.watchers:
            if not isinstance(watcher, AssetWatcher):
                refused.append(
                    WatcherError(
                        rel,
                        None,
                        f"asset {value.name!r}: watchers must be AssetWatcher objects, "
                        f"got {type(watcher).__name__}",
                    )
                )
                continue
            serialized = _serialize(rel, watcher)
            if isinstance(serialized, WatcherError):
                refused.append(serialized)
            elif serialized not in watchers:
                watchers.append(serialized)
        assets.append(AssetDefinition(value.name, value.uri, tuple(watchers)))
    return FileDefinitions(rel, assets=tuple(assets), refused=tuple(refused))


def read_definitions(path: Path, file: Path) -> FileDefinitions:
    """Import one watcher file (the package set up by :func:`reset_package`) and serialize
    what it defines. Runs the file's code: blocking, and unbounded in time."""
    module, error = _import_file(path, file)
    if module is None:
        assert error is not None
        return FileDefinitions(error.file, error=error)
    return _module_definitions(file.relative_to(path).as_posix(), module)


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


# -- grouping ------------------------------------------------------------------------------------


@dataclass(slots=True)
class PendingTrigger:
    classpath: str
    canonical: str
    assets: list[Asset] = field(default_factory=list)
    watchers: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    carried: bool = False

    @property
    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = json.loads(self.canonical)[1]
        return kwargs

    @property
    def trigger_id(self) -> str:
        """The group's id: its one watcher name and its canonical JSON (see
        :func:`watcher_trigger_id`)."""
        return watcher_trigger_id(self.canonical, self.watchers[0])


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
    with _LOAD_LOCK:
        reset_package(path)
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
