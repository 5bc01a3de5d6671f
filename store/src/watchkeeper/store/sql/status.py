"""Trigger and daemon status rows, written once for both SQL databases (the checks are the
status service's, :mod:`watchkeeper.store._services`).

Writes run in the writer's batch (PostgreSQL: its late phase, after the batch's events): a
daemon saves its triggers' status every few seconds, and that costs no transaction of its
own. A trigger status keeps its times as given (SQLite: ISO text with the offset they came
with), so a row reads back as it was saved; a daemon's times are stored as the clock's.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from .._daemons import decode_refused, decode_settings, encode_refused
from .._types import DaemonStatus, TriggerStatus
from .engine import BEGIN, Dialect, Job, many, rows, run
from .runner import Runner

__all__ = ["SqlStatus", "StatusStatements"]

_STATUS_COLS: Final = (
    "trigger_id, classpath, assets, watchers, state, failures, last_error, last_event_at, "
    "events, updated_at, owner"
)
_DAEMON_COLS: Final = "owner, started_at, heartbeat_at, lease_ttl, watchers_path, refused"


class StatusStatements:
    """The status statements in one dialect, for one table prefix."""

    def __init__(self, dialect: Dialect, prefix: str) -> None:
        self.dialect = dialect
        sql = partial(dialect.compile, prefix=prefix)
        self.save_status = sql(f"""
            INSERT INTO {{p}}trigger_status ({_STATUS_COLS})
            VALUES (:trigger_id, :classpath, {{list:assets}}, {{list:watchers}}, :state,
                :failures, :last_error, {{iso:last_event_at}}, :events, {{iso:updated_at}},
                :owner)
            ON CONFLICT (trigger_id) DO UPDATE SET classpath = excluded.classpath,
                assets = excluded.assets, watchers = excluded.watchers, state = excluded.state,
                failures = excluded.failures, last_error = excluded.last_error,
                last_event_at = excluded.last_event_at, events = excluded.events,
                updated_at = excluded.updated_at, owner = excluded.owner
        """)
        self.delete_status = sql("DELETE FROM {p}trigger_status WHERE trigger_id {in:ids}")
        self.list_status = sql(
            f"SELECT {_STATUS_COLS} FROM {{p}}trigger_status ORDER BY trigger_id"
        )
        self.save_daemon = sql(f"""
            INSERT INTO {{p}}daemon_status ({_DAEMON_COLS})
            VALUES (:owner, {{ts:started_at}}, {{ts:heartbeat_at}}, :lease_ttl, :watchers_path,
                :refused)
            ON CONFLICT (owner) DO UPDATE SET started_at = excluded.started_at,
                heartbeat_at = excluded.heartbeat_at, lease_ttl = excluded.lease_ttl,
                watchers_path = excluded.watchers_path, refused = excluded.refused
        """)
        self.delete_daemons = sql("DELETE FROM {p}daemon_status WHERE owner {in:owners}")
        self.list_daemons = sql(f"SELECT {_DAEMON_COLS} FROM {{p}}daemon_status ORDER BY owner")

    def trigger_status(self, r: Any) -> TriggerStatus:
        d = self.dialect
        return TriggerStatus(
            trigger_id=r[0],
            classpath=r[1],
            assets=tuple(d.json_list(r[2])),
            watchers=tuple(d.json_list(r[3])),
            state=r[4],
            failures=r[5],
            last_error=r[6],
            last_event_at=None if r[7] is None else d.timestamp(r[7]),
            events=r[8],
            updated_at=None if r[9] is None else d.timestamp(r[9]),
            owner=r[10],
        )

    def daemon_status(self, r: Any) -> DaemonStatus:
        ts = self.dialect.timestamp
        return DaemonStatus(
            owner=r[0],
            started_at=ts(r[1]),
            heartbeat_at=ts(r[2]),
            lease_ttl=r[3],
            watchers_path=r[4],
            refused=decode_refused(r[5]),
            settings=decode_settings(r[5]),
        )


# -- the jobs --------------------------------------------------------------------------------


def save_statuses(s: StatusStatements, statuses: list[TriggerStatus]) -> Job[None]:
    yield BEGIN
    yield many(
        s.save_status,
        [
            {
                "trigger_id": t.trigger_id,
                "classpath": t.classpath,
                "assets": list(t.assets),
                "watchers": list(t.watchers),
                "state": t.state,
                "failures": t.failures,
                "last_error": t.last_error,
                "last_event_at": t.last_event_at,
                "events": t.events,
                "updated_at": t.updated_at,
                "owner": t.owner,
            }
            for t in statuses
        ],
    )


def delete_statuses(s: StatusStatements, trigger_ids: list[str]) -> Job[None]:
    yield BEGIN
    yield run(s.delete_status, ids=trigger_ids)


def list_statuses(s: StatusStatements) -> Job[list[TriggerStatus]]:
    return [s.trigger_status(r) for r in (yield rows(s.list_status))]


def save_daemon(s: StatusStatements, d: DaemonStatus) -> Job[None]:
    yield BEGIN
    yield run(
        s.save_daemon,
        owner=d.owner,
        started_at=d.started_at,
        heartbeat_at=d.heartbeat_at,
        lease_ttl=float(d.lease_ttl),
        watchers_path=d.watchers_path,
        refused=encode_refused(d.refused, d.settings),
    )


def delete_daemons(s: StatusStatements, owners: list[str]) -> Job[None]:
    yield BEGIN
    yield run(s.delete_daemons, owners=owners)


def list_daemons(s: StatusStatements) -> Job[list[DaemonStatus]]:
    return [s.daemon_status(r) for r in (yield rows(s.list_daemons))]


# -- the driver ------------------------------------------------------------------------------


class SqlStatus:
    """The status driver (:class:`~watchkeeper.store.protocols.StatusDriver`) of a SQL store,
    over its :class:`~.runner.Runner`."""

    __slots__ = ("_runner", "_statements")

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._statements: StatusStatements | None = None

    def __repr__(self) -> str:
        return f"<SqlStatus over {self._runner!r}>"

    @property
    def statements(self) -> StatusStatements:
        s = self._statements
        if s is None:
            s = self._statements = StatusStatements(self._runner.dialect, self._runner.prefix)
        return s

    async def _asave_trigger_status(self, statuses: list[TriggerStatus]) -> None:
        job = partial(save_statuses, self.statements, statuses)
        await self._runner.write(job, what="saving trigger status", lane="late")

    async def _adelete_trigger_status(self, trigger_ids: list[str]) -> None:
        job = partial(delete_statuses, self.statements, trigger_ids)
        await self._runner.write(job, what="deleting trigger status", lane="late")

    async def _alist_trigger_status(self) -> list[TriggerStatus]:
        job = partial(list_statuses, self.statements)
        return await self._runner.read(job, what="listing trigger status")

    async def _asave_daemon_status(self, status: DaemonStatus) -> None:
        job = partial(save_daemon, self.statements, status)
        await self._runner.write(job, what="saving daemon status", lane="late")

    async def _adelete_daemon_status(self, owners: list[str]) -> None:
        job = partial(delete_daemons, self.statements, owners)
        await self._runner.write(job, what="deleting daemon status", lane="late")

    async def _alist_daemon_status(self) -> list[DaemonStatus]:
        job = partial(list_daemons, self.statements)
        return await self._runner.read(job, what="listing daemon status")
