"""The daemon's tuning of the cyclic garbage collector (``Daemon(tune_gc=True)``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from watchkeeper.triggerer.daemon._gctune import GEN0_THRESHOLD, raise_gen0_threshold, startup_gc


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    """Leave the test process's collector as each test found it."""
    thresholds = gc.get_threshold()
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    if enabled:
        gc.enable()
    else:
        gc.disable()


class TestStartupGc:
    def test_pauses_then_freezes_and_resumes(self) -> None:
        """The collector is off inside the block, and on again with the survivors frozen after."""
        gc.enable()
        kept: list[list[int]] = [[] for _ in range(100)]
        with startup_gc():
            assert not gc.isenabled()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(kept)

    def test_keeps_a_disabled_collector_disabled(self) -> None:
        """A collector that was off before the block stays off after it."""
        gc.disable()
        with startup_gc():
            pass
        assert not gc.isenabled()

    def test_resumes_when_the_block_raises(self) -> None:
        """An error in the block still resumes the collector, and propagates."""
        gc.enable()
        with pytest.raises(RuntimeError, match="boom"), startup_gc():
            raise RuntimeError("boom")
        assert gc.isenabled()


class TestGen0Threshold:
    def test_raises_only_the_young_threshold(self) -> None:
        """The gen-0 threshold goes up to GEN0_THRESHOLD; the older ones are kept."""
        gc.set_threshold(700, 10, 10)
        assert raise_gen0_threshold() == (700, 10, 10)
        assert gc.get_threshold() == (GEN0_THRESHOLD, 10, 10)

    def test_never_lowers_it(self) -> None:
        """A threshold already above the daemon's is left as it is."""
        gc.set_threshold(GEN0_THRESHOLD * 2, 10, 10)
        raise_gen0_threshold()
        assert gc.get_threshold() == (GEN0_THRESHOLD * 2, 10, 10)
