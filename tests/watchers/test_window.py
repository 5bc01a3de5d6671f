"""``LagWindow.record_many``: a batch of items leaves the window where recording them one by
one does, so a batch's one state equals what its last single event would have carried."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from watchkeeper.watchers._window import LagWindow

Polls = list[tuple[list[int], list[int]]]


def window(max_keys: int, max_bytes: int, lag: int) -> LagWindow[int, int]:
    return LagWindow(
        lower=lambda cursor: cursor - lag,
        size_of=lambda _cursor, _key: 10,
        max_keys=max_keys,
        max_bytes=max_bytes,
    )


def state(w: LagWindow[int, int]) -> tuple[object, ...]:
    """What decides which items a window accepts: the watermark, the floor, and the items
    remembered inside the window above the floor (one below the window's start or at or
    below the floor is never accepted again, remembered or not)."""
    low = w.low
    kept = [
        (c, k)
        for c, k in w.items()
        if (low is None or c >= low) and (w.floor is None or c > w.floor)
    ]
    return (w.watermark, w.floor, kept)


class TestRecordMany:
    @settings(max_examples=500, deadline=None)
    @given(
        polls=st.lists(
            st.tuples(
                st.lists(st.integers(0, 12), max_size=5),  # late items: how far behind
                st.lists(st.integers(0, 4), max_size=8),  # new items: cursor steps
            ),
            max_size=10,
        ),
        max_keys=st.integers(1, 5),
        max_bytes=st.sampled_from([25, 45, 10_000]),
        lag=st.integers(0, 10),
    )
    def test_a_batch_ends_where_one_by_one_ends(
        self, polls: Polls, max_keys: int, max_bytes: int, lag: int
    ) -> None:
        """After each poll's late and new items, both windows hold the same watermark, floor
        and remembered items, whatever overflowed or left the window on the way."""
        one = window(max_keys, max_bytes, lag)
        many = window(max_keys, max_bytes, lag)
        key = 0
        for behind, steps in polls:
            late: list[tuple[int, int]] = []
            if one.watermark is not None:
                for distance in behind:
                    key += 1
                    if one.is_late(one.watermark[0] - distance, key):
                        late.append((one.watermark[0] - distance, key))
            new: list[tuple[int, int]] = []
            cursor = one.watermark[0] if one.watermark is not None else 0
            for step in steps:
                key += 1
                cursor += step
                new.append((cursor, key))
            for item in late:
                one.record(*item, new=False)
            for item in new:
                one.record(*item, new=True)
            many.record_many(late, new=False)
            many.record_many(new, new=True)
            assert state(many) == state(one)

    def test_an_empty_batch_changes_nothing(self) -> None:
        """Recording no items keeps the watermark and the remembered keys."""
        w = window(5, 10_000, 3)
        w.record_many([(1, 1), (2, 2)], new=True)
        before = state(w)
        w.record_many([], new=True)
        assert state(w) == before == ((2, 2), None, [(1, 1), (2, 2)])
