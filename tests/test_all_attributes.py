"""Each package's ``__all__`` is honest: every name exists, and the store's are its own."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

PACKAGES = [
    "watchkeeper.store",
    "watchkeeper.store.protocols",
    "watchkeeper.triggerer",
    "watchkeeper.triggerer.cli",
    "watchkeeper.triggerer.daemon",
    "watchkeeper.triggerer.runner",
    "watchkeeper.triggerer.runtime",
    "watchkeeper.triggerer.demo",
    "watchkeeper.triggerer.testing",
    "watchkeeper.triggerer.worker",
    "watchkeeper.watchers",
]
SOURCES = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    return importlib.import_module(name)


class TestAllAttributes:
    @pytest.mark.parametrize("package", PACKAGES)
    def test_every_exported_name_exists(self, package: str) -> None:
        """Every name in the package's __all__ is an attribute of the package."""
        module = _load(package)
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == []

    @pytest.mark.parametrize("package", PACKAGES)
    def test_all_has_no_duplicates_and_is_sorted(self, package: str) -> None:
        """__all__ lists each name once, in ruff's sort order (constants, classes, functions)."""
        names = list(_load(package).__all__)
        assert len(names) == len(set(names))

        def rank(name: str) -> tuple[int, str]:
            if name.isupper():
                return (0, name)
            return (1, name) if name[:1].isupper() else (2, name)

        assert names == sorted(names, key=rank)

    @pytest.mark.parametrize("package", ["watchkeeper.store", "watchkeeper.store.protocols"])
    def test_store_names_are_defined_in_the_store(self, package: str) -> None:
        """Every class and function the store's public modules export is defined in the store."""
        module = _load(package)
        foreign = []
        for name in module.__all__:
            value = getattr(module, name)
            if not (isinstance(value, type) or callable(value)):
                continue
            owner = getattr(value, "__module__", "")
            if owner != "watchkeeper.store" and not owner.startswith("watchkeeper.store."):
                foreign.append(f"{name} from {owner}")
        assert foreign == []

    def test_store_constants_are_exported(self) -> None:
        """The store's constants keep their documented values."""
        module = _load("watchkeeper.store")
        assert module.MAX_KEY_LENGTH == 512
        assert module.DEFAULT_MAX_VALUE_BYTES == 65536
        assert repr(module.NEVER_EXPIRE) == "NEVER_EXPIRE"

    def test_store_imports_nothing_of_ours(self) -> None:
        """watchkeeper.store does not import the triggerer or the watchers (one-way imports)."""
        import subprocess
        import sys

        code = (
            "import sys, watchkeeper.store\n"
            "bad = [m for m in sys.modules if m.startswith(('watchkeeper.triggerer', "
            "'watchkeeper.watchers'))]\n"
            "print(','.join(bad))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert result.stdout.strip() == ""

    @pytest.mark.parametrize("part", ["triggerer", "watchers"])
    def test_no_private_store_module_is_imported(self, part: str) -> None:
        """The triggerer and the watchers import only the store's public modules."""
        private = re.compile(r"watchkeeper\.store\._\w+")
        found = [
            f"{path.name}: {match.group()}"
            for path in sorted((SOURCES / part / "src").rglob("*.py"))
            for match in private.finditer(path.read_text(encoding="utf-8"))
        ]
        assert found == []

    def test_built_in_backends_have_every_service(self) -> None:
        """Memory, SQLite and PostgreSQL backends offer every service."""
        store, backend = _load("watchkeeper.store"), _load("watchkeeper.store.protocols")
        instances = [
            store.MemoryStateBackend(),
            store.SqliteStateBackend("never-opened.db"),
            store.PostgresStateBackend("postgresql://nobody@127.0.0.1:1/none"),
        ]
        missing = [
            f"{type(b).__name__} lacks {name}"
            for b in instances
            for name in backend.SERVICE_NAMES
            if getattr(b.services, name) is None
        ]
        assert missing == []

    def test_store_exports_the_user_api_and_backend_the_runtime_api(self) -> None:
        """Records and value rules the runtime needs are in watchkeeper.store.protocols, not in
        the user API of watchkeeper.store."""
        store, backend = _load("watchkeeper.store"), _load("watchkeeper.store.protocols")
        runtime = {"EventCommit", "Fence", "Writer", "TriggerStatus", "encode_json", "check_key"}
        assert runtime & set(store.__all__) == set()
        assert runtime <= set(backend.__all__)
        assert {"Asset", "TaskScope", "run_task", "open_state_backend"} <= set(store.__all__)

    def test_triggerer_exports_no_loader_internals(self) -> None:
        """watchkeeper.triggerer exports the authoring, runtime and daemon API, not the loader's
        records and functions (they stay importable from the private modules)."""
        module = _load("watchkeeper.triggerer")
        internals = {"LoadResult", "WatcherError", "WatcherGroup", "load_watchers"}
        assert internals & set(module.__all__) == set()
        assert not any(hasattr(module, name) for name in internals)

    def test_cli_exposes_main_and_build_parser(self) -> None:
        """The ``watchkeeper`` entry point's module exports ``main`` and ``build_parser``."""
        module = _load("watchkeeper.triggerer.cli")
        assert module.__all__ == ["build_parser", "main"]
        assert callable(module.main) and callable(module.build_parser)

    def test_triggerer_imports_no_watchers(self) -> None:
        """watchkeeper.triggerer and its CLI do not import the watchers (one-way imports)."""
        import subprocess
        import sys

        code = (
            "import sys, watchkeeper.triggerer, watchkeeper.triggerer.cli, "
            "watchkeeper.triggerer.testing\n"
            "print(','.join(m for m in sys.modules if m.startswith('watchkeeper.watchers')))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert result.stdout.strip() == ""


def _public_callables(package: str) -> list[tuple[str, object]]:
    """The functions and classes ``package`` exports that are written in the triggerer and
    built by the user (settings models document their fields as attributes; ``AssetTask`` is
    built by ``asset_task``)."""
    import inspect

    from pydantic import BaseModel

    module = importlib.import_module(package)
    found: list[tuple[str, object]] = []
    for name in module.__all__:
        value = getattr(module, name)
        if not (inspect.isfunction(value) or inspect.isclass(value)):
            continue
        if not value.__module__.startswith("watchkeeper.triggerer"):
            continue
        if (inspect.isclass(value) and issubclass(value, BaseModel)) or name == "AssetTask":
            continue
        found.append((name, value))
    return found


def _undocumented_parameters(value: object) -> list[str]:
    import inspect

    target = value.__init__ if inspect.isclass(value) else value
    try:
        signature = inspect.signature(target)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    doc = inspect.getdoc(value) or ""
    return [
        name
        for name, parameter in signature.parameters.items()
        if name not in ("self", "cls")
        and not name.startswith("_")
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        and f":param {name}:" not in doc
    ]


@pytest.mark.parametrize(
    "package",
    # The user's API: the authoring names, the runner, the daemon, the worker and tasks. (The
    # runtime wing's other names are the daemon's; the test kit's records are built by it.)
    ["watchkeeper.triggerer", "watchkeeper.triggerer.worker"],
)
def test_the_public_api_documents_every_parameter(package: str) -> None:
    """Every parameter of a public function or class has a ``:param name:`` line (the docs
    site renders them as a table)."""
    missing = {
        name: undocumented
        for name, value in _public_callables(package)
        if (undocumented := _undocumented_parameters(value))
    }
    assert missing == {}
