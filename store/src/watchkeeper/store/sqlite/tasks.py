"""A worker's steps on :class:`~watchkeeper.store.SqliteStateBackend`: the group-commit
writer runs the steps that reach one batch together, as one job of the SQL engine
(:func:`~watchkeeper.store.sql.run_steps.step_group`), inside the batch's transaction.

Every write is one operation of the writer (:mod:`.writer`), so it is one transaction and
serialised with every other write of the file; several processes serialise on SQLite's write
lock. Event ids are commit order (``AUTOINCREMENT`` under the write lock), so a cursor never
passes an uncommitted event. Everything else of runs is
:class:`~watchkeeper.store.sql.runs.SqlRuns`'.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from .._tasks import RunOutcome, RunStep
from ..sql.dialects import SQLITE
from ..sql.run_steps import StepItem, StepStatements, step_group
from .executor import run_on
from .part import SqlitePart
from .schema import to_db
from .writer import Op

if TYPE_CHECKING:
    from .writer import Tx

__all__ = ["RUN_STEPS", "SqliteTasks"]

_STEPS: Final = StepStatements(SQLITE, "")


def _step(tx: Tx, item: StepItem) -> RunStep:
    """One step alone: raises what refused its finish."""
    (outcome,) = run_on(step_group(_STEPS, [item]), tx.conn, tx.now()[0])
    if isinstance(outcome, BaseException):
        raise outcome
    result: RunStep = outcome
    return result


class _RunSteps:
    """Neighbouring steps of a batch as one call (:func:`~..sql.run_steps.step_group`)."""

    def run(self, tx: Tx, items: Sequence[StepItem]) -> list[Any]:
        return run_on(step_group(_STEPS, items), tx.conn, tx.now()[0])


RUN_STEPS: Final = _RunSteps()


class SqliteTasks(SqlitePart):
    """The stepper of SQLite's runs driver (:class:`~watchkeeper.store.sql.runs.RunStepper`):
    a worker's steps, grouped by the writer."""

    events_lock: str | None = None
    """Event ids are commit order here (``AUTOINCREMENT`` under the write lock): no lock."""

    async def _astep_runs(
        self,
        owner: str,
        finish: RunOutcome | None,
        claim: int,
        span: timedelta,
        tasks: builtins.list[str] | None,
        create: int,
        peers: int,
    ) -> RunStep:
        if finish is None and not await self._anything_to_claim(create > 0):
            return RunStep(None, ())  # no write: another process's commits need not wait
        # Neighbouring steps of a batch run as one (RUN_STEPS), this one alone if that fails.
        item = StepItem(owner, finish, claim, span, None if tasks is None else tuple(tasks), create)
        op = Op(_step, item, group=RUN_STEPS)
        op.company = peers
        self._live_writer().put(op)
        await op.done
        result: RunStep = op.outcome()
        return result

    async def _anything_to_claim(self, create: bool) -> bool:
        """Whether a claim could find something (a read, without the write lock): a ready
        run, a lapsed lease, or (``create``) a task with events after its cursor."""
        stmt = _STEPS.anything
        rows = await self._read(stmt.sql, stmt.bind({"create": create}, to_db(self.clock()), str))
        return bool(rows[0][0])
