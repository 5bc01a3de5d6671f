"""The errors of the triggerer, rooted at :class:`TriggererError`."""

from __future__ import annotations

__all__ = [
    "AssetStoreUnavailableError",
    "CapacityError",
    "InvalidEventError",
    "TriggerImportError",
    "TriggererError",
    "WatcherNameUnavailableError",
]


class TriggererError(Exception):
    """Raised for failures of the triggerer runtime; the root of this module's tree."""


class AssetStoreUnavailableError(TriggererError, RuntimeError, AttributeError):
    """Raised when ``self.asset_state_store`` is read outside ``run()``.

    It is also an ``AttributeError`` so that ``hasattr(trigger, "asset_state_store")`` is
    False in ``__init__`` and ``serialize()``.

    :param trigger: the trigger whose attribute was read.
    """

    def __init__(self, trigger: object) -> None:
        super().__init__(
            f"{type(trigger).__name__}.asset_state_store exists only inside run(): the runtime "
            "binds it to the watched assets right before run() starts"
        )


class WatcherNameUnavailableError(TriggererError, RuntimeError, AttributeError):
    """Raised when ``self.watcher_name`` is read outside ``run()``.

    Like :class:`AssetStoreUnavailableError` it is also an ``AttributeError``, so
    ``hasattr(trigger, "watcher_name")`` is False in ``__init__`` and ``serialize()``.

    :param trigger: the trigger whose attribute was read.
    """

    def __init__(self, trigger: object) -> None:
        super().__init__(
            f"{type(trigger).__name__}.watcher_name exists only inside run(): the runtime "
            "binds it to the AssetWatcher's name right before run() starts"
        )


class CapacityError(TriggererError):
    """Raised when a trigger is started on a runner that already runs ``capacity`` triggers.

    :param trigger_id: the trigger that was not started.
    :param capacity: the runner's capacity.
    """

    def __init__(self, trigger_id: str, capacity: int) -> None:
        self.trigger_id = trigger_id
        self.capacity = capacity
        super().__init__(
            f"cannot start trigger {trigger_id!r}: the runner is at its capacity of "
            f"{capacity} triggers (stop one or raise [triggerer] capacity)"
        )


class InvalidEventError(TriggererError, TypeError):
    """Raised when a trigger yields something that is not a valid :class:`TriggerEvent`."""


class TriggerImportError(TriggererError, ImportError):
    """Raised when a trigger classpath is outside ``allowed_trigger_modules`` or cannot load."""
