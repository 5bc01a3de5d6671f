"""``RunnerConfig``: the knobs of the embeddable runner (the daemon builds it from Settings)."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RunnerConfig"]


class RunnerConfig(BaseModel):
    """How a :class:`~watchkeeper.triggerer.runner.TriggerRunner` supervises its triggers.

    Times are in seconds. A trigger whose ``run()`` raises or returns is restarted after
    ``backoff_initial * 2**(failures - 1)`` seconds, capped at ``backoff_max``, then varied by
    ``±backoff_jitter`` (a fraction) so that triggers failing together do not retry together.
    A store that does not answer is not a trigger's failure: the runner pings it, waiting
    ``backoff_initial`` doubled after each ping up to ``store_retry_max``, and the triggers
    resume once it answers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity: int = Field(default=1000, ge=1, description="max triggers in the runner at once")
    backoff_initial: float = Field(default=1.0, ge=0, description="first restart delay")
    backoff_max: float = Field(default=300.0, ge=0, description="longest restart delay")
    backoff_jitter: float = Field(default=0.2, ge=0, lt=1, description="± fraction of a delay")
    max_failures: int = Field(
        default=5,
        ge=0,
        description="consecutive failures before the state 'failed' (0: restart forever)",
    )
    store_retry_max: float = Field(
        default=5.0,
        gt=0,
        description="longest wait between two pings of a store that does not answer",
    )
    cleanup_timeout: float = Field(default=5.0, gt=0, description="limit for trigger.cleanup()")
    stop_grace: float = Field(
        default=10.0, ge=0, description="time for triggers to finish once cancelled"
    )
    lag_threshold: float = Field(
        default=0.25, ge=0, description="loop lag logged with its culprit (0: no monitor)"
    )
    status_interval: float = Field(
        default=2.0, ge=0, description="seconds between status saves (0: never save)"
    )
    owner: str | None = Field(default=None, description="daemon identity in TriggerStatus.owner")

    @model_validator(mode="after")
    def _check_backoff(self) -> Self:
        if self.backoff_max < self.backoff_initial:
            raise ValueError(
                f"backoff_max ({self.backoff_max}) must not be below "
                f"backoff_initial ({self.backoff_initial})"
            )
        return self
