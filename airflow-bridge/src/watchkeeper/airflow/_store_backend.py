"""``WatchkeeperStoreBackend``: Airflow's task and asset state kept in watchkeeper's store.

Airflow loads one instance per process (``[state_store] backend``) and calls it from its
Execution API routes with the request's SQLAlchemy session. This module imports Airflow; it is
loaded only when Airflow names it (``watchkeeper.airflow`` exports it lazily).

- Scopes: a ``TaskScope`` maps field for field to ours; an ``AssetScope(asset_id=N)`` is
  Airflow's own id, mapped to the asset's name through the session (names are what both sides
  share: Airflow normalises URIs, so a URI may differ while the name matches).
- Values: Airflow passes JSON text; it is decoded and checked by the store's rules (``None``,
  NaN, non-JSON, the size limit). A refusal is raised as :class:`StateValueRejectedError`,
  which is both a ``ValueError`` and the HTTP error FastAPI answers with: 413 for a value over
  ``max_value_bytes``, 422 for anything else, so the task gets a client error naming the
  problem instead of a 500.
- Writers: task state is written as the task instance try (``dag/run/task[map]``, its try
  number read through the session); asset state as the task whose token made the request, or as
  an Airflow watcher when the triggerer writes it.
- An asset Airflow knows and the store does not is registered by name on its first write.
- The store opens on first use, in the process that uses it: a forked child opens its own.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.to_thread
from fastapi import HTTPException
from watchkeeper.store import (
    Asset,
    AssetNotFoundError,
    AssetScope,
    BaseStateBackend,
    StateStoreError,
    StoreSettings,
    TaskScope,
    ValueTooLargeError,
    open_state_backend,
)
from watchkeeper.store.protocols import Writer, check_key, encode_value

from airflow.state import AssetScope as AirflowAssetScope
from airflow.state import BaseStoreBackend, StoreScope
from airflow.state import TaskScope as AirflowTaskScope

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

__all__ = ["CONFIG_OPTION", "StateValueRejectedError", "WatchkeeperStoreBackend"]

CONFIG_OPTION = ("state_store", "watchkeeper_config")
"""Airflow's option (``AIRFLOW__STATE_STORE__WATCHKEEPER_CONFIG``) naming watchkeeper's TOML
file; unset, watchkeeper's usual sources apply (``watchkeeper.toml`` in the working directory,
then ``WATCHKEEPER__SECTION__KEY`` variables, which win over the file)."""

T = TypeVar("T")

_WATCHER_WRITER = Writer("watcher", "airflow")
_API_WRITER = Writer("api", "airflow")
_NULL_TOKEN = "00000000-0000-0000-0000-000000000000"


class StateValueRejectedError(HTTPException, ValueError):
    """A key or value the store refuses: a ``ValueError`` to Python callers, and the 4xx
    response (413 too large, 422 otherwise) when raised inside an Airflow API route."""

    def __init__(self, cause: Exception) -> None:
        status = 413 if isinstance(cause, ValueTooLargeError) else 422
        super().__init__(
            status_code=status, detail={"reason": "invalid_state_value", "message": str(cause)}
        )
        self.message = str(cause)

    def __str__(self) -> str:
        return self.message


class AssetUnknownError(HTTPException, KeyError):
    """An ``AssetScope`` naming no asset Airflow has: a ``KeyError``, or a 404 in a route."""

    def __init__(self, what: str) -> None:
        super().__init__(
            status_code=404, detail={"reason": "not_found", "message": f"no asset {what}"}
        )
        self.message = f"no asset {what}"

    def __str__(self) -> str:
        return self.message


def load_settings() -> StoreSettings:
    """watchkeeper's settings for this Airflow process (see :data:`CONFIG_OPTION`)."""
    from airflow.configuration import conf

    path = conf.get(*CONFIG_OPTION, fallback=None)
    return StoreSettings.load(path or None)


class WatchkeeperStoreBackend(BaseStoreBackend):
    """Airflow's ``[state_store] backend`` over watchkeeper's store (any of its backends).

    Select it with ``AIRFLOW__STATE_STORE__BACKEND=watchkeeper.airflow.WatchkeeperStoreBackend``
    in the processes that run Airflow's Execution API (the api-server, the triggerer, and
    ``airflow dags test``). ``settings`` is for embedding and tests; Airflow passes none.
    """

    def __init__(self, settings: StoreSettings | None = None) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._store: BaseStateBackend | None = None
        self._pid: int | None = None
        self._names: dict[int, tuple[str, str | None]] = {}

    # -- the store, opened lazily in the process that uses it ----------------------------------

    @property
    def store(self) -> BaseStateBackend:
        """The open watchkeeper store of this process (opened on first use)."""
        store, pid = self._store, os.getpid()
        if store is not None and self._pid == pid:
            return store
        with self._lock:
            if self._store is None or self._pid != pid:
                # A store inherited through fork belongs to the parent (its loop thread did
                # not survive the fork): leave it alone and open this process's own.
                settings = self._settings if self._settings is not None else load_settings()
                opened = open_state_backend(settings).__enter__()
                atexit.register(_close_in, pid, opened)
                self._store, self._pid = opened, pid
                self._names.clear()
            return self._store

    def close(self) -> None:
        """Close this process's store (the next call opens it again)."""
        with self._lock:
            store, pid = self._store, self._pid
            self._store = self._pid = None
        if store is not None:
            _close_in(pid, store)

    # -- scopes and writers ----------------------------------------------------------------------

    def _asset_name(
        self, scope: AirflowAssetScope, session: Session | None
    ) -> tuple[str, str | None]:
        """The asset's (name, uri): from the scope, or Airflow's table through ``session``."""
        if scope.name is not None:
            return scope.name, scope.uri
        if scope.asset_id is not None and scope.asset_id in self._names:
            return self._names[scope.asset_id]
        from sqlalchemy import select

        from airflow.models.asset import AssetModel

        query = select(AssetModel.id, AssetModel.name, AssetModel.uri)
        if scope.asset_id is not None:
            query = query.where(AssetModel.id == scope.asset_id)
            what = f"with id {scope.asset_id}"
        else:
            query = query.where(AssetModel.uri == scope.uri, AssetModel.active.has())
            what = f"with uri {scope.uri!r}"
        row = _with_session(session, lambda s: s.execute(query).one_or_none())
        if row is None:
            raise AssetUnknownError(what)
        found = (row.name, row.uri)
        self._names[row.id] = found  # an id never changes its name
        return found

    def _our_scope(self, scope: StoreScope, session: Session | None) -> TaskScope | AssetScope:
        try:
            if isinstance(scope, AirflowTaskScope):
                return TaskScope(scope.dag_id, scope.run_id, scope.task_id, scope.map_index)
            if isinstance(scope, AirflowAssetScope):
                return AssetScope(name=self._asset_name(scope, session)[0])
        except (ValueError, TypeError) as exc:
            if isinstance(exc, HTTPException):
                raise
            raise StateValueRejectedError(exc) from exc
        raise TypeError(f"scope must be Airflow's TaskScope or AssetScope, not {scope!r}")

    def _writer(self, scope: StoreScope, session: Session | None) -> Writer:
        if isinstance(scope, AirflowTaskScope):
            return Writer(
                "task",
                str(TaskScope(scope.dag_id, scope.run_id, scope.task_id, scope.map_index)),
                _try_number(scope, session),
            )
        ti_id = _requesting_task_instance()
        if ti_id is not None and str(ti_id) != _NULL_TOKEN:
            return _task_writer(ti_id, session)
        # Airflow's in-process Execution API (``airflow dags test``, the triggerer) passes no
        # task token: a task running in this process is the writer, else a watcher is.
        running = _running_task_writer()
        if running is not None:
            return running
        return _WATCHER_WRITER if ti_id is not None else _API_WRITER

    # -- the sync API Airflow's routes call -----------------------------------------------------

    def get(self, scope: StoreScope, key: str, *, session: Session | None = None) -> str | None:
        ours = self._our_scope(scope, session)
        try:
            raw = self.store.get_raw(ours, _checked_key(key))
        except AssetNotFoundError:
            return None  # an asset nothing has written yet
        return None if raw is None else raw.value_json

    def set(
        self,
        scope: StoreScope,
        key: str,
        value: str,
        *,
        expires_at: datetime | None = None,
        session: Session | None = None,
    ) -> None:
        ours = self._our_scope(scope, session)
        store = self.store
        text = _checked_value(key, value, store.max_value_bytes)
        writer = self._writer(scope, session)
        if isinstance(ours, TaskScope):
            store.put_json(
                ours,
                key,
                text,
                expires_at=expires_at,
                never_expire=expires_at is None,
                writer=writer,
            )
            return
        try:
            store.put_json(ours, key, text, writer=writer)
        except AssetNotFoundError:
            self._register(scope, ours, session)
            store.put_json(ours, key, text, writer=writer)

    def delete(self, scope: StoreScope, key: str, *, session: Session | None = None) -> None:
        ours = self._our_scope(scope, session)
        writer = self._writer(scope, session)
        try:
            self.store.delete(ours, _checked_key(key), writer=writer)
        except AssetNotFoundError:
            return

    def clear(
        self, scope: StoreScope, *, all_map_indices: bool = False, session: Session | None = None
    ) -> None:
        ours = self._our_scope(scope, session)
        writer = self._writer(scope, session)
        try:
            self.store.clear(ours, all_map_indices=all_map_indices, writer=writer)
        except AssetNotFoundError:
            return

    def _register(self, scope: StoreScope, ours: AssetScope, session: Session | None) -> None:
        assert isinstance(scope, AirflowAssetScope) and ours.name is not None
        name, uri = self._asset_name(scope, session)
        asset = Asset(name, uri if uri and uri != name else None)
        store = self.store
        store.run_sync(store.events.aregister_assets, [asset])

    # -- async twins: the same calls off the event loop -----------------------------------------

    async def aget(
        self, scope: StoreScope, key: str, *, session: AsyncSession | None = None
    ) -> str | None:
        scope = await self._aresolve(scope, session)
        return await _in_thread(functools.partial(self.get, scope, key))

    async def aset(
        self,
        scope: StoreScope,
        key: str,
        value: str,
        *,
        expires_at: datetime | None = None,
        session: AsyncSession | None = None,
    ) -> None:
        scope = await self._aresolve(scope, session)
        await _in_thread(functools.partial(self.set, scope, key, value, expires_at=expires_at))

    async def adelete(
        self, scope: StoreScope, key: str, *, session: AsyncSession | None = None
    ) -> None:
        scope = await self._aresolve(scope, session)
        await _in_thread(functools.partial(self.delete, scope, key))

    async def aclear(
        self,
        scope: StoreScope,
        *,
        all_map_indices: bool = False,
        session: AsyncSession | None = None,
    ) -> None:
        scope = await self._aresolve(scope, session)
        await _in_thread(functools.partial(self.clear, scope, all_map_indices=all_map_indices))

    async def _aresolve(self, scope: StoreScope, session: AsyncSession | None) -> StoreScope:
        """An asset id resolved to the name on the caller's async session (the sync calls then
        run in a thread, where that session cannot go)."""
        if not isinstance(scope, AirflowAssetScope) or scope.name is not None:
            return scope
        if session is None or scope.asset_id is None:
            return scope  # resolved in the thread, on a session of its own
        if scope.asset_id not in self._names:
            from sqlalchemy import select

            from airflow.models.asset import AssetModel

            row = (
                await session.execute(
                    select(AssetModel.name, AssetModel.uri).where(AssetModel.id == scope.asset_id)
                )
            ).one_or_none()
            if row is None:
                raise AssetUnknownError(f"with id {scope.asset_id}")
            self._names[scope.asset_id] = (row.name, row.uri)
        name, uri = self._names[scope.asset_id]
        return AirflowAssetScope(asset_id=scope.asset_id, name=name, uri=uri)


# -- helpers ---------------------------------------------------------------------------------


def _close_in(pid: int | None, store: BaseStateBackend) -> None:
    if pid == os.getpid() and store.is_open:
        store.__exit__(None, None, None)


async def _in_thread(call: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(call)


def _with_session(session: Session | None, call: Callable[[Session], T]) -> T:
    if session is not None:
        return call(session)
    from airflow.utils.session import create_session

    with create_session() as own:
        return call(own)


def _checked_key(key: object) -> str:
    try:
        return check_key(key)
    except StateStoreError as exc:
        raise StateValueRejectedError(exc) from exc


def _checked_value(key: str, value: str, max_value_bytes: int | None) -> str:
    """Airflow's JSON text, decoded and re-encoded under the store's rules."""
    key = _checked_key(key)
    if not isinstance(value, str):
        raise StateValueRejectedError(TypeError(f"value for key {key!r} is not JSON text"))
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError as exc:
        raise StateValueRejectedError(
            ValueError(f"value for key {key!r} is not JSON: {exc}")
        ) from exc
    try:
        return encode_value(key, decoded, max_value_bytes=max_value_bytes)
    except StateStoreError as exc:
        raise StateValueRejectedError(exc) from exc


def _try_number(scope: AirflowTaskScope, session: Session | None) -> int | None:
    if session is None:
        return None
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance

    found = session.scalar(
        select(TaskInstance.try_number).where(
            TaskInstance.dag_id == scope.dag_id,
            TaskInstance.run_id == scope.run_id,
            TaskInstance.task_id == scope.task_id,
            TaskInstance.map_index == scope.map_index,
        )
    )
    return found if isinstance(found, int) and found >= 1 else None


def _task_writer(ti_id: Any, session: Session | None) -> Writer:
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance

    query = select(
        TaskInstance.dag_id,
        TaskInstance.run_id,
        TaskInstance.task_id,
        TaskInstance.map_index,
        TaskInstance.try_number,
    ).where(TaskInstance.id == ti_id)
    row = _with_session(session, lambda s: s.execute(query).one_or_none())
    if row is None:
        return _API_WRITER
    name = str(TaskScope(row.dag_id, row.run_id, row.task_id, row.map_index))
    return Writer("task", name, row.try_number if row.try_number >= 1 else None)


def _running_task_writer() -> Writer | None:
    """The task instance try running in this process (``airflow dags test``), if any."""
    module = sys.modules.get("airflow.sdk.definitions._internal.contextmanager")
    stack = getattr(module, "_CURRENT_CONTEXT", None)
    if not stack:
        return None
    ti = stack[-1].get("ti")
    if ti is None:
        return None
    name = str(TaskScope(ti.dag_id, ti.run_id, ti.task_id, ti.map_index))
    try_number = getattr(ti, "try_number", None)
    return Writer(
        "task", name, try_number if isinstance(try_number, int) and try_number >= 1 else None
    )


_ROUTES_MODULE = "airflow.api_fastapi.execution_api.routes.asset_state_store"


def _requesting_task_instance() -> Any:
    """The task instance id of the Execution API request calling us, or ``None``.

    Airflow 3.3 passes a custom backend no writer (only its own backend gets one), but its asset
    write route holds the request's task token in a local named ``token``: read it from the
    route's frame, a few frames up. Anything else (a delete, a clear, another caller) gets
    ``None`` and is recorded as written by Airflow's API.
    """
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_globals.get("__name__") == _ROUTES_MODULE:
            return getattr(frame.f_locals.get("token"), "id", None)
        frame = frame.f_back
    return None
