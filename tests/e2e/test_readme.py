"""Every code block of the README and of the guides under ``docs/`` runs as written.

Python blocks are written to files (named after the ``*.py`` file the prose just before a block
names, so ``from my_watcher import ...`` finds its neighbour), imported in a fresh interpreter,
type-checked by mypy (``--check-untyped-defs``: an undefined name in a function body is an
error), and the watcher and task examples are run through the real runtime on SQLite. Console
blocks may only call known programs; each ``watchkeeper`` command must name real subcommands
and options (checked against the CLI's own parser), and each ``uv`` command real options.
TOML blocks must parse. A python block marked ``<!-- fragment -->`` on the line before its fence
is an excerpt (a method out of its class, a body left out): ``test_docs_claims`` parses it and
checks its imports, nothing runs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from watchkeeper.store import Asset, AssetScope, SqliteStateBackend, TaskScope
from watchkeeper.triggerer import BaseEventTrigger
from watchkeeper.triggerer.cli import build_parser
from watchkeeper.triggerer.testing import run_trigger

from tests.support.requires import unavailable

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GUIDES = tuple(
    REPO / "docs" / name
    for name in (
        "writing-watchers.md",
        "tasks.md",
        "queue-watchers.md",
        "pubsub.md",
        "s3-watchers.md",
        "postgres-changes.md",
        "testing.md",
        "operating.md",
        "api-and-page.md",
        "webhooks.md",
        "postgresql.md",
        "configuring.md",
        "command-line.md",
        "upgrading.md",
        "development.md",
        "airflow.md",
    )
)
"""The pages the README's long parts moved to, and every other page with code but the
deployment page (its console blocks run system tools): held to the README's rules."""
FRAGMENT = "<!-- fragment -->"

KNOWN_PROGRAMS = frozenset(
    {
        "bash",
        "cd",
        "git",
        "mypy",
        "pip",
        "pytest",
        "ruff",
        "schemathesis",
        "uv",
        "venv",
        "watchkeeper",
    }
)
"""What a console block of the README may run (after ``python3 -m``/``uv run``/a venv path)."""

_FENCE = re.compile(r"^```(\w*)\s*$")
_PY_FILE = re.compile(r"`(?:[\w./-]*/)?(\w+)\.py`")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block: its language, its text, where it starts and a module name;
    ``fragment`` when the line before its fence is :data:`FRAGMENT`."""

    language: str
    text: str
    line: int
    name: str
    page: str = "README.md"
    fragment: bool = False


def read_blocks(
    markdown: str, *, page: str = "README.md", names: set[str] | None = None
) -> list[Block]:
    """The fenced blocks of ``markdown``; a python block is named after the last ``*.py`` file
    the prose before it mentions, else ``<page>_block_<line>`` (``readme_block_<line>`` for the
    README). ``names`` are those taken already (by the blocks of other pages)."""
    blocks: list[Block] = []
    prose: list[str] = []
    names = set() if names is None else names
    stem = "readme" if page == "README.md" else re.sub(r"\W", "_", page.removesuffix(".md"))
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            prose.append(lines[i])
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        mentioned = _PY_FILE.findall("\n".join(prose))
        name = mentioned[-1] if mentioned else f"{stem}_block_{start + 1}"
        if name in names:
            name = f"{name}_{start + 1}"
        names.add(name)
        before = [line for line in prose if line.strip()]
        fragment = bool(before) and before[-1].strip() == FRAGMENT
        text = "\n".join(body) + "\n"
        blocks.append(Block(fence.group(1), text, start + 1, name, page, fragment))
        prose = []
    return blocks


def read_pages(paths: tuple[Path, ...]) -> list[Block]:
    """The blocks of several pages, their module names unique across them."""
    names: set[str] = set()
    return [
        block
        for path in paths
        for block in read_blocks(path.read_text(encoding="utf-8"), page=path.name, names=names)
    ]


BLOCKS = read_pages((README, *GUIDES))
PYTHON = [b for b in BLOCKS if b.language == "python" and not b.fragment]
FRAGMENTS = [b for b in BLOCKS if b.language == "python" and b.fragment]
CONSOLE = [b for b in BLOCKS if b.language == "console"]
TOML = [b for b in BLOCKS if b.language == "toml"]


def _block_defining(marker: str) -> Block:
    found = [b for b in PYTHON if marker in b.text]
    assert len(found) == 1, f"expected one python block of the README or a guide with {marker!r}"
    return found[0]


@pytest.fixture
def block_dir(tmp_path: Path) -> Path:
    """Every python block of the README and the guides (fragments aside) as a file
    ``<name>.py`` in one directory."""
    directory = tmp_path / "blocks"
    directory.mkdir()
    for block in PYTHON:
        (directory / f"{block.name}.py").write_text(block.text, encoding="utf-8")
    return directory


LoadBlock = Callable[[Block], ModuleType]


@pytest.fixture
def load_block(block_dir: Path, monkeypatch: pytest.MonkeyPatch) -> LoadBlock:
    """Import one block as a module of this process (removed from sys.modules afterwards)."""

    def load(block: Block) -> ModuleType:
        name = f"readme_{block.name}"
        spec = importlib.util.spec_from_file_location(name, block_dir / f"{block.name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load


class TestPythonBlocks:
    def test_the_readme_has_the_examples_these_tests_run(self) -> None:
        """The python blocks include the watcher, the table watcher and the task; the guides'
        blocks are among them, and fewer than half as many excerpts are marked fragments."""
        for marker in ("class CountUp(", "class NewRows(", "def load_new_orders("):
            _block_defining(marker)
        assert len(PYTHON) >= 3
        assert {b.page for b in PYTHON} >= {"README.md", "writing-watchers.md", "tasks.md"}
        assert len(FRAGMENTS) < len(PYTHON) // 2, [f"{b.page}:{b.line}" for b in FRAGMENTS]

    def test_a_fragment_is_marked_on_the_line_before_its_fence(self) -> None:
        """The marker makes a fragment; a block without it, or with it further up, is not."""
        text = "a\n\n<!-- fragment -->\n\n```python\nx\n```\n\n```python\ny\n```\n"
        first, second = read_blocks(text, page="p.md")
        assert (first.fragment, second.fragment) == (True, False)
        assert (first.page, first.name) == ("p.md", "p_block_5")

    def test_every_block_imports_in_a_fresh_interpreter(self, block_dir: Path) -> None:
        """Each block runs as a module (imports resolve, module-level code works)."""
        script = (
            "import importlib, json, sys, traceback\n"
            "failed = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except BaseException:\n"
            "        failed[name] = traceback.format_exc(limit=3)\n"
            "print(json.dumps(failed))\n"
        )
        names = [block.name for block in PYTHON]
        result = subprocess.run(
            [sys.executable, "-c", script, *names],
            cwd=block_dir,
            env={**os.environ, "PYTHONPATH": str(block_dir)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        failed = json.loads(result.stdout.splitlines()[-1])
        where = {b.name: f"{b.page}:{b.line}" for b in PYTHON}
        assert {where[name]: error for name, error in failed.items()} == {}

    @pytest.mark.slow
    def test_every_block_type_checks(self, block_dir: Path, tmp_path: Path) -> None:
        """mypy finds no error in any block, undefined names in function bodies included."""
        files = sorted(str(path) for path in block_dir.glob("*.py"))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--check-untyped-defs",
                "--cache-dir",
                str(tmp_path / "mypy-cache"),
                *files,
            ],
            cwd=block_dir,  # no project configuration: the blocks as a user has them
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr

    async def test_the_first_watcher_commits_event_and_watermark(
        self, load_block: LoadBlock, tmp_path: Path
    ) -> None:
        """The minimal watcher of the README's top commits 1, 2, 3 with its watermark."""
        module = load_block(_block_defining("class CountUp("))
        orders: Asset = module.orders
        trigger = orders.watchers[0].trigger
        assert isinstance(trigger, BaseEventTrigger)
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            with anyio.fail_after(10):
                events = await run_trigger(trigger, assets=orders, backend=backend, max_events=3)
            assert [e.payload for e in events] == [{"n": 1}, {"n": 2}, {"n": 3}]
            assert await backend.aget(AssetScope(name="orders"), "watermark") == 3

    async def test_the_table_watcher_emits_each_row_once(
        self, load_block: LoadBlock, tmp_path: Path
    ) -> None:
        """NewRows reads the rows of a real SQLite table and commits each with its watermark."""
        module = load_block(_block_defining("class NewRows("))
        source = tmp_path / "app.db"
        rows = [(1, "order-1"), (2, "order-2"), (3, "order-3")]

        def create() -> None:
            with closing(sqlite3.connect(source)) as conn, conn:
                conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
                conn.executemany("INSERT INTO orders (id, item) VALUES (?, ?)", rows)

        await anyio.to_thread.run_sync(create)
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            with anyio.fail_after(10):
                events = await run_trigger(
                    module.NewRows(str(source)),
                    assets=Asset("orders"),
                    backend=backend,
                    max_events=3,
                )
            assert [e.payload for e in events] == [{"id": i, "item": v} for i, v in rows]
            assert await backend.aget(AssetScope(name="orders"), "watermark") == 3

    async def test_the_task_example_writes_task_and_asset_state(
        self, load_block: LoadBlock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The task example's main() runs and leaves its job id and the orders watermark."""
        module = load_block(_block_defining("def load_new_orders("))
        monkeypatch.chdir(tmp_path)  # it opens ./watchkeeper.db, as a user's script would
        with anyio.fail_after(20):
            await module.main()
        async with SqliteStateBackend(tmp_path / "watchkeeper.db") as backend:
            task = TaskScope("etl", "2024-06-01", "load")
            assert await backend.aget(task, "job_id") == "spark-42"
            orders = AssetScope(name="orders")
            assert await backend.aget(orders, "watermark") == "2024-06-01T00:00:00Z"

    async def test_the_asset_task_example_runs_in_a_worker(
        self, load_block: LoadBlock, tmp_path: Path
    ) -> None:
        """The asset_task example runs on its events and its outlet event carries the payload."""
        from watchkeeper.store.protocols import EventCommit
        from watchkeeper.triggerer import Worker, WorkerSettings

        module = load_block(_block_defining("def build_report("))
        settings = WorkerSettings(poll_interval=0.01)
        async with SqliteStateBackend(tmp_path / "state.db") as backend:
            worker = Worker(backend, [module.build_report], settings)
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                for name in ("a.csv", "b.csv"):
                    await backend.events.acommit(EventCommit("feed", ("orders",), json.dumps(name)))
                # One run of both events, or one run each (the worker may start between them).
                with anyio.fail_after(20):
                    while True:
                        out = await backend.events.alist_events(asset="order_report")
                        if sum(e.payload["files"] for e in out) >= 2:
                            break
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
            payloads = [e.payload for e in await backend.events.alist_events(asset="order_report")]
        assert payloads in ([{"files": 2}], [{"files": 1}, {"files": 1}])

    async def test_the_consumer_example_acknowledges_with_its_state(
        self, load_block: LoadBlock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The consumer example reads the orders events once and keeps its count with the cursor."""
        from watchkeeper.store.protocols import EventCommit

        module = load_block(_block_defining("async def consume_once("))
        monkeypatch.chdir(tmp_path)
        async with SqliteStateBackend(tmp_path / "watchkeeper.db") as backend:
            await backend.events.aregister_assets([Asset("orders"), Asset("other")])
            for asset in ("orders", "other", "orders"):
                await backend.events.acommit(EventCommit("feed", (asset,), "{}"))
        assert await module.consume_once() == 2
        assert await module.consume_once() == 0
        async with SqliteStateBackend(tmp_path / "watchkeeper.db") as backend:
            assert await backend.aget(module.totals, "seen") == 2


# -- console blocks -------------------------------------------------------------------------


def _commands(block: Block) -> Iterator[list[str]]:
    """The commands of a console block: continuation lines joined, ``$ `` and comments dropped,
    ``a && b`` split."""
    text = block.text.replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip().removeprefix("$ ")
        if not line:
            continue
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def _program(words: list[str]) -> tuple[str, list[str]]:
    """``(program, args)`` with env assignments, ``python3 -m`` and ``uv run`` taken off."""
    while words and _ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    program, args = Path(words[0]).name, words[1:]
    if program.startswith("python") and args[:1] == ["-m"] and len(args) > 1:
        program, args = args[1], args[2:]
    if program == "uv" and args[:1] == ["run"] and len(args) > 1:
        program, args = Path(args[1]).name, args[2:]
    return program, args


ALL_COMMANDS = [(block, _program(words)) for block in CONSOLE for words in _commands(block)]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def _walk(parser: argparse.ArgumentParser, words: list[str]) -> tuple[list[str], list[str]]:
    """Follow ``words`` (usage notation: ``[--opt VALUE]``, metavars) through the parser.

    Returns the subcommands passed and the problems found (unknown subcommand or option).
    """
    current = parser
    chain: list[str] = []
    problems: list[str] = []
    skip_value = False
    for raw in words:
        word = raw.strip("[]")
        if not word or skip_value:
            skip_value = False
            continue
        if word.startswith("-"):
            name, _, inline = word.partition("=")
            action = current._option_string_actions.get(name)
            if action is None:
                problems.append(f"'watchkeeper {' '.join(chain)}' has no option {name}")
            else:
                skip_value = action.nargs != 0 and not inline
            continue
        choices = _subcommands(current)
        if choices is None:
            continue  # a positional argument or a metavar
        if word not in choices:
            problems.append(f"'watchkeeper {' '.join(chain)}' has no subcommand {word!r}")
            break
        current = choices[word]
        chain.append(word)
    else:
        if _subcommands(current) is not None:
            problems.append(f"'watchkeeper {' '.join(chain)}' needs a subcommand")
    return chain, problems


def check_watchkeeper_command(args: list[str]) -> list[str]:
    """Problems of one ``watchkeeper ...`` line; ``a | b`` alternatives share a's parents."""
    parser = build_parser()
    alternatives: list[list[str]] = [[]]
    for word in args:
        if word == "|":
            alternatives.append([])
        else:
            alternatives[-1].append(word)
    chain, problems = _walk(parser, alternatives[0])
    for alternative in alternatives[1:]:
        problems += _walk(parser, [*chain[:-1], *alternative])[1]
    return problems


class TestConsoleBlocks:
    def test_every_command_is_a_known_program(self) -> None:
        """Each console line runs watchkeeper, uv, pip, pytest, ruff, mypy, bash or cd."""
        assert ALL_COMMANDS, "README.md has no console block"
        unknown = [
            f"{block.page}:{block.line}: {program}"
            for block, (program, _) in ALL_COMMANDS
            if program not in KNOWN_PROGRAMS
        ]
        assert unknown == []

    def test_every_watchkeeper_command_exists(self) -> None:
        """Each watchkeeper line names real subcommands and options of the CLI's parser."""
        lines = [(b, args) for b, (program, args) in ALL_COMMANDS if program == "watchkeeper"]
        assert len(lines) >= 5
        problems = [
            f"{block.page}:{block.line}: {problem}"
            for block, args in lines
            for problem in check_watchkeeper_command(args)
        ]
        assert problems == []

    def test_the_checker_refuses_a_misspelled_command(self) -> None:
        """The check above can fail: a wrong subcommand or option is reported."""
        assert check_watchkeeper_command(["stauts"]) != []
        assert check_watchkeeper_command(["events", "--folow"]) != []
        assert check_watchkeeper_command(["assets", "list", "|", "regster", "NAME"]) != []
        assert check_watchkeeper_command(["assets", "list", "|", "register", "NAME"]) == []

    def test_every_uv_command_uses_real_options(self) -> None:
        """Each ``uv SUBCOMMAND --option`` of the README is in that subcommand's --help."""
        uv = os.environ.get("UV") or shutil.which("uv")
        if uv is None:
            unavailable("uv is not available (the suite runs under `python3 -m uv run pytest`)")
        lines = [(b, args) for b, (program, args) in ALL_COMMANDS if program == "uv"]
        assert lines, "README.md runs no uv command"
        problems: list[str] = []
        for block, args in lines:
            help_text = subprocess.run(
                [uv, args[0], "--help"], capture_output=True, text=True, timeout=60, check=True
            ).stdout
            options = (a.partition("=")[0] for a in args if a.startswith("--"))
            problems += [
                f"line {block.line}: uv {args[0]} has no option {option}"
                for option in options
                if option not in help_text
            ]
        assert problems == []

    def test_files_the_commands_name_exist(self) -> None:
        """Scripts run with bash and paths given to pytest/mypy exist in the repository."""
        missing = [
            f"line {block.line}: {program} {arg}"
            for block, (program, args) in ALL_COMMANDS
            if program in ("bash", "pytest", "mypy")
            for arg in args
            if not arg.startswith("-") and not (REPO / arg).exists()
        ]
        assert missing == []


class TestTomlBlocks:
    def test_every_toml_block_parses(self) -> None:
        """Each TOML block is valid TOML."""
        for block in TOML:
            assert isinstance(tomllib.loads(block.text), dict), block.line
