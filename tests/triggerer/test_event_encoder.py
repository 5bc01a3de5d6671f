"""The encoder checks the watcher and asset names once per trigger, and its commits are the
ones ``EventCommit(...)`` builds with every check: same fields, same fence, same refusals."""

from __future__ import annotations

import pytest
from watchkeeper.store import InvalidNameError
from watchkeeper.store.protocols import EventCommit, Fence, Writer
from watchkeeper.triggerer import TriggerEvent, TriggerEventBatch
from watchkeeper.triggerer.runtime._commit import EventEncoder

FENCED = Writer("watcher", "w1", fence=Fence("t1", "node-a", 3))


def _encoder(watcher: str = "w1", assets: tuple[str, ...] = ("a1", "a2")) -> EventEncoder:
    return EventEncoder(
        watcher, assets, writer=FENCED, max_value_bytes=None, max_payload_bytes=None
    )


class TestEventEncoder:
    def test_a_commit_equals_the_fully_checked_one(self) -> None:
        """Fields and the writer's fence match EventCommit's own; the payload is carried as
        its JSON text only (the commit holds no other form of it)."""
        commit = _encoder().build(TriggerEvent({"n": 1}, state={"wm": 7}, dedup_key="k1"))
        assert isinstance(commit, EventCommit)
        checked = EventCommit("w1", ("a1", "a2"), '{"n":1}', "k1", {"wm": "7"}, FENCED)
        assert commit == checked
        assert commit.fence == FENCED.fence == checked.fence
        assert commit.payload_json == '{"n":1}'
        assert not hasattr(commit, "decoded")

    def test_the_state_is_marked_encoded_so_the_store_does_not_check_it_again(self) -> None:
        """The encoder checks each state value by the store's rules as it encodes it; the
        backend then skips its own check (a plain mapping from elsewhere is checked)."""
        from watchkeeper.store.protocols import EncodedState, EventBatchCommit

        one = _encoder().build(TriggerEvent({"n": 1}, state={"wm": 7}))
        batch = _encoder().build(
            TriggerEventBatch([TriggerEvent({"n": 1}), TriggerEvent({"n": 2})], state={"wm": 2})
        )
        assert isinstance(batch, EventBatchCommit)
        assert type(one.state) is EncodedState and type(batch.state) is EncodedState
        assert dict(one.state) == {"wm": "7"} and dict(batch.state) == {"wm": "2"}

    @pytest.mark.parametrize(
        ("watcher", "assets", "what"),
        [("w\x00", ("a1",), "watcher name"), ("w1", ("a1", "b\x07"), "asset name")],
        ids=["watcher", "asset"],
    )
    def test_a_bad_name_is_refused_at_each_event(
        self, watcher: str, assets: tuple[str, ...], what: str
    ) -> None:
        """A name that breaks the rule does not fail the encoder's creation; every event
        built with it raises EventCommit's InvalidNameError naming it."""
        encoder = _encoder(watcher, assets)
        for _ in range(2):
            with pytest.raises(InvalidNameError, match=f"^invalid {what} "):
                encoder.build(TriggerEvent({"n": 1}))

    def test_a_bad_dedup_key_is_refused(self) -> None:
        with pytest.raises(InvalidNameError, match=r"^invalid dedup key "):
            _encoder().build(TriggerEvent({"n": 1}, dedup_key="a\x00b"))
