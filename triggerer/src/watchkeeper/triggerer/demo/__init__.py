"""``watchkeeper demo``: the example watchers run, killed with ``kill -9`` and checked.

:func:`run_demo` runs the whole demo in a temporary directory: a fake source, a child daemon
and worker killed mid-stream and restarted, and a check that every item arrived exactly once.
It may import :mod:`.._core` and the authoring API; it runs the daemon and the worker as child
processes through the command line, so it imports no wing. The CLI calls it and nothing else does.
"""

from __future__ import annotations

from ._run import run_demo
from ._scenario import DemoError

__all__ = ["DemoError", "run_demo"]
