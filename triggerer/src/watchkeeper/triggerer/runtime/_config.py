"""How triggers are supervised: one definition for the runner and the daemon's ``[triggerer]``.

:class:`SupervisionSettings` holds every knob of the supervisor, with its bounds, once.
:class:`RunnerConfig` (what an embedding passes to
:class:`~watchkeeper.triggerer.runner.TriggerRunner`) and
:class:`~watchkeeper.triggerer.settings.TriggererSettings` (the daemon's ``[triggerer]``
section) both extend it, so a setting means the same and is checked the same in both.
"""

from __future__ import annotations

import random
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RunnerConfig", "SupervisionSettings", "backoff_delay"]


class SupervisionSettings(BaseModel):
    """How a runner supervises its triggers. Times are in seconds.

    A trigger whose ``run()`` raises or returns is restarted after
    ``backoff_initial * 2**(failures - 1)`` seconds, capped at ``backoff_max``, then varied by
    ``±backoff_jitter`` (a fraction) so that triggers failing together do not retry together.
    A store that does not answer is not a trigger's failure: the runner pings it, waiting
    ``backoff_initial`` doubled after each ping up to ``store_retry_max``, and the triggers
    resume once it answers.
    """

    # No ``use_attribute_docstrings``: nothing reads the fields' descriptions, and it made
    # pydantic read and parse this module's source (and each subclass's) at every start.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    capacity: int = Field(default=1000, gt=0)
    """Most triggers run at once."""
    backoff_initial: float = Field(default=1.0, gt=0)
    """Seconds before the first restart of a failed trigger; doubles per failure."""
    backoff_max: float = Field(default=300.0, gt=0)
    """Longest restart delay, in seconds."""
    backoff_jitter: float = Field(default=0.2, ge=0, lt=1)
    """Each restart delay is varied by up to ± this fraction of it."""
    max_failures: int = Field(default=5, ge=0)
    """Consecutive failures after which a trigger is reported as ``failed`` and no longer
    restarted (0: restart forever)."""
    store_retry_max: float = Field(default=5.0, gt=0)
    """Longest wait, in seconds, between two pings of a store that does not answer; watchers
    wait for it without counting a failure."""
    cleanup_timeout: float = Field(default=5.0, gt=0)
    """Seconds a trigger's ``cleanup()`` may take."""
    stop_grace: float = Field(default=10.0, ge=0)
    """Seconds triggers get to finish once cancelled (at SIGTERM, or when stopped)."""
    lag_threshold: float = Field(default=0.25, ge=0)
    """Event-loop lag, in seconds, that is logged with the trigger that caused it
    (0: no lag monitor)."""

    @model_validator(mode="after")
    def _check_backoff(self) -> Self:
        if self.backoff_max < self.backoff_initial:
            raise ValueError(
                f"backoff_max ({self.backoff_max}) must not be below "
                f"backoff_initial ({self.backoff_initial})"
            )
        return self


class RunnerConfig(SupervisionSettings):
    """How a :class:`~watchkeeper.triggerer.runner.TriggerRunner` supervises its triggers.

    The supervision settings (see :class:`SupervisionSettings`), plus what only an embedding
    decides: how often statuses are saved and the runner's identity. The daemon builds one
    from its ``[triggerer]`` section.
    """

    status_interval: float = Field(default=2.0, ge=0)
    """Seconds between status saves (0: never save)."""
    owner: str | None = None
    """Daemon identity in ``TriggerStatus.owner`` and in the fences of leased triggers."""


def backoff_delay(failures: int, config: RunnerConfig) -> float:
    """The delay before restart number ``failures``: doubling, capped, then jittered."""
    exponent = min(max(failures - 1, 0), 64)
    base = min(config.backoff_max, config.backoff_initial * 2.0**exponent)
    jitter = config.backoff_jitter
    if jitter:
        base *= 1.0 + random.uniform(-jitter, jitter)
    return max(base, 0.0)
