"""The embeddable runner: supervises triggers inside the caller's event loop.

INTERFACE STUB — the runtime helper fills this in; the daemon helper builds on exactly this API.

    @dataclass(frozen=True, slots=True)
    class WatchSpec:
        trigger_id: str                     # stable id (the daemon uses a hash of serialize())
        trigger: BaseEventTrigger           # the instance to run
        assets: tuple[Asset, ...]           # the watched assets (already registered)
        watchers: tuple[str, ...] = ()      # AssetWatcher names, for status and logs

    class RunnerConfig(pydantic.BaseModel):  # frozen; the daemon builds it from Settings
        capacity: int = 1000                # max triggers running at once
        backoff_initial: float = 1.0        # s, first restart delay
        backoff_max: float = 300.0          # s
        backoff_jitter: float = 0.2         # fraction
        max_failures: int = 5               # consecutive failures before state "failed"
        cleanup_timeout: float = 5.0        # s for trigger.cleanup()
        stop_grace: float = 10.0            # s for triggers to finish after cancellation
        lag_threshold: float = 0.25         # s of loop lag that is logged with the culprit
        status_interval: float = 2.0        # s between status saves (0: never save)
        owner: str | None = None            # daemon identity written into TriggerStatus

    class TriggerRunner:                     # async context manager owning a task group
        def __init__(self, backend: BaseStateBackend, config: RunnerConfig | None = None): ...
        async def __aenter__(self) -> TriggerRunner
        async def __aexit__(...)             # cancels all triggers with stop_grace, flushes status
        async def start_trigger(self, spec: WatchSpec) -> None   # CapacityError when full
        async def stop_trigger(self, trigger_id: str) -> None    # cancel, await cleanup
        def trigger_ids(self) -> frozenset[str]
        def statuses(self) -> list[TriggerStatus]
        def subscribe(self) -> MemoryObjectReceiveStream[AssetEvent]  # committed events, for UIs
"""

from __future__ import annotations
