"""``asset_task``'s ``batch_window`` and ``max_active_runs``: checked where they are declared,
and carried into the spec the store keeps."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from watchkeeper.triggerer import Asset, asset_task

A = Asset("a")


def noop(**context: Any) -> None:
    """A task that does nothing."""


def test_the_spec_carries_both() -> None:
    task = asset_task(schedule=[A], batch_window=timedelta(seconds=1.5), max_active_runs=2)(noop)
    assert (task.batch_window, task.max_active_runs) == (1.5, 2)
    assert (task.spec.batch_window, task.spec.max_active_runs) == (1.5, 2)
    plain = asset_task(schedule=[A])(noop).spec
    assert (plain.batch_window, plain.max_active_runs) == (0.0, None)
    assert asset_task(schedule=[A], batch_window=3)(noop).spec.batch_window == 3.0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_window": -0.5}, ValueError, "batch_window must be a finite number"),
        ({"batch_window": timedelta(seconds=-1)}, ValueError, "batch_window"),
        ({"batch_window": math.inf}, ValueError, "batch_window must be a finite"),
        ({"batch_window": math.nan}, ValueError, "batch_window must be a finite"),
        ({"batch_window": "1s"}, TypeError, "batch_window must be a timedelta or seconds"),
        ({"batch_window": None}, TypeError, "batch_window"),
        ({"max_active_runs": 0}, ValueError, "max_active_runs must be an int >= 1 or None"),
        ({"max_active_runs": 2.0}, ValueError, "max_active_runs"),
        ({"max_active_runs": True}, ValueError, "max_active_runs"),
    ],
)
def test_bad_values_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        asset_task(schedule=[A], **kwargs)
