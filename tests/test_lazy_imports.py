"""What importing the packages and running light commands loads, checked in fresh interpreters.

The packages re-export their names lazily (PEP 562) and the ``watchkeeper`` command imports a
subcommand's dependencies in its handler, so ``--help`` and ``status`` start fast. These tests
read ``sys.modules`` of a real subprocess after the command ran: a module-level import of a
heavy dependency slipping back in makes them fail.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from watchkeeper.store import Asset, AssetScope, SqliteStateBackend
from watchkeeper.store.protocols import TriggerStatus

SOURCES = Path(__file__).resolve().parents[1]

SERVERS = ("asyncpg", "starlette", "uvicorn", "prometheus_client")
"""Never needed by a command that serves nothing and does not use PostgreSQL."""

HEAVY = (*SERVERS, "pydantic", "pydantic_settings", "rich", "structlog", "anyio", "greenback")
"""Not needed to print the help."""

_PROBE = """
import json, sys
from watchkeeper.triggerer.cli import run
code = run(sys.argv[1:]) if sys.argv[1:] != ["--help"] else None
if code is None:
    try:
        run(["--help"])
    except SystemExit as exc:
        code = exc.code
watched = {watched!r}
loaded = sorted(name for name in watched if name in sys.modules)
sys.stderr.write(json.dumps({{"code": code, "loaded": loaded}}) + "\\n")
"""


def _probe(
    *args: str, env: dict[str, str] | None = None, watched: tuple[str, ...] = HEAVY
) -> dict[str, Any]:
    """Run the command in a fresh interpreter; its exit code and the watched modules it loaded."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(watched=watched), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    report: dict[str, Any] = json.loads(result.stderr.strip().splitlines()[-1])
    report["stdout"] = result.stdout
    return report


class TestCommandImports:
    def test_help_loads_nothing_heavy(self) -> None:
        """``watchkeeper --help`` prints the commands without loading pydantic, rich, anyio,
        structlog, the drivers or the HTTP server."""
        report = _probe("--help")
        assert (report["code"], report["loaded"]) == (0, [])
        assert "status" in report["stdout"]

    async def test_status_on_sqlite_loads_no_server_nor_postgres(self, tmp_path: Path) -> None:
        """``watchkeeper status --json`` on SQLite reads the statuses without loading asyncpg,
        starlette, uvicorn, prometheus-client, greenback, or structlog (no logs asked for)."""
        db = tmp_path / "state.db"
        async with SqliteStateBackend(db) as backend:
            await backend.events.aregister_assets([Asset("orders")])
            await backend.aset(AssetScope(name="orders"), "wm", 3)
            await backend.status.asave_trigger_status(
                [
                    TriggerStatus(
                        trigger_id="t1",
                        classpath="pkg.W",
                        assets=("orders",),
                        watchers=("w1",),
                        state="running",
                        updated_at=datetime.now(UTC),
                    )
                ]
            )
        env = {"PATH": "/usr/bin:/bin", "WATCHKEEPER__DATABASE__URL": f"sqlite:///{db}"}
        report = _probe("status", "--json", env=env, watched=(*SERVERS, "greenback", "structlog"))
        assert (report["code"], report["loaded"]) == (0, [])
        [watcher] = json.loads(report["stdout"])["watchers"]
        assert (watcher["watchers"], watcher["assets"][0]["state"]) == (["w1"], {"wm": 3})


class TestPackageImports:
    @pytest.mark.parametrize("package", ["watchkeeper.store", "watchkeeper.triggerer"])
    def test_importing_a_package_loads_no_dependency(self, package: str) -> None:
        """``import watchkeeper.store`` / ``watchkeeper.triggerer`` alone loads none of the
        heavy dependencies; they come with the first name that needs them."""
        code = (
            f"import sys, json, {package}\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
        assert json.loads(result.stdout) == []


def _type_checking_imports(path: Path) -> dict[str, str]:
    """``{name: module}`` of the ``from ... import`` lines under the module's top-level
    ``if TYPE_CHECKING:``, relative modules made absolute for ``path``'s package."""
    package = ".".join(path.relative_to(SOURCES).parts[2:-1])  # e.g. watchkeeper.store
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom):
                module = "." * stmt.level + (stmt.module or "")
                absolute = importlib.util.resolve_name(module, package)
                found.update((alias.asname or alias.name, absolute) for alias in stmt.names)
    return found


LAZY = {
    "watchkeeper.store": SOURCES / "store/src/watchkeeper/store/__init__.py",
    "watchkeeper.store.protocols": SOURCES / "store/src/watchkeeper/store/protocols.py",
    "watchkeeper.triggerer": SOURCES / "triggerer/src/watchkeeper/triggerer/__init__.py",
}


class TestLazyExports:
    @pytest.mark.parametrize("package", sorted(LAZY))
    def test_what_type_checkers_see_is_what_is_loaded(self, package: str) -> None:
        """Each name imported under ``if TYPE_CHECKING:`` is exported, and reading it from the
        package gives the very object of the module the import line names."""
        module = importlib.import_module(package)
        declared = _type_checking_imports(LAZY[package])
        assert declared and set(declared) <= set(module.__all__)
        wrong = [
            name
            for name, source in declared.items()
            if getattr(module, name) is not getattr(importlib.import_module(source), name)
        ]
        assert wrong == []

    @pytest.mark.parametrize("package", sorted(LAZY))
    def test_an_unknown_name_is_an_attribute_error(self, package: str) -> None:
        """A name the package does not export raises AttributeError naming it."""
        module = importlib.import_module(package)
        with pytest.raises(AttributeError, match="no_such_name"):
            module.no_such_name  # noqa: B018 - the attribute read is the test

    def test_dir_lists_the_lazy_names(self) -> None:
        """``dir()`` of a package lists its exports before they are loaded."""
        module = importlib.import_module("watchkeeper.triggerer")
        assert set(module.__all__) <= set(dir(module))
