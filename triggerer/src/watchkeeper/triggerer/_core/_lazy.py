"""Re-exports that load on first use (PEP 562), so importing a package costs only what is used.

A package's ``__init__`` lists what it re-exports from which module; a name is imported from
its module the first time it is read (``from watchkeeper.triggerer import BaseTrigger`` loads
the authoring API, not the daemon, its HTTP API or the worker) and kept in the package's
namespace after that. The same ``from ... import`` lines sit under ``if TYPE_CHECKING:`` for
type checkers. (The store has its own copy: a part never imports another's private module.)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of the module named ``package``, which
    re-exports each name of ``exports[module]`` from ``module`` (a relative name is resolved
    as the module's own relative imports are)."""
    where = {name: module for module, names in exports.items() for name in names}
    namespace = sys.modules[package].__dict__
    anchor = namespace["__package__"]  # what relative names are resolved against

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, anchor), name)
        namespace[name] = value  # the next read is a plain attribute lookup
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
