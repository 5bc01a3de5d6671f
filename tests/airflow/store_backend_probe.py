"""Run in a child process with Airflow's environment (tests/airflow/test_store_backend.py):
exercise ``WatchkeeperStoreBackend`` as Airflow's code calls it, and print what happened as JSON.

``argv[1]`` is the Airflow id of the asset ``orders``. Airflow is imported here, never in the
test process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from airflow.state import AssetScope, TaskScope
from watchkeeper.airflow import StateValueRejectedError, WatchkeeperStoreBackend


def refusal(backend: WatchkeeperStoreBackend, value: str) -> dict[str, Any]:
    try:
        backend.set(AssetScope(name="orders"), "refused", value)
    except StateValueRejectedError as exc:
        return {"status": exc.status_code, "message": str(exc), "value_error": True}
    return {"status": None}


async def twins(backend: WatchkeeperStoreBackend, asset_id: int) -> dict[str, Any]:
    task = TaskScope("probe", "run-1", "twin")
    await backend.aset(task, "n", "1")
    await backend.aset(task, "m", '{"a": [1, 2]}')
    got = await backend.aget(task, "m")
    await backend.adelete(task, "n")
    after_delete = await backend.aget(task, "n")
    await backend.aclear(task)
    after_clear = await backend.aget(task, "m")
    by_id = await backend.aget(AssetScope(asset_id=asset_id), "watermark")
    return {"got": got, "deleted": after_delete, "cleared": after_clear, "by_id": by_id}


def main() -> None:
    asset_id = int(sys.argv[1])
    backend = WatchkeeperStoreBackend()
    report: dict[str, Any] = {
        "parent_read": backend.get(AssetScope(asset_id=asset_id), "watermark")
    }
    report["twins"] = asyncio.run(twins(backend, asset_id))
    report["refused"] = {
        "too_large": refusal(backend, json.dumps("x" * 70_000)),
        "null": refusal(backend, "null"),
        "nan": refusal(backend, "NaN"),
        "not_json": refusal(backend, "{oops"),
    }
    report["refused_left_nothing"] = backend.get(AssetScope(name="orders"), "refused") is None
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child opens its own store on first use
        os.close(reader)
        backend.set(AssetScope(name="orders"), "from_child", json.dumps(os.getpid()))
        os.write(writer, (backend.get(AssetScope(name="orders"), "from_child") or "").encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        report["child_read"] = pipe.read()
    _, status = os.waitpid(child, 0)
    report["child_exit"] = status
    report["child_pid"] = child
    report["parent_after_fork"] = backend.get(AssetScope(name="orders"), "from_child")
    backend.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
