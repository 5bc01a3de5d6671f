"""The layout rules, read from the source: module size, one-way imports, no cycle, no private
module of another part.

The import graph is built from the source text (``ast``), so it sees every import a module can
run: at import time, in a ``try`` or an ``if``, and inside functions (a lazy import still ties
two modules). Imports under ``if TYPE_CHECKING:`` are left out: they never run, and a mixin may
name the class it is mixed into for its annotations.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("store", "triggerer", "watchers", "airflow")
ORDER = {part: rank for rank, part in enumerate(PARTS)}
"""A part may import the parts before it: airflow -> watchers -> triggerer -> store."""
FOLDERS = {"airflow": "airflow-bridge"}
"""A part's folder, where it is not the part's name."""
MAX_LINES = 500


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def part(self) -> str:
        return self.name.split(".")[1]


def _modules() -> dict[str, Module]:
    found = {}
    for part in PARTS:
        src = ROOT / FOLDERS.get(part, part) / "src"
        for path in sorted(src.rglob("*.py")):
            pieces = list(path.relative_to(src).with_suffix("").parts)
            is_package = pieces[-1] == "__init__"
            if is_package:
                pieces.pop()
            name = ".".join(pieces)
            found[name] = Module(name, path, is_package)
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(statements: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Every import in ``statements`` and the blocks below them, but for TYPE_CHECKING ones."""
    found: list[ast.Import | ast.ImportFrom] = []
    for statement in statements:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            found.append(statement)
        elif isinstance(statement, ast.If) and _is_type_checking(statement.test):
            found += _import_nodes(statement.orelse)
        else:
            for field in ("body", "orelse", "finalbody"):
                found += _import_nodes(getattr(statement, field, []))
            for handler in getattr(statement, "handlers", []):
                found += _import_nodes(handler.body)
            for case in getattr(statement, "cases", []):
                found += _import_nodes(case.body)
    return found


def _imported(module: Module) -> set[str]:
    """The full names a module imports: modules of ours or anything else."""
    names: set[str] = set()
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    for node in _import_nodes(tree.body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = module.name.split(".")
            if not module.is_package:
                anchor.pop()
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            names.add(submodule if submodule in MODULES else base)
    return names


def _ours(name: str) -> str | None:
    """The module of ours that ``name`` is, or is inside of; None for other projects."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, module in MODULES.items():
        targets = {_ours(imported) for imported in _imported(module)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


BACKEND_CLASSES = frozenset({"MemoryStateBackend", "SqliteStateBackend", "PostgresStateBackend"})


def _backend_probes(source: str) -> list[int]:
    """The lines of ``source`` that call ``isinstance`` with a built-in backend class."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            named = {
                n.id if isinstance(n, ast.Name) else n.attr
                for n in ast.walk(node.args[1])
                if isinstance(n, ast.Name | ast.Attribute)
            }
            if named & BACKEND_CLASSES:
                lines.append(node.lineno)
    return sorted(lines)


class TestLayout:
    def test_the_source_tree_was_found(self) -> None:
        """The walk sees each part's package and its private modules (the rules below would
        pass vacuously on an empty walk)."""
        for name in ("watchkeeper.store", "watchkeeper.triggerer", "watchkeeper.watchers"):
            assert name in MODULES
        assert "watchkeeper.store._backend" in MODULES
        assert "watchkeeper.triggerer.cli._common" in MODULES
        assert {"watchkeeper.store"} <= _graph()["watchkeeper.triggerer.runtime._runner"]

    def test_no_module_is_over_500_lines(self) -> None:
        """No module of the three parts is over 500 lines: a longer one is split by job."""
        oversized = []
        for module in MODULES.values():
            relative = module.path.relative_to(ROOT).as_posix()
            lines = len(module.path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                oversized.append(f"{relative}: {lines} lines")
        assert oversized == []

    def test_no_import_cycle(self) -> None:
        """No group of modules imports itself round, at import time or lazily in a function."""
        assert _cycles(_graph()) == []

    def test_a_backend_holds_its_parts_instead_of_mixing_them_in(self) -> None:
        """Each built-in backend class has at most four of our classes in its method
        resolution order, and no part reaches its store through ``return self`` with a type
        ignore: a backend's parts are objects it holds."""
        from watchkeeper.store import MemoryStateBackend, PostgresStateBackend, SqliteStateBackend

        ours = {
            cls.__name__: [
                k.__name__ for k in cls.__mro__ if k.__module__.startswith("watchkeeper")
            ]
            for cls in (MemoryStateBackend, SqliteStateBackend, PostgresStateBackend)
        }
        assert {name: mro for name, mro in ours.items() if len(mro) > 4} == {}
        reaching = [
            module.path.name
            for name, module in MODULES.items()
            if name.startswith("watchkeeper.store")
            and "return self  # type: ignore" in module.path.read_text(encoding="utf-8")
        ]
        assert reaching == []

    def test_no_module_outside_the_store_probes_a_backend_class(self) -> None:
        """Outside the store, no module calls ``isinstance`` on a built-in backend class: what
        a caller needs to know of a store is a capability the store offers every backend."""
        probing = [
            f"{name}:{line}"
            for name, module in MODULES.items()
            if module.part != "store"
            for line in _backend_probes(module.path.read_text(encoding="utf-8"))
        ]
        assert probing == []

    def test_backend_probe_finder_finds_one(self) -> None:
        """The finder sees a probe by name, by attribute, in a tuple and in a union."""
        source = (
            "isinstance(b, SqliteStateBackend)\n"
            "isinstance(b, store.PostgresStateBackend)\n"
            "isinstance(b, (int, MemoryStateBackend))\n"
            "isinstance(b, int | SqliteStateBackend)\n"
            "isinstance(b, BaseStateBackend)\n"
        )
        assert _backend_probes(source) == [1, 2, 3, 4]

    def test_cycle_finder_finds_a_cycle(self) -> None:
        """The cycle finder reports a cycle it is given (so an empty answer means something)."""
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        assert _cycles(graph) == [["a", "b", "c"]]

    def test_imports_point_one_way(self) -> None:
        """store imports neither the triggerer nor the watchers; the triggerer not the watchers."""
        graph = _graph()
        backwards = [
            f"{name} imports {target}"
            for name, targets in graph.items()
            for target in targets
            if ORDER[MODULES[target].part] > ORDER[MODULES[name].part]
        ]
        assert backwards == []

    @pytest.mark.parametrize("part", ["triggerer", "watchers"])
    def test_no_private_module_of_another_part_is_imported(self, part: str) -> None:
        """A part imports another part's public modules only (``watchkeeper.store.protocols``,
        not ``watchkeeper.store._backend``)."""
        private = []
        for name, module in MODULES.items():
            if module.part != part:
                continue
            for imported in _imported(module):
                target = _ours(imported)
                if target is None or MODULES[target].part == part:
                    continue
                if any(piece.startswith("_") for piece in imported.split(".")[2:]):
                    private.append(f"{name} imports {imported}")
        assert private == []

    def test_the_demo_and_the_cli_meet_at_the_demo_package_only(self) -> None:
        """The demo imports nothing of the CLI, and the CLI imports the demo's package, never
        its private modules: ``watchkeeper demo`` only dispatches to it."""
        graph = _graph()
        demo, cli = "watchkeeper.triggerer.demo", "watchkeeper.triggerer.cli"
        crossings = [
            f"{name} imports {target}"
            for name, targets in graph.items()
            for target in targets
            if (name.startswith(demo) and target.startswith(cli))
            or (name.startswith(cli) and target.startswith(f"{demo}."))
        ]
        assert crossings == []
        assert demo in {t for name, ts in graph.items() if name.startswith(cli) for t in ts}


TRIGGERER = "watchkeeper.triggerer"
WINGS = ("_core", "runtime", "daemon", "worker", "cli", "api", "testing", "demo")
"""The triggerer's subpackages, by product; ``_core`` is what they all share."""
LIBRARY_WINGS = ("_core", "runtime", "daemon", "worker")
"""The wings other wings build on: their public names are their ``__init__``'s ``__all__``."""
TOP_LEVEL = {"trigger", "errors", "settings"}
"""The modules at the triggerer's top besides the packages: the authoring API and settings."""


def _wing(name: str) -> str | None:
    """The wing of the triggerer module ``name`` (None for a top-level module or another part)."""
    pieces = name.split(".")
    if pieces[:2] != TRIGGERER.split(".") or len(pieces) < 3 or pieces[2] not in WINGS:
        return None
    return pieces[2]


def _exported(package: str) -> set[str]:
    """The names in ``package``'s ``__all__``, read from its ``__init__.py``."""
    tree = ast.parse(MODULES[package].path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            value = ast.literal_eval(node.value)
            return set(value)
    return set()


def _imported_names(module: Module) -> list[tuple[str, str]]:
    """``(module, name)`` for each name a module imports with ``from ... import``."""
    found = []
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    for node in _import_nodes(tree.body):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            anchor = module.name.split(".")
            if not module.is_package:
                anchor.pop()
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        found += [(base, alias.name) for alias in node.names]
    return found


def _wing_imports(wing: str) -> dict[str, set[str]]:
    """Each module of ``wing`` and the wings it imports (other than its own)."""
    graph = _graph()
    return {
        name: {w for target in graph[name] if (w := _wing(target)) not in (None, wing)}
        for name in graph
        if _wing(name) == wing
    }


class TestWings:
    def test_the_wings_were_found(self) -> None:
        """Every wing is a package of the triggerer (the rules below would pass on none)."""
        for wing in WINGS:
            assert MODULES[f"{TRIGGERER}.{wing}"].is_package
        assert _wing_imports("cli") and _wing_imports("runtime")

    def test_no_flat_private_module_at_the_top(self) -> None:
        """The triggerer's top holds the authoring API, its settings and packages only."""
        flat = [
            name
            for name, module in MODULES.items()
            if name.startswith(f"{TRIGGERER}.")
            and name.count(".") == 2
            and not module.is_package
            and name.rpartition(".")[2] not in TOP_LEVEL
        ]
        assert flat == []

    def test_each_wing_says_what_it_may_import(self) -> None:
        """Each wing's ``__init__`` docstring says what the wing may import."""
        missing = []
        for wing in WINGS:
            tree = ast.parse(MODULES[f"{TRIGGERER}.{wing}"].path.read_text(encoding="utf-8"))
            doc = ast.get_docstring(tree) or ""
            if "may import" not in doc:
                missing.append(wing)
        assert missing == []

    @pytest.mark.parametrize(
        ("wing", "forbidden"),
        [
            ("_core", {"runtime", "daemon", "worker", "cli", "api", "testing"}),
            ("runtime", {"daemon", "worker", "cli", "api", "testing"}),
            ("daemon", {"worker", "cli", "testing"}),
            ("worker", {"runtime", "cli", "api", "testing"}),
            ("api", {"cli", "testing"}),
            # The demo drives real child processes through the command line: it needs no wing.
            ("demo", {"runtime", "daemon", "worker", "cli", "api", "testing"}),
        ],
    )
    def test_a_wing_imports_only_the_wings_below_it(self, wing: str, forbidden: set[str]) -> None:
        """The runtime imports nothing of the daemon, the worker, the CLI or the API; the shared
        core nothing of any wing; the daemon and the worker not each other's users."""
        found = [
            f"{name} imports {target}"
            for name, targets in _wing_imports(wing).items()
            for target in sorted(targets & forbidden)
        ]
        assert found == []

    @pytest.mark.parametrize("wing", ["cli", "api", "testing", "demo", "worker"])
    def test_products_import_public_names_of_the_wings(self, wing: str) -> None:
        """The CLI, the API, the test kit, the demo and the worker import another library
        wing's public names only: from the wing's package, names its ``__all__`` lists (never
        ``daemon._leases``)."""
        found = []
        for name, module in MODULES.items():
            if _wing(name) != wing:
                continue
            for base, imported in _imported_names(module):
                target = _wing(base)
                if target not in LIBRARY_WINGS or target == wing:
                    continue
                package = f"{TRIGGERER}.{target}"
                if base != package or imported not in _exported(package):
                    found.append(f"{name} imports {base}.{imported}")
        assert found == []

    def test_public_name_rule_catches_a_private_import(self, tmp_path: Path) -> None:
        """The public-name check reads a private import as one (so an empty answer means
        something): a CLI module importing the definition files' machinery privately."""
        source = tmp_path / "_probe.py"
        source.write_text("from ..daemon._watcher_files import _import_file\n", encoding="utf-8")
        probe = Module(f"{TRIGGERER}.cli._probe", source, is_package=False)
        assert (f"{TRIGGERER}.daemon._watcher_files", "_import_file") in _imported_names(probe)
        assert "_import_file" not in _exported(f"{TRIGGERER}.daemon")


def _named_in_code_layout() -> set[str]:
    """The ``*.py`` paths ``docs/code-layout.md`` names, as written (a tail of the real path)."""
    text = (ROOT / "docs" / "code-layout.md").read_text(encoding="utf-8")
    return set(re.findall(r"`([A-Za-z0-9_./]+\.py)`", text))


def _tails(path: Path) -> set[str]:
    parts = path.parts
    return {"/".join(parts[-n:]) for n in range(1, len(parts) + 1)}


class TestCodeLayoutPage:
    """``docs/code-layout.md`` has one line per module: a new module is named there, a removed
    one is gone from there."""

    def test_every_module_is_named(self) -> None:
        named = _named_in_code_layout()
        unnamed = [
            str(module.path.relative_to(ROOT))
            for module in MODULES.values()
            if not _tails(module.path.relative_to(ROOT)) & named
        ]
        assert unnamed == [], f"modules docs/code-layout.md does not name: {unnamed}"

    def test_every_named_module_exists(self) -> None:
        tails: set[str] = set()
        for top in (*(FOLDERS.get(p, p) for p in PARTS), "tests", "benchmarks", "examples", "docs"):
            for path in (ROOT / top).rglob("*.py"):
                tails |= _tails(path.relative_to(ROOT))
        stale = sorted(_named_in_code_layout() - tails)
        assert stale == [], f"docs/code-layout.md names modules that are gone: {stale}"
