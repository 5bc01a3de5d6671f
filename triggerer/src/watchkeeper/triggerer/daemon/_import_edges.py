"""Which files of the watchers path each watcher file imports, noted as they are read.

The reading process (:mod:`._evaluate`) notes them so that a later load reads again only the
files that may define something else now: a file that changed, or one that imports (directly
or through others) a file that changed. A module imported by a path outside the import
statement and :func:`importlib.import_module` (a file executed by hand, say) is not noted.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import os
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ImportTracker"]


class ImportTracker:
    """In the reading process: which files of the watchers path each file's code imports.

    Every ``import`` statement (``builtins.__import__``) and :func:`importlib.import_module`
    call is noted as an edge from the importing file (the one whose code runs the import, or
    else the watcher file being read) to each file of the path the imported modules and their
    parent packages come from, whether they were imported now or earlier."""

    def __init__(self, root: Path) -> None:
        self._root = str(root) + os.sep
        self.current: str | None = None
        self.edges: dict[str, set[str]] = {}
        self._import = builtins.__import__
        self._import_module = importlib.import_module

    def install(self) -> None:
        builtins.__import__ = self._tracked_import
        importlib.import_module = self._tracked_import_module

    def _rel(self, file: object) -> str | None:
        if isinstance(file, str) and file.startswith(self._root):
            return file[len(self._root) :].replace(os.sep, "/")
        return None

    def _note(self, importer_file: object, names: Sequence[str]) -> None:
        importer = self._rel(importer_file) or self.current
        if importer is None:
            return
        for name in names:
            parts = name.split(".")
            for end in range(1, len(parts) + 1):
                module = sys.modules.get(".".join(parts[:end]))
                rel = self._rel(getattr(module, "__file__", None))
                if rel is not None and rel != importer:
                    self.edges.setdefault(importer, set()).add(rel)

    def _tracked_import(
        self,
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        module = self._import(name, globals, locals, fromlist, level)
        with contextlib.suppress(Exception):  # noting must never fail an import
            base = str(getattr(module, "__name__", name)) if fromlist or level else name
            names = [base, *(f"{base}.{item}" for item in fromlist or () if item != "*")]
            self._note((globals or {}).get("__file__"), names)
        return module

    def _tracked_import_module(self, name: str, package: str | None = None) -> types.ModuleType:
        module = self._import_module(name, package)
        with contextlib.suppress(Exception):
            self._note(None, [module.__name__])
        return module
