"""The daemon's reconcile step as a pure function: wanted and running in, stops and starts out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from watchkeeper.store import Asset
from watchkeeper.triggerer import BaseEventTrigger, TriggerEvent
from watchkeeper.triggerer.daemon._loader import WatcherGroup
from watchkeeper.triggerer.daemon._reconcile import Claim, RunningTrigger, plan_reconcile


class _Idle(BaseEventTrigger):
    def serialize(self) -> tuple[str, dict[str, object]]:
        return f"{__name__}._Idle", {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        return
        yield  # pragma: no cover


def group(trigger_id: str, *assets: str) -> WatcherGroup:
    return WatcherGroup(
        trigger_id=trigger_id,
        classpath=f"{__name__}._Idle",
        kwargs={},
        trigger=_Idle(),
        assets=tuple(Asset(name) for name in assets or ("a",)),
        watchers=("w",),
        files=("f.py",),
    )


def running(groups: Mapping[str, WatcherGroup], **tokens: int | None) -> dict[str, RunningTrigger]:
    return {t: RunningTrigger(groups[t], token) for t, token in tokens.items()}


def leases(tokens: Mapping[str, int], *asked: str) -> Claim:
    return Claim(frozenset(asked or tokens), dict(tokens))


NO_LEASES = Claim(frozenset(), None)


class TestPlanReconcile:
    def test_without_leases_every_wanted_trigger_starts_unfenced(self) -> None:
        """A backend without leases starts every wanted trigger with no fence token."""
        wanted = {"t1": group("t1"), "t2": group("t2")}
        plan = plan_reconcile({}, wanted, NO_LEASES)
        assert (plan.stop, plan.start) == ([], [("t1", None), ("t2", None)])

    def test_an_unchanged_trigger_whose_lease_is_held_keeps_running(self) -> None:
        """A trigger loaded unchanged, its lease held with the same token, is left alone."""
        wanted = {"t1": group("t1")}
        plan = plan_reconcile(running(wanted, t1=4), wanted, leases({"t1": 4}))
        assert (plan.stop, plan.start) == ([], [])

    def test_a_new_token_restarts_the_trigger_with_it(self) -> None:
        """A lease retaken with another token stops the trigger and starts it with the new one."""
        wanted = {"t1": group("t1")}
        plan = plan_reconcile(running(wanted, t1=4), wanted, leases({"t1": 5}))
        assert (plan.stop, plan.start) == ([("t1", True)], [("t1", 5)])

    def test_a_lease_another_daemon_holds_stops_without_saving_status(self) -> None:
        """A trigger whose lease was not got is stopped, its status row left to its holder."""
        wanted = {"t1": group("t1")}
        plan = plan_reconcile(running(wanted, t1=4), wanted, leases({}, "t1"))
        assert (plan.stop, plan.start) == ([("t1", False)], [])

    def test_a_trigger_no_longer_loaded_stops(self) -> None:
        """A running trigger that the files no longer define is stopped and not started."""
        loaded = {"t1": group("t1")}
        plan = plan_reconcile(running(loaded, t1=None), {}, NO_LEASES)
        assert (plan.stop, plan.start) == ([("t1", True)], [])

    def test_a_changed_definition_restarts_the_trigger(self) -> None:
        """A trigger whose assets changed under the same id is stopped and started again."""
        before = {"t1": group("t1", "a")}
        now = {"t1": group("t1", "a", "b")}
        plan = plan_reconcile(running(before, t1=None), now, NO_LEASES)
        assert (plan.stop, plan.start) == ([("t1", True)], [("t1", None)])

    def test_triggers_to_restart_start_afresh(self) -> None:
        """A trigger named in restart is stopped and started even when nothing else changed."""
        wanted = {"t1": group("t1"), "t2": group("t2")}
        plan = plan_reconcile(
            running(wanted, t1=1, t2=2), wanted, leases({"t1": 1, "t2": 2}), {"t2"}
        )
        assert (plan.stop, plan.start) == ([("t2", True)], [("t2", 2)])

    def test_a_wanted_trigger_not_claimed_does_not_start(self) -> None:
        """A wanted trigger left out of the claim (no room) is not started here."""
        wanted = {"t1": group("t1"), "t2": group("t2")}
        plan = plan_reconcile({}, wanted, leases({"t1": 1}))
        assert (plan.stop, plan.start) == ([], [("t1", 1)])

    def test_a_running_trigger_left_out_of_a_claim_keeps_its_token(self) -> None:
        """A running trigger the claim did not ask about keeps running with its own token."""
        wanted = {"t1": group("t1"), "t2": group("t2")}
        plan = plan_reconcile(running(wanted, t1=1), wanted, leases({"t2": 7}))
        assert (plan.stop, plan.start) == ([], [("t2", 7)])

    def test_a_paused_trigger_is_paused_and_not_started(self) -> None:
        """A running trigger whose watcher is paused is paused (not stopped); a paused one that
        does not run is not started."""
        wanted = {"t1": group("t1"), "t2": group("t2")}
        claim = leases({"t1": 1, "t2": 2})
        plan = plan_reconcile(running(wanted, t1=1), wanted, claim, paused={"t1", "t2"})
        assert (plan.stop, plan.pause, plan.start) == ([], ["t1"], [])

    def test_a_paused_trigger_another_daemon_holds_is_stopped_without_status(self) -> None:
        """Without its lease, a paused watcher's trigger is stopped as any other (its row is
        the holder's)."""
        wanted = {"t1": group("t1")}
        plan = plan_reconcile(running(wanted, t1=1), wanted, leases({}, "t1"), paused={"t1"})
        assert (plan.stop, plan.pause, plan.start) == ([("t1", False)], [], [])
