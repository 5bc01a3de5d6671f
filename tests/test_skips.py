"""In CI nothing that needs a service or a tool may skip: every skip of the suite goes through
:func:`tests.support.requires.unavailable` (which fails under ``CI=true``), or its line says
``# not a service`` (a skip for a case that does not apply, the same in CI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SKIP = re.compile(r"pytest\.skip\(|skipif\(|importorskip\(|pytest\.mark\.skip\b|unittest\.skip")
ALLOWED = "# not a service"


def direct_skips(root: Path) -> list[str]:
    """``path:line`` of each skip under ``root`` that bypasses :func:`unavailable`."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if path.name in {"requires.py", "test_skips.py"}:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SKIP.search(line) and ALLOWED not in line:
                found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_every_skip_goes_through_the_ci_rule() -> None:
    """No test of the suite calls pytest's skips directly for a missing service or tool."""
    assert direct_skips(TESTS) == []


def test_the_scan_finds_a_direct_skip(tmp_path: Path) -> None:
    """The scan above can fail: a direct skip, a skipif and an importorskip are reported."""
    (tmp_path / "test_x.py").write_text(
        'import pytest\npytest.skip("no server")\n'
        '@pytest.mark.skipif(True, reason="x")\ndef f(): ...\n'
        'pytest.importorskip("x")\npytest.skip("n/a")  # not a service\n'
    )
    assert direct_skips(tmp_path) == ["test_x.py:2", "test_x.py:3", "test_x.py:5"]


@pytest.mark.parametrize("ci", ["true", ""])
def test_unavailable_fails_under_ci_and_skips_elsewhere(tmp_path: Path, ci: str) -> None:
    """A test whose service is missing fails under CI=true and is skipped without it (run
    in a pytest of its own, so its outcome is seen, not suffered)."""
    (tmp_path / "test_needs.py").write_text(
        "from tests.support.requires import unavailable\n\n"
        "def test_needs_a_server():\n"
        '    unavailable("the server is not reachable")\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if ci:
        assert "1 failed" in done.stdout, done.stdout
        assert "CI=true and the server is not reachable" in done.stdout
    else:
        assert "1 skipped" in done.stdout, done.stdout
