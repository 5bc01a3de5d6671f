"""Run one ready-made watcher in a fresh interpreter until its first event, lag monitor on.

``python -m tests.watchers.cold_start CLASSPATH KWARGS_JSON`` rebuilds the watcher from its
``serialize()`` form on the event loop (as a daemon does), runs it in a
:class:`~watchkeeper.triggerer.TriggerRunner` whose lag monitor reports any block of the loop
longer than 0.1 s, waits for one committed event and exits. Every log line goes to stdout as
JSON; nothing of the watcher's client library is imported before the loop starts, so its
imports are cold.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import anyio
from watchkeeper.store import Asset, MemoryStateBackend
from watchkeeper.triggerer import (
    BaseEventTrigger,
    RunnerConfig,
    TriggerRunner,
    WatchSpec,
    configure_logging,
)

TRIGGER_ID = "cold"
THRESHOLD = 0.1


async def main(classpath: str, kwargs: dict[str, Any]) -> None:
    module_name, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name)
    asset = Asset("cold")
    config = RunnerConfig(lag_threshold=THRESHOLD, status_interval=0, backoff_initial=0.2)
    async with MemoryStateBackend() as backend:
        await backend.events.aregister_assets([asset])
        async with TriggerRunner(backend, config) as runner:
            events = runner.subscribe()
            trigger: BaseEventTrigger = cls(**kwargs)  # built on the loop, as a daemon does
            await runner.start_trigger(WatchSpec(TRIGGER_ID, trigger, (asset,), ("cold",)))
            with anyio.fail_after(60):
                await events.receive()
            print(json.dumps({"event": "cold_start_done"}), flush=True)


if __name__ == "__main__":
    configure_logging("info", "json", stream=sys.stdout)
    anyio.run(main, sys.argv[1], json.loads(sys.argv[2]))
