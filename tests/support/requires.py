"""The one way a test goes without a service or a tool: skipped on a developer's machine,
failed under ``CI=true`` (where everything the suite needs is installed and started, so a
missing one is a broken run, never a silent skip).

``tests/test_skips.py`` checks that every skip in the suite goes through :func:`unavailable`
(or says, on its line, why it is no service's).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["in_ci", "unavailable"]


def in_ci() -> bool:
    """True under ``CI=true`` (``.ci/run`` exports it)."""
    return os.environ.get("CI") == "true"


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason`` (a service or tool it needs is missing); fail it under
    ``CI=true``."""
    if in_ci():
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)
