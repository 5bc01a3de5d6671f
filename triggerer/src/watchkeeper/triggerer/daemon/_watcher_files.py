"""Watcher files: finding them, importing them into their package, reading what they define.

Each ``*.py`` file under the watchers path is imported as ``watchkeeper_watchers.<relative.module>``
(a package whose ``__path__`` is the watchers path), and the path is put on ``sys.path`` so the
files can import helper modules that sit next to them. Module-level :class:`Asset` objects with
``watchers=[AssetWatcher(name, trigger)]`` define what is watched; another framework's assets
(Apache Airflow's ``Asset`` with its ``AssetWatcher``) are read by their attributes, and their
triggers wrapped by the adapter installed for them (see :mod:`._adapters`).

Reading a file yields its :class:`FileDefinitions`: each asset's name and URI and, for each of
its watchers, the watcher's name and its trigger's ``serialize()`` as canonical JSON. That is
plain data, so a file can be read in another process (the daemon does, see :mod:`._evaluate`:
a file that hangs at import then cannot hang the daemon) and handed back as JSON.

The imports change ``sys.modules`` and ``sys.path``, which are the process's: :data:`MODULES`
(a :class:`WatcherModules`) is the one object that does, under its lock, and remembers which
watchers paths it put on ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import traceback
import types
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchkeeper.store import Asset, InvalidValueError, ValueTypeError

from .._core import describe_error
from ..trigger import BaseEventTrigger
from ._adapters import adapter_for_trigger, asset_of, foreign_refusal, is_foreign_asset, watcher_of
from ._identity import BUILTIN_ALLOWED, canonical_trigger_json

__all__ = [
    "MODULES",
    "PACKAGE",
    "AssetDefinition",
    "FileDefinitions",
    "FileReads",
    "FileStamp",
    "WatcherDefinition",
    "WatcherError",
    "WatcherModules",
    "default_allowed_modules",
    "import_definition_files",
    "read_definitions",
    "scan_watchers_path",
    "unload_watchers",
    "watcher_files",
]

PACKAGE = "watchkeeper_watchers"
"""The package the watcher files are imported into (``watchkeeper_watchers.orders``)."""


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


def default_allowed_modules(path: Path) -> list[str]:
    """``watchkeeper.watchers``, the watcher files' package, and the path's top-level modules."""
    names = [*BUILTIN_ALLOWED, PACKAGE]
    if path.is_dir():
        for child in sorted(path.iterdir()):
            stem = child.stem if child.suffix == ".py" else child.name
            if child.is_dir() and not (child / "__init__.py").exists():
                continue
            if (child.suffix == ".py" or child.is_dir()) and stem.isidentifier():
                names.append(stem)
    return names


FileStamp = tuple[int, int, int]
"""A watcher file's ``(mtime_ns, size, crc32 of its content)``."""


def scan_watchers_path(path: Path) -> dict[str, FileStamp]:
    """``{relative file: FileStamp}`` of every watcher file; blocking, use a thread.

    The content's checksum is part of the stamp: the kernel's timestamps move in ticks of a
    few milliseconds, so a second write of the same size within one tick leaves mtime and
    size as they were (a deploy that writes a file twice, one value for another)."""
    found: dict[str, FileStamp] = {}
    if not path.is_dir():
        return found
    for file in watcher_files(path):
        try:
            st = file.stat()
            content = file.read_bytes()
        except FileNotFoundError:  # removed between listing and reading
            continue
        found[file.relative_to(path).as_posix()] = (st.st_mtime_ns, st.st_size, zlib.crc32(content))
    return found


@dataclass(frozen=True, slots=True)
class FileReads:
    """What the last load read, so that the next one reads again only what may have changed.

    ``stamps`` are the files' stamps taken before they were read, ``definitions`` what each
    file defined (or why it was refused), ``imports`` maps a file of the watchers path to the
    files of the path its code imported (both relative): a file is read again when it, or a
    file it imports directly or not, changed, appeared or went. ``allowed`` is the allow-list
    the load was given (None: the default one, see :func:`default_allowed_modules`).
    """

    stamps: Mapping[str, FileStamp]
    definitions: Mapping[str, FileDefinitions]
    imports: Mapping[str, frozenset[str]]
    allowed: tuple[str, ...] | None

    def stale(self, stamps: Mapping[str, FileStamp]) -> set[str]:
        """The files of ``stamps`` to read again: new or changed ones, those refused last
        time (the cause may lie outside the path), and those that import, directly or not,
        a file that changed, appeared or went."""
        changed = {rel for rel, stamp in stamps.items() if self.stamps.get(rel) != stamp}
        added_or_gone = (stamps.keys() - self.stamps.keys()) | (self.stamps.keys() - stamps.keys())
        if any(rel.rsplit("/", 1)[-1] == "__init__.py" for rel in added_or_gone):
            return set(stamps)  # a directory became a package, or stopped being one
        changed |= added_or_gone
        importers: dict[str, set[str]] = {}
        for importer, imported in self.imports.items():
            for rel in imported:
                importers.setdefault(rel, set()).add(importer)
        todo, affected = list(changed), set(changed)
        while todo:
            for importer in importers.get(todo.pop(), ()):
                if importer not in affected:
                    affected.add(importer)
                    todo.append(importer)
        for rel in stamps:
            defs = self.definitions.get(rel)
            if defs is None or defs.error is not None:
                affected.add(rel)
        return affected & stamps.keys()


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


class _FromSource(importlib.machinery.SourceFileLoader):
    """Compiles the file from its source at every import, never from ``__pycache__``: Python
    trusts a bytecode file when the source's size and modification time in whole seconds
    match, so a watcher file rewritten within a second at the same size (one path for
    another) would otherwise load its old code."""

    def get_code(self, fullname: str) -> types.CodeType:
        return self.source_to_code(self.get_data(self.path), self.path)


class _SourceFinder:
    """A ``sys.meta_path`` finder just before the path finder: the same search, with
    :class:`_FromSource` as the loader of the files under the watchers paths (the watcher
    files and the helper modules beside them). Other modules keep their bytecode cache."""

    def __init__(self, roots: list[str]) -> None:
        self._roots = roots

    def find_spec(
        self, name: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        origin = spec.origin if spec is not None else None
        if (
            spec is not None
            and origin is not None
            and isinstance(spec.loader, importlib.machinery.SourceFileLoader)
            and any(origin.startswith(root + "/") for root in self._roots)
        ):
            spec.loader = _FromSource(name, origin)
            spec.cached = None
        return spec


class WatcherModules:
    """The process's imports of watcher files: ``sys.modules`` and ``sys.path`` edited in one
    place, under :attr:`lock` (two loads must not interleave)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._roots: list[str] = []  # watchers paths this process put on sys.path
        self._finder = _SourceFinder(self._roots)

    def _purge(self) -> None:
        for name, module in list(sys.modules.items()):
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                del sys.modules[name]
                continue
            file = getattr(module, "__file__", None)
            if (
                file
                and not name.startswith("watchkeeper.")
                and any(file.startswith(root + "/") for root in self._roots)
            ):
                del sys.modules[name]  # a helper module next to the watcher files

    def unload(self) -> None:
        """Forget every module a load imported and take the watchers paths off ``sys.path``."""
        with self.lock:
            self._purge()
            for root in self._roots:
                while root in sys.path:
                    sys.path.remove(root)
            self._roots.clear()
            while self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)

    def reset(self, path: Path) -> None:
        """Forget the modules of earlier loads and point the package at ``path`` alone.

        Call with :attr:`lock` held (or in a process of its own).
        """
        root = str(path)
        if root not in self._roots:
            self._roots.append(root)
        self._purge()
        for old in [r for r in self._roots if r != root]:
            while old in sys.path:
                sys.path.remove(old)
            self._roots.remove(old)
        spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [root]
        sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
        if root not in sys.path:
            sys.path.append(root)
        if self._finder not in sys.meta_path:
            finder = importlib.machinery.PathFinder
            at = sys.meta_path.index(finder) if finder in sys.meta_path else len(sys.meta_path)
            sys.meta_path.insert(at, self._finder)
        importlib.invalidate_caches()

    def drop(self, path: Path, files: Collection[str]) -> None:
        """Forget the modules of ``files`` (relative to ``path``, under whatever name they
        were imported) and keep the others of the path; a full :meth:`reset` when the
        package does not point at ``path`` now. Call with :attr:`lock` held."""
        package = sys.modules.get(PACKAGE)
        if package is None or list(getattr(package, "__path__", ())) != [str(path)]:
            self.reset(path)
            return
        doomed = {str(path / rel) for rel in files}
        for name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) in doomed:
                del sys.modules[name]
        importlib.invalidate_caches()


MODULES = WatcherModules()
"""The one :class:`WatcherModules` of this process (``sys.modules`` is the process's)."""


def unload_watchers() -> None:
    """Forget every module a load imported and take the watchers paths off ``sys.path``."""
    MODULES.unload()


def _under(root: Path, filename: str | None) -> str | None:
    """``filename`` relative to the watchers path ``root``, or None when it is elsewhere."""
    if not filename or filename.startswith("<"):  # "<frozen importlib._bootstrap>"
        return None
    try:
        return Path(filename).resolve().relative_to(root.resolve()).as_posix()
    except (OSError, ValueError):
        return None


def raised_at(root: Path, exc: BaseException) -> str:
    """`` (at FILE:LINE)``: the line of the watchers path where ``exc`` was raised (the
    deepest frame of its traceback in a file under ``root``; a syntax error's own line), or
    "" when no frame is there."""
    if isinstance(exc, SyntaxError):
        rel = _under(root, exc.filename)
        if rel is not None and exc.lineno is not None:
            return f" (at {rel}:{exc.lineno})"
    found = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        rel = _under(root, frame.f_code.co_filename)
        if rel is not None:
            found = f" (at {rel}:{line})"
    return found


def import_definition_files(
    path: Path, files: Collection[str] | None = None, *, forget: Collection[str] = ()
) -> list[tuple[str, types.ModuleType | None, WatcherError | None]]:
    """Import every definition file under ``path`` (in path order) into the watchers' package,
    as a load does: ``(relative path, module, None)`` for each file that imported, ``(relative
    path, None, refusal)`` for each that did not. Blocking (it runs the files' code).

    With ``files`` (relative paths), a reload of what changed: only their modules, and those
    of the files in ``forget`` (gone, say), are forgotten and only ``files`` are imported
    again; every other module of the path stays as imported (see :meth:`WatcherModules.drop`).
    """
    found: list[tuple[str, types.ModuleType | None, WatcherError | None]] = []
    with MODULES.lock:
        if files is None:
            MODULES.reset(path)
        else:
            MODULES.drop(path, {*files, *forget})
        chosen = watcher_files(path) if files is None else sorted(path / rel for rel in files)
        for file in chosen:
            module, error = _import_file(path, file)
            found.append((file.relative_to(path).as_posix(), module, error))
    return found


def _import_file(path: Path, file: Path) -> tuple[types.ModuleType | None, WatcherError | None]:
    relative = file.relative_to(path)
    rel = relative.as_posix()
    module_name = _module_name(relative)
    if module_name is None:
        return None, WatcherError(rel, None, "file name is not a valid Python module name")
    try:
        return importlib.import_module(module_name), None
    except SyntaxError as exc:
        where = raised_at(path, exc) or f" (line {exc.lineno})"
        return None, WatcherError(rel, None, f"SyntaxError: {exc.msg}{where}")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a watcher file must not kill the daemon
        where = raised_at(path, exc)
        return None, WatcherError(rel, None, f"import failed: {describe_error(exc)}{where}")


def _serialize(
    rel: str, name: str, trigger: object, root: Path
) -> WatcherDefinition | WatcherError:
    try:
        if isinstance(trigger, BaseEventTrigger):
            classpath, kwargs = trigger.serialize()
        else:  # another framework's trigger (an Airflow one): its adapter wraps it, or refuses
            adapter = adapter_for_trigger(trigger)
            if adapter is None:
                return WatcherError(rel, name, foreign_refusal(trigger))
            try:
                classpath, kwargs = adapter.wrap(trigger)
            except (TypeError, ValueError) as exc:
                where = raised_at(root, exc)
                return WatcherError(rel, name, f"cannot run here: {exc}{where}")
        canonical = canonical_trigger_json(classpath, kwargs)
    except (InvalidValueError, ValueTypeError) as exc:
        return WatcherError(rel, name, f"serialize() kwargs are not JSON: {exc}")
    except Exception as exc:  # noqa: BLE001 - user code; reported, never fatal
        where = raised_at(root, exc)
        return WatcherError(rel, name, f"serialize() failed: {describe_error(exc)}{where}")
    try:
        canonical.encode()  # the trigger id hashes it
    except UnicodeEncodeError:
        return WatcherError(rel, name, "serialize() kwargs are not valid UTF-8 (a lone surrogate)")
    return WatcherDefinition(name, classpath, canonical)


def _module_definitions(rel: str, module: types.ModuleType, root: Path) -> FileDefinitions:
    assets: list[AssetDefinition] = []
    refused: list[WatcherError] = []
    seen: set[int] = set()
    for value in vars(module).values():
        if id(value) in seen or not (isinstance(value, Asset) or is_foreign_asset(value)):
            continue
        seen.add(id(value))
        asset = asset_of(value)
        if isinstance(asset, str):
            refused.append(WatcherError(rel, None, asset))
            continue
        watchers: list[WatcherDefinition] = []
        for watcher in getattr(value, "watchers", ()):
            found = watcher_of(asset.name, watcher)
            if isinstance(found, str):
                refused.append(WatcherError(rel, None, found))
                continue
            serialized = _serialize(rel, *found, root)
            if isinstance(serialized, WatcherError):
                refused.append(serialized)
            elif serialized not in watchers:
                watchers.append(serialized)
        assets.append(AssetDefinition(asset.name, asset.uri, tuple(watchers)))
    return FileDefinitions(rel, assets=tuple(assets), refused=tuple(refused))


def read_definitions(path: Path, file: Path) -> FileDefinitions:
    """Import one watcher file (the package set up by :meth:`WatcherModules.reset`) and serialize
    what it defines. Runs the file's code: blocking, and unbounded in time."""
    module, error = _import_file(path, file)
    if module is None:
        assert error is not None
        return FileDefinitions(error.file, error=error)
    return _module_definitions(file.relative_to(path).as_posix(), module, path)
