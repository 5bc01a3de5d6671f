"""The one rule of what a token sees: data needs a data scope, operating needs only names.

Data is what watchers and tasks carry or produce: state values, event payloads, and the text
of errors (a message or a traceback quotes values and payloads as often as not). ``read`` sees
all of it; ``write:asset:<glob>`` the state and events of its assets. ``operate`` alone sees
the operational record (names, states, counts, times, ids, tries) and each error's type only,
which is what pausing, resuming and retrying need. Every route that returns runs or watchers
shapes them here. A run's logs (what its tries printed and logged) are data through and
through: they need ``read``, with nothing to show ``operate`` alone.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final

from watchkeeper.store.protocols import TaskRun

from .._core import run_record
from ..daemon import WatcherRow
from ._tokens import Principal

__all__ = ["error_type", "may_read_logs", "run_json", "watcher_json"]

_TYPE: Final = re.compile(r"([A-Za-z_][\w.]*)(?::|$)")


def error_type(text: str | None) -> str | None:
    """The type name an error's text starts with (``"KeyError: 'x'"`` -> ``"KeyError"``), or
    None when the text does not start with one."""
    if not text:
        return None
    match = _TYPE.match(text)
    return match.group(1) if match else None


def run_json(run: TaskRun, principal: Principal, *, events: bool = False) -> dict[str, Any]:
    """A run as ``principal`` may see it: for ``read``, its errors' text (and with ``events``
    its events); else each error's type only, tracebacks and events withheld
    (``data_withheld``)."""
    if principal.can_read():
        return run_record(run, events=events)
    record = run_record(run)
    record["errors"] = [
        {**e, "error": error_type(e["error"]), "traceback": None} for e in record["errors"]
    ]
    record["data_withheld"] = True
    return record


def may_read_logs(principal: Principal) -> bool:
    """Whether ``principal`` may read runs' logs: a try's output quotes values, payloads and
    tracebacks as freely as its errors do, so only ``read`` (or ``admin``) sees it."""
    return principal.can_read()


def watcher_json(row: WatcherRow, principal: Principal, now: datetime) -> dict[str, Any]:
    """A watcher as ``principal`` may see it: ``last_error`` is its type only without ``read``."""
    record = row.to_json(now)
    if not principal.can_read():
        record["last_error"] = error_type(record["last_error"])
    return record
