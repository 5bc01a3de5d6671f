"""Loading watcher definitions: Python files under a watchers path, like a DAGs folder.

Each ``*.py`` file under the path is imported as ``watchkeeper_watchers.<relative.module>``
(a package whose ``__path__`` is the watchers path), and the path is put on ``sys.path`` so the
files can import helper modules that sit next to them. Module-level :class:`Asset` objects with
``watchers=[AssetWatcher(name, trigger)]`` define what is watched.

Identical triggers (same ``serialize()``) under one :class:`AssetWatcher` name run once for all
the assets they watch: they form one :class:`WatcherGroup` whose ``trigger_id`` is a short hash
of the watcher name and the canonical JSON of ``(classpath, kwargs)``. Identical triggers under
two names are two groups: each running trigger has exactly one ``watcher_name``, the namespace
of its state keys (see :func:`watcher_trigger_id`). The trigger that runs is rebuilt from that
serialization, never taken from the file: its class is imported only from ``allowed_modules``
prefixes, must be a :class:`BaseEventTrigger` subclass, and gets JSON kwargs (never pickle).

A definition that cannot be used (syntax error, import error, disallowed module, kwargs that
are not JSON) is logged as ``watcher_refused`` and skipped; the rest still load. When a file
that loaded before now fails to import, its last good definitions are kept (pass
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

from watchkeeper.store import Asset, InvalidValueError, ValueTypeError, encode_json, get_logger

from ._asset_task import AssetTask
from .errors import TriggerImportError
from .trigger import AssetWatcher, BaseEventTrigger

__all__ = [
    "PACKAGE",
    "FileDefinitions",
    "LoadResult",
    "WatcherError",
    "WatcherGroup",
    "canonical_trigger_json",
    "default_allowed_modules",
    "load_watchers",
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
class FileDefinitions:
    """What one file defined: its assets, or the error that kept it from importing."""

    file: str
    assets: tuple[Asset, ...] = ()
    error: WatcherError | None = None
    tasks: tuple[AssetTask, ...] = ()


@dataclass(frozen=True, slots=True)
class WatcherGroup:
    """One distinct trigger under one watcher name, and every asset it serves."""

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
    """The outcome of one load: the groups to run, the assets to register, the refusals."""

    path: Path
    groups: tuple[WatcherGroup, ...] = ()
    assets: tuple[Asset, ...] = ()
    errors: tuple[WatcherError, ...] = ()
    files: Mapping[str, FileDefinitions] = field(default_factory=dict)
    tasks: tuple[AssetTask, ...] = ()
    """The ``asset_task`` objects the files define at module level (``watchkeeper worker``)."""


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
    if not (isinstance(cls, type) and issubclass(cls, BaseEventTrigger)):
        raise TriggerImportError(f"{classpath!r} is not a BaseEventTrigger subclass")
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise TriggerImportError(
            f"{classpath}(**kwargs) failed: {type(exc).__name__}: {exc}"
        ) from exc


# -- importing the files -------------------------------------------------------------------------


def scan_watchers_path(path: Path) -> dict[str, tuple[int, int]]:
    """``{relative file: (mtime_ns, size)}`` of every watcher file; blocking, use a thread."""
    found: dict[str, tuple[int, int]] = {}
    if not path.is_dir():
        return found
    for file in _watcher_files(path):
        try:
            st = file.stat()
        except FileNotFoundError:  # removed between listing and stat
            continue
        found[file.relative_to(path).as_posix()] = (st.st_mtime_ns, st.st_size)
    return found


def _watcher_files(path: Path) -> list[Path]:
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


def _reset_package(path: Path) -> None:
    """Forget the modules of earlier loads and point the package at ``path`` alone."""
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
        return None, WatcherError(rel, None, f"import failed: {type(exc).__name__}: {exc}")


def _module_assets(rel: str, module: types.ModuleType) -> tuple[list[Asset], list[WatcherError]]:
    assets: list[Asset] = []
    errors: list[WatcherError] = []
    seen: set[int] = set()
    for value in vars(module).values():
        if not isinstance(value, Asset) or id(value) in seen:
            continue
        seen.add(id(value))
        errors.extend(
            WatcherError(
                rel,
                None,
                f"asset {value.name!r}: watchers must be AssetWatcher objects, "
                f"got {type(watcher).__name__}",
            )
            for watcher in value.watchers
            if not isinstance(watcher, AssetWatcher)
        )
        assets.append(value)
    return assets, errors


# -- grouping ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    classpath: str
    kwargs: dict[str, Any]
    assets: list[Asset] = field(default_factory=list)
    watchers: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    carried: bool = False


def _serialize(rel: str, watcher: AssetWatcher) -> tuple[str, str] | WatcherError:
    try:
        classpath, kwargs = watcher.trigger.serialize()
        canonical = canonical_trigger_json(classpath, kwargs)
    except (InvalidValueError, ValueTypeError) as exc:
        return WatcherError(rel, watcher.name, f"serialize() kwargs are not JSON: {exc}")
    except Exception as exc:  # noqa: BLE001 - user code; reported, never fatal
        return WatcherError(rel, watcher.name, f"serialize() failed: {type(exc).__name__}: {exc}")
    return canonical, classpath


def _group(
    files: Mapping[str, FileDefinitions],
    carried: set[str],
    allowed: Sequence[str],
    previous: LoadResult | None,
) -> tuple[list[WatcherGroup], list[Asset], list[WatcherError]]:
    errors: list[WatcherError] = []
    assets: dict[str, Asset] = {}
    asset_file: dict[str, str] = {}
    pending: dict[tuple[str, str], _Pending] = {}
    for rel, defs in files.items():
        for asset in defs.assets:
            if asset.name in assets:
                if assets[asset.name] is asset:
                    continue  # the same object imported into another file
                if assets[asset.name].uri != asset.uri:
                    errors.append(
                        WatcherError(
                            rel,
                            None,
                            f"asset {asset.name!r} is also defined in {asset_file[asset.name]} "
                            f"with a different uri; this definition is ignored",
                        )
                    )
                    continue
            else:
                assets[asset.name], asset_file[asset.name] = asset, rel
            for watcher in asset.watchers:
                if not isinstance(watcher, AssetWatcher):
                    continue  # reported when the file was read
                serialized = _serialize(rel, watcher)
                if isinstance(serialized, WatcherError):
                    errors.append(serialized)
                    continue
                canonical, classpath = serialized
                entry = pending.get((canonical, watcher.name))  # one watcher name per group
                if entry is None:
                    kwargs = json.loads(canonical)[1]
                    entry = pending[canonical, watcher.name] = _Pending(classpath, kwargs)
                if not any(a.name == asset.name for a in entry.assets):
                    entry.assets.append(asset)
                if watcher.name not in entry.watchers:
                    entry.watchers.append(watcher.name)
                if rel not in entry.files:
                    entry.files.append(rel)
                entry.carried = entry.carried or rel in carried
    before = {g.trigger_id: g.trigger for g in previous.groups} if previous else {}
    groups: list[WatcherGroup] = []
    for (canonical, watcher_name), entry in pending.items():
        trigger_id = watcher_trigger_id(canonical, watcher_name)
        if entry.carried and trigger_id in before:
            trigger = before[trigger_id]  # its module failed to import this time
        else:
            try:
                trigger = rebuild_trigger(entry.classpath, entry.kwargs, allowed)
            except TriggerImportError as exc:
                errors.extend(
                    WatcherError(f, w, str(exc)) for f in entry.files for w in entry.watchers
                )
                continue
        groups.append(
            WatcherGroup(
                trigger_id=trigger_id,
                classpath=entry.classpath,
                kwargs=entry.kwargs,
                trigger=trigger,
                assets=tuple(entry.assets),
                watchers=tuple(entry.watchers),
                files=tuple(entry.files),
            )
        )
    groups.sort(key=lambda g: g.trigger_id)
    return groups, sorted(assets.values(), key=lambda a: a.name), errors


def load_watchers(
    path: Path | str,
    *,
    allowed_modules: Sequence[str] | None = None,
    previous: LoadResult | None = None,
) -> LoadResult:
    """Import every watcher file under ``path`` and return what they define.

    Blocking (it imports modules): the daemon calls it in a worker thread. A missing directory
    loads nothing and reports one error. ``allowed_modules=None`` means
    :func:`default_allowed_modules`. Every refusal is logged as ``watcher_refused``.
    """
    path = Path(path).resolve()
    if not path.is_dir():
        error = WatcherError(str(path), None, "watchers path is not a directory")
        log.warning("watcher_refused", file=error.file, watcher=None, reason=error.reason)
        if previous is not None and previous.path == path:  # gone for a moment (a deploy)
            return dataclasses.replace(previous, errors=(error,))
        return LoadResult(path=path, errors=(error,))
    allowed = list(allowed_modules) if allowed_modules else default_allowed_modules(path)
    with _LOAD_LOCK:
        _reset_package(path)
        files: dict[str, FileDefinitions] = {}
        carried: set[str] = set()
        errors: list[WatcherError] = []
        for file in _watcher_files(path):
            rel = file.relative_to(path).as_posix()
            module, import_error = _import_file(path, file)
            if module is None:
                assert import_error is not None
                errors.append(import_error)
                last_good = previous.files.get(rel) if previous else None
                if last_good is not None and last_good.error is None:
                    files[rel] = last_good  # keep running what this file defined before
                    carried.add(rel)
                else:
                    files[rel] = FileDefinitions(rel, error=import_error)
                continue
            assets, asset_errors = _module_assets(rel, module)
            errors.extend(asset_errors)
            tasks = _module_tasks(module)
            for task in tasks:  # a task's assets are declared by its file too
                assets.extend(a for a in task.assets if all(a is not b for b in assets))
            files[rel] = FileDefinitions(rel, assets=tuple(assets), tasks=tasks)
        groups, assets, group_errors = _group(files, carried, allowed, previous)
        tasks, task_errors = _collect_tasks(files)
    errors.extend(group_errors)
    errors.extend(task_errors)
    for error in errors:
        log.warning("watcher_refused", file=error.file, watcher=error.watcher, reason=error.reason)
    return LoadResult(
        path=path,
        groups=tuple(groups),
        assets=tuple(assets),
        errors=tuple(errors),
        files=files,
        tasks=tasks,
    )


def _module_tasks(module: types.ModuleType) -> tuple[AssetTask, ...]:
    found: list[AssetTask] = []
    for value in vars(module).values():
        if isinstance(value, AssetTask) and all(value is not t for t in found):
            found.append(value)
    return tuple(found)


def _collect_tasks(
    files: Mapping[str, FileDefinitions],
) -> tuple[tuple[AssetTask, ...], list[WatcherError]]:
    """Every file's tasks, by name; a name defined by two files is refused in the second."""
    tasks: dict[str, AssetTask] = {}
    where: dict[str, str] = {}
    errors: list[WatcherError] = []
    for rel in sorted(files):
        for task in files[rel].tasks:
            if task.name in tasks and tasks[task.name] is not task:
                errors.append(
                    WatcherError(
                        rel, None, f"task {task.name!r} is already defined in {where[task.name]}"
                    )
                )
                continue
            tasks[task.name], where[task.name] = task, rel
    return tuple(tasks[name] for name in sorted(tasks)), errors
