"""Watcher controls and API tokens, written once for both SQL databases (the records are
:mod:`watchkeeper.store._controls`'; the tables are migration 7's).

Each write is one short transaction (SQLite: an operation of the writer's batch; PostgreSQL:
a pooled connection, not the event writer): controls are rare operator actions. Times are the
store's clock.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from .._controls import ApiToken, WatcherControl
from ..errors import AssetNotFoundError, TokenExistsError, VersionConflictError
from .engine import BEGIN, Dialect, Job, rows
from .runner import Runner

__all__ = ["ControlStatements", "SqlControls"]

_CONTROL_COLS: Final = "watcher, paused, retry_seq, updated_at, updated_by"
_TOKEN_COLS: Final = "name, token_id, scopes, salt, digest, created_at, expires_at, revoked_at"


class ControlStatements:
    """The controls' statements in one dialect, for one table prefix."""

    def __init__(self, dialect: Dialect, prefix: str) -> None:
        self.dialect = dialect
        sql = partial(dialect.compile, prefix=prefix)
        self.pause = sql(f"""
            INSERT INTO {{p}}watcher_controls ({_CONTROL_COLS})
            VALUES (:watcher, :paused, 0, {{now}}, :by)
            ON CONFLICT (watcher) DO UPDATE SET paused = excluded.paused,
                updated_at = excluded.updated_at, updated_by = excluded.updated_by
            RETURNING {_CONTROL_COLS}
        """)
        self.retry = sql(f"""
            INSERT INTO {{p}}watcher_controls ({_CONTROL_COLS})
            VALUES (:watcher, false, 1, {{now}}, :by)
            ON CONFLICT (watcher) DO UPDATE SET retry_seq = {{p}}watcher_controls.retry_seq + 1,
                updated_at = excluded.updated_at, updated_by = excluded.updated_by
            RETURNING {_CONTROL_COLS}
        """)
        self.controls = sql(f"SELECT {_CONTROL_COLS} FROM {{p}}watcher_controls ORDER BY watcher")
        self.asset = sql("SELECT id FROM {p}assets WHERE name = :asset AND active {for_share}")
        self.delete = sql(
            "DELETE FROM {p}asset_state WHERE asset_id = :asset_id AND key = :key "
            "AND version = :version RETURNING version"
        )
        self.version = sql(
            "SELECT version FROM {p}asset_state WHERE asset_id = :asset_id AND key = :key"
        )
        self.create_token = sql(f"""
            INSERT INTO {{p}}api_tokens ({_TOKEN_COLS})
            VALUES (:name, :token_id, {{list:scopes}}, :salt, :digest, {{ts:created_at}},
                {{ts:expires_at}}, NULL)
            ON CONFLICT (name) DO UPDATE SET token_id = excluded.token_id,
                scopes = excluded.scopes, salt = excluded.salt, digest = excluded.digest,
                created_at = excluded.created_at, expires_at = excluded.expires_at,
                revoked_at = NULL
            WHERE {{p}}api_tokens.revoked_at IS NOT NULL
            RETURNING name
        """)
        self.tokens = sql(f"SELECT {_TOKEN_COLS} FROM {{p}}api_tokens ORDER BY name")
        self.token = sql(f"SELECT {_TOKEN_COLS} FROM {{p}}api_tokens WHERE token_id = :token_id")
        self.revoke = sql(
            "UPDATE {p}api_tokens SET revoked_at = {now} "
            "WHERE name = :name AND revoked_at IS NULL RETURNING name"
        )

    def control(self, row: Any) -> WatcherControl:
        ts = self.dialect.timestamp
        return WatcherControl(row[0], bool(row[1]), row[2], ts(row[3]), row[4])

    def api_token(self, row: Any) -> ApiToken:
        ts = self.dialect.timestamp
        return ApiToken(
            name=row[0],
            token_id=row[1],
            scopes=tuple(self.dialect.json_list(row[2])),
            salt=row[3],
            digest=row[4],
            created_at=ts(row[5]),
            expires_at=None if row[6] is None else ts(row[6]),
            revoked_at=None if row[7] is None else ts(row[7]),
        )


# -- the jobs --------------------------------------------------------------------------------


def set_paused(s: ControlStatements, watcher: str, paused: bool, by: str) -> Job[WatcherControl]:
    yield BEGIN
    return s.control((yield rows(s.pause, watcher=watcher, paused=paused, by=by))[0])


def request_retry(s: ControlStatements, watcher: str, by: str) -> Job[WatcherControl]:
    yield BEGIN
    return s.control((yield rows(s.retry, watcher=watcher, by=by))[0])


def list_controls(s: ControlStatements) -> Job[list[WatcherControl]]:
    return [s.control(r) for r in (yield rows(s.controls))]


def delete_if_version(s: ControlStatements, asset: str, key: str, version: int) -> Job[None]:
    """Delete ``key`` of ``asset`` if its version is ``version``; else raise, deleting nothing."""
    yield BEGIN
    found = yield rows(s.asset, asset=asset)  # FOR SHARE: not deactivated meanwhile
    if not found:
        raise AssetNotFoundError(asset)
    asset_id = found[0][0]
    if not (yield rows(s.delete, asset_id=asset_id, key=key, version=version)):
        actual = yield rows(s.version, asset_id=asset_id, key=key)
        raise VersionConflictError(key, version, actual[0][0] if actual else 0)


def create_token(s: ControlStatements, token: ApiToken) -> Job[bool]:
    """Store ``token``, unless a token of its name that is not revoked exists (then False)."""
    yield BEGIN
    created = yield rows(
        s.create_token,
        name=token.name,
        token_id=token.token_id,
        scopes=list(token.scopes),
        salt=token.salt,
        digest=token.digest,
        created_at=token.created_at,
        expires_at=token.expires_at,
    )
    return bool(created)


def list_tokens(s: ControlStatements) -> Job[list[ApiToken]]:
    return [s.api_token(r) for r in (yield rows(s.tokens))]


def get_token(s: ControlStatements, token_id: str) -> Job[ApiToken | None]:
    found = yield rows(s.token, token_id=token_id)
    return s.api_token(found[0]) if found else None


def revoke_token(s: ControlStatements, name: str) -> Job[bool]:
    yield BEGIN
    return bool((yield rows(s.revoke, name=name)))


# -- the driver ------------------------------------------------------------------------------


class SqlControls:
    """The controls driver (:class:`~watchkeeper.store.protocols.ControlsDriver`) of a SQL
    store, over its :class:`~.runner.Runner`."""

    __slots__ = ("_runner", "_statements")

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._statements: ControlStatements | None = None

    def __repr__(self) -> str:
        return f"<SqlControls over {self._runner!r}>"

    @property
    def statements(self) -> ControlStatements:
        s = self._statements
        if s is None:
            s = self._statements = ControlStatements(self._runner.dialect, self._runner.prefix)
        return s

    async def _aset_watcher_paused(self, watcher: str, paused: bool, by: str) -> WatcherControl:
        job = partial(set_paused, self.statements, watcher, paused, by)
        return await self._runner.write(job, what="pausing a watcher")

    async def _arequest_watcher_retry(self, watcher: str, by: str) -> WatcherControl:
        job = partial(request_retry, self.statements, watcher, by)
        return await self._runner.write(job, what="retrying a watcher")

    async def _alist_watcher_controls(self) -> list[WatcherControl]:
        job = partial(list_controls, self.statements)
        return await self._runner.read(job, what="listing watcher controls")

    async def _adelete_if_version(self, asset: str, key: str, expected_version: int) -> None:
        job = partial(delete_if_version, self.statements, asset, key, expected_version)
        await self._runner.write(job, what="deleting a key")

    async def _acreate_token(self, token: ApiToken) -> None:
        job = partial(create_token, self.statements, token)
        if not await self._runner.write(job, what="creating a token"):
            raise TokenExistsError(token.name)

    async def _alist_tokens(self) -> list[ApiToken]:
        return await self._runner.read(partial(list_tokens, self.statements), what="listing tokens")

    async def _aget_token(self, token_id: str) -> ApiToken | None:
        job = partial(get_token, self.statements, token_id)
        return await self._runner.read(job, what="reading a token")

    async def _arevoke_token(self, name: str) -> bool:
        job = partial(revoke_token, self.statements, name)
        return await self._runner.write(job, what="revoking a token")
