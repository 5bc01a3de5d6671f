"""What the pages under ``docs/`` and the README's prose claim, checked against the code.

``test_readme`` runs the README's code blocks. Here: every ``docs/*.md`` python block parses
and imports only names that exist, its console blocks run only known programs with real
``watchkeeper`` subcommands and options, every ``watchkeeper ...`` command quoted in the prose
of the README or a page names real subcommands and options, every file path they quote exists,
and the page's excerpt of a ready-made watcher calls only what that watcher's module has.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchkeeper.triggerer.cli import build_parser

from tests.e2e.test_readme import (
    GUIDES,
    KNOWN_PROGRAMS,
    README,
    REPO,
    Block,
    _commands,
    _program,
    check_watchkeeper_command,
    read_blocks,
)

PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "performance-history.md")
"""The pages that describe today's code (the performance history is a dated record: its paths
and commands were those of the day of each run)."""
DEPLOY_PROGRAMS = {"deploying.md": frozenset({"cp", "docker", "install", "kubectl", "systemctl",
                                              "useradd"})}  # fmt: skip
"""Programs a page may run beside KNOWN_PROGRAMS: the deployment page's system tools."""
DOCS = {path.name: read_blocks(path.read_text(encoding="utf-8")) for path in PAGES}
PYTHON = [(page, b) for page, blocks in DOCS.items() for b in blocks if b.language == "python"]
CONSOLE = [(page, b) for page, blocks in DOCS.items() for b in blocks if b.language == "console"]

_INLINE = re.compile(r"`([^`]+)`")
_COMMAND = re.compile(r"(?:^|\$\()watchkeeper\s+([^)]*)")
_PATH = re.compile(
    r"^(?:tests|store|triggerer|benchmarks|docs|examples|watchers/src)/(?:[\w.-]+/)*"
    r"[\w.-]+\.(?:py|md|toml|js|html|css)$"
)
"""A path in the repository (``watchers/orders.py`` of the examples is the user's folder)."""


def _prose(path: Path) -> str:
    """``path``'s text outside its fenced blocks, each paragraph joined onto one line."""
    kept, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        kept.append("" if fenced else line)
    return re.sub(r"(?<!\n)\n(?!\n)", " ", "\n".join(kept))


def _inline_spans(path: Path) -> list[str]:
    return [" ".join(span.split()) for span in _INLINE.findall(_prose(path))]


def _quoted_commands(path: Path) -> list[str]:
    return [m.group(1) for span in _inline_spans(path) for m in [_COMMAND.search(span)] if m]


class TestPythonBlocks:
    def test_the_pages_have_python_blocks(self) -> None:
        """The checks below see the blocks (a renamed page or fence would hide them)."""
        assert {page for page, _ in PYTHON} == {
            "airflow.md",
            "queue-watchers.md",
            "postgres-changes.md",
            "pubsub.md",
            "s3-watchers.md",
            "testing.md",
            "writing-watchers.md",
            "tasks.md",
            "webhooks.md",
        }

    def test_every_python_block_runs_unless_marked_a_fragment(self) -> None:
        """Each page with a python block is one whose blocks ``test_readme`` imports, type-checks
        and (the examples) runs; only blocks marked ``<!-- fragment -->`` are left to the
        parse-and-import check here."""
        held = {path.name for path in GUIDES}
        assert {page for page, _ in PYTHON} - held == set()

    @pytest.mark.parametrize(("page", "block"), PYTHON, ids=[f"{p}:{b.line}" for p, b in PYTHON])
    def test_every_block_parses_and_imports_real_names(self, page: str, block: Block) -> None:
        """Each python block is Python (an excerpt may leave out bodies, not syntax), and each
        name it imports from watchkeeper exists."""
        tree = ast.parse(block.text, filename=f"{page}:{block.line}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("watchkeeper"):
                module = importlib.import_module(node.module or "")
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert missing == [], f"{page}:{block.line}: {node.module} has no {missing}"

    def test_the_nats_excerpt_calls_what_the_watcher_has(self) -> None:
        """The worked example quotes ``NatsJetStreamWatcher.run``: every function and method
        it calls is defined or used in that module, so the excerpt has not drifted into
        calls the watcher no longer makes."""
        (block,) = [b for p, b in PYTHON if "class NatsJetStreamWatcher" in b.text]
        source = (REPO / "watchers/src/watchkeeper/watchers/nats_jetstream.py").read_text()
        called = set()
        for node in ast.walk(ast.parse(block.text)):
            if isinstance(node, ast.Call):
                func = node.func
                called.add(
                    func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                )
        called -= {"", "max", "TriggerEvent"}
        assert called, block.text
        missing = sorted(name for name in called if not re.search(rf"\b{name}\(", source))
        assert missing == []


class TestCommands:
    def test_console_blocks_run_known_programs_and_real_commands(self) -> None:
        """The pages' console blocks: known programs; watchkeeper lines name real parts."""
        problems = []
        for page, block in CONSOLE:
            for words in _commands(block):
                program, args = _program(words)
                if program not in KNOWN_PROGRAMS | DEPLOY_PROGRAMS.get(page, frozenset()):
                    problems.append(f"{page}:{block.line}: unknown program {program}")
                elif program == "watchkeeper":
                    problems += [
                        f"{page}:{block.line}: {p}" for p in check_watchkeeper_command(args)
                    ]
        assert problems == []

    @pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.name)
    def test_every_quoted_command_exists(self, path: Path) -> None:
        """Each ``watchkeeper ...`` quoted in the prose (``$(watchkeeper ...)`` too) names real
        subcommands and options of the CLI's parser."""
        quoted = _quoted_commands(path)
        problems = []
        for text in quoted:
            words = [w for w in shlex.split(text.replace("…", "")) if not w.startswith("<")]
            if words in (["--version"], ["--help"]):
                continue  # global options that need no subcommand
            problems += [f"`watchkeeper {text}`: {p}" for p in check_watchkeeper_command(words)]
        assert problems == []
        if path == README:
            assert len(quoted) >= 3  # the check sees the README's quotes

    def test_the_command_line_page_names_every_command_and_option(self) -> None:
        """docs/command-line.md has a line for every command of the CLI's parser (the
        installed distributions' commands too, such as ``airflow relay``) naming each of its
        long options."""
        missing = [
            f"{' '.join(path)}{': ' + ', '.join(gaps) if gaps else ''}"
            for path, gaps in _command_line_gaps((REPO / "docs" / "command-line.md").read_text())
        ]
        assert missing == []

    def test_the_command_line_check_bites(self) -> None:
        """A page without a command, or without one of its options, is reported."""
        gaps = dict(_command_line_gaps("```console\nwatchkeeper runs retry RUN_ID\n```\n"))
        assert gaps[("runs", "retry")] == ["--task", "--state"]
        assert gaps[("runs", "list")] is None

    def test_the_checker_refuses_a_missing_option(self) -> None:
        """A quoted command with an option the parser lacks is a problem (the check bites)."""
        (problem,) = check_watchkeeper_command(["up", "--bind", "0.0.0.0"])
        assert "has no option --bind" in problem


class TestPaths:
    @pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.name)
    def test_every_quoted_file_exists(self, path: Path) -> None:
        """A file path quoted in the prose (``tests/chaos/test_kill.py``) is in the repository."""
        quoted = {span for span in _inline_spans(path) if _PATH.match(span)}
        missing = sorted(p for p in quoted if not (REPO / p).exists())
        assert missing == []
        if path.name == "testing.md":
            assert "examples/testing/my_watcher.py" in quoted  # the check sees the quotes


def _command_line_gaps(page: str) -> list[tuple[tuple[str, ...], list[str] | None]]:
    """Each command of the CLI's parser the console blocks of ``page`` leave out (None), or
    the long options of it no line of that command names."""
    lines: list[str] = []
    for block in read_blocks(page):
        if block.language != "console":
            continue
        for line in block.text.splitlines():
            if line.startswith("watchkeeper "):
                lines.append(line)
            elif lines and line.startswith(" "):  # a comment carried to the next line
                lines[-1] += line
    gaps: list[tuple[tuple[str, ...], list[str] | None]] = []
    for path, parser in _leaf_commands(build_parser(), ()):
        top, rest = path[0], path[1:]
        found = [
            part
            for words in (line.split() for line in lines)
            if words[1] == top
            for part in " ".join(words[2:]).split(" | ")
            if not rest or part.split()[:1] == list(rest)
        ]
        options = [
            option
            for action in parser._actions
            for option in action.option_strings
            if option.startswith("--") and option not in {"--help", "--config"}
        ]
        if not found:
            gaps.append((path, None))
            continue
        absent = [o for o in options if not any(re.search(rf"{o}\b", f) for f in found)]
        if absent:
            gaps.append((path, absent))
    return gaps


def _leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from _leaf_commands(sub, (*path, name))
