"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page
or a reference that does not resolve fails it), and its reference pages name every command,
setting, route and public name the code defines."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchkeeper.triggerer.api._openapi import openapi_document
from watchkeeper.triggerer.cli import build_parser
from watchkeeper.triggerer.settings import Settings

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "watchkeeper.store",
    "watchkeeper.triggerer",
    "watchkeeper.triggerer.testing",
    "watchkeeper.watchers",
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site, built once for the module into a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield out


def _text(site: Path, page: str) -> str:
    """A built page's text with the tags taken out and entities of ``<``, ``>`` and ``&`` read."""
    raw = (site / page / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", raw)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}"
                yield from _commands(sub, f"{prefix} {name}")


def test_the_cli_reference_names_every_command(site: Path) -> None:
    text = _text(site, "reference/cli")
    commands = list(_commands(build_parser(), "watchkeeper"))
    assert len(commands) > 20
    assert [c for c in commands if f"{c}\n" not in text and f"{c}¶" not in text] == []


def test_the_configuration_reference_names_every_key(site: Path) -> None:
    text = _text(site, "reference/configuration")
    for section, field in Settings.model_fields.items():
        assert f"[{section}]" in text, section
        model = field.annotation
        for key in model.model_fields:  # type: ignore[union-attr]
            assert f"WATCHKEEPER__{section.upper()}__{key.upper()}" in text, (section, key)


def test_the_watchers_reference_names_every_parameter(site: Path) -> None:
    """Each ready-made watcher has a section, with a row per declared parameter."""
    import watchkeeper.watchers as package
    from watchkeeper.watchers._params import ReadyMadeWatcher

    text = _text(site, "reference/watchers")
    watchers = [getattr(package, n) for n in package.__all__]
    watchers = [w for w in watchers if isinstance(w, type) and issubclass(w, ReadyMadeWatcher)]
    assert len(watchers) >= 12  # at least those of this release (a lost import would hide some)
    for cls in watchers:
        section = text.split(f"{cls.__name__}&para;", 1)[1].split("&para;", 1)[0]
        for name, info in cls.params_model.model_fields.items():
            assert f"\n{name}\n" in section, (cls.__name__, name)
            described = re.sub(r":\w+:|[`~]", "", " ".join((info.description or "").split()))
            assert described[:25] in " ".join(section.split()), (cls.__name__, name)


def test_the_http_reference_names_every_route(site: Path) -> None:
    text = _text(site, "reference/http-api")
    for path, item in openapi_document()["paths"].items():
        for method in item:
            if method in {"get", "put", "post", "delete", "patch"}:
                assert f"{method.upper()} {path}" in text, (method, path)


def test_the_python_reference_documents_every_public_name(site: Path) -> None:
    raw = (site / "reference" / "python-api" / "index.html").read_text()
    for package in PACKAGES:
        for name in importlib.import_module(package).__all__:
            assert f'id="{package}.{name}"' in raw, f"{package}.{name}"


def test_the_performance_page_shows_every_goal_of_benchmarks_md(site: Path) -> None:
    """BENCHMARKS.md's goals table is the site's, row for row (it is included as it builds)."""
    text = (REPO / "BENCHMARKS.md").read_text()
    goals = text.split("\n## Goals\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in goals.splitlines() if line.startswith("| ")]
    page = _text(site, "performance")
    assert len(rows) > 10
    assert [r for r in rows[1:] if re.sub(r"[`*]", "", r) not in page] == []
