"""How many operations each group-commit transaction carried: a histogram the writers fill.

One :class:`BatchSizes` per writer, observed once per committed batch by the writer alone (so
no lock: a reader may see a count one batch behind the sum, which a metric tolerates). The
buckets are powers of two up to 4096; ``watchkeeper_commit_batch_size`` exposes it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BATCH_SIZE_BUCKETS", "BatchSizes"]

BATCH_SIZE_BUCKETS: Final = tuple(float(1 << i) for i in range(13))
"""Upper bounds of the buckets: 1, 2, 4, ... 4096 (and +Inf past the last)."""


class BatchSizes:
    """Counts of batch sizes per bucket, their sum and their number."""

    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BATCH_SIZE_BUCKETS) + 1)
        self.count = 0
        self.total = 0

    def observe(self, size: int) -> None:
        """Record one batch of ``size`` operations (called by the writer, once per batch)."""
        index = (size - 1).bit_length() if size > 1 else 0
        self.counts[min(index, len(BATCH_SIZE_BUCKETS))] += 1
        self.count += 1
        self.total += size

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs in Prometheus' form, ending with ``+Inf``."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*BATCH_SIZE_BUCKETS, None), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound is None else repr(bound), running))
        return out
