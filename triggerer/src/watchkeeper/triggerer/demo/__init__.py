"""``watchkeeper demo``: the example watchers run, killed with ``kill -9`` and checked.

:func:`run_demo` runs the whole demo in a temporary directory: a fake source, a child daemon
and worker killed mid-stream and restarted, and a check that every item arrived exactly once.
This package imports the runtime's public names only; the CLI calls it and nothing else does.
"""

from __future__ import annotations

from ._run import run_demo
from ._scenario import DemoError

__all__ = ["DemoError", "run_demo"]
