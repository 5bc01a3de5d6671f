"""Assets and their state: list, detail, and the compare-and-set state routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import AssetScope, VersionConflictError
from watchkeeper.store.protocols import Writer, encode_value

from .._core import iso
from ..daemon import watcher_rows
from ._base import (
    ApiError,
    authenticate,
    ctx_of,
    entry_json,
    etag,
    forbid,
    require,
)
from ._parse import Preconditions, json_body, path_param
from ._tokens import Principal

__all__ = [
    "asset_detail",
    "delete_state",
    "get_state",
    "list_assets",
    "list_state",
    "put_state",
    "state_entry",
]

_T = TypeVar("_T")
_ATTEMPTS: Final = 5
"""Evaluations of a conditional write's preconditions when the entry keeps changing."""


async def list_assets(request: Request) -> Response:
    principal = await authenticate(request)
    assets = await ctx_of(request).backend.events.alist_assets()
    shown = [a for a in assets if principal.can_read_asset(a.name)]
    if (
        not shown
        and not principal.can_read()
        and not any(s.startswith("write:asset:") or s == "admin" for s in principal.scopes)
    ):
        raise forbid(principal, "read assets")
    return JSONResponse(
        {
            "assets": [
                {"name": a.name, "uri": a.uri, "active": a.active, "updated_at": iso(a.updated_at)}
                for a in shown
            ],
            "may_read_all": principal.can_read(),
        }
    )


async def _asset_principal(request: Request) -> tuple[Principal, str]:
    principal = await authenticate(request)
    name = path_param(request, "name")
    require(principal.can_read_asset(name), principal, f"read asset {name!r}")
    return principal, name


async def asset_detail(request: Request) -> Response:
    principal, name = await _asset_principal(request)
    ctx = ctx_of(request)
    found = [a for a in await ctx.backend.events.alist_assets() if a.name == name]
    if not found:
        raise ApiError(404, "not_found", f"no asset named {name!r}")
    asset = found[0]
    watchers = [w.to_json() for w in await watcher_rows(ctx.backend) if name in w.assets]
    entries = await ctx.backend.alist(AssetScope(name=name)) if asset.active else []
    return JSONResponse(
        {
            "name": asset.name,
            "uri": asset.uri,
            "active": asset.active,
            "updated_at": iso(asset.updated_at),
            "state": [entry_json(e) for e in entries],
            "watchers": watchers,
            "writable": principal.can_write_asset(name),
        }
    )


async def list_state(request: Request) -> Response:
    _, name = await _asset_principal(request)
    entries = await ctx_of(request).backend.alist(AssetScope(name=name))
    return JSONResponse({"asset": name, "entries": [entry_json(e) for e in entries]})


async def get_state(request: Request) -> Response:
    _, name = await _asset_principal(request)
    key = path_param(request, "key")
    conditions = Preconditions.of(request)
    entry = await ctx_of(request).backend.aget_entry(AssetScope(name=name), key)
    if entry is None:  # what the request would get without its conditions: they are ignored
        raise ApiError(404, "not_found", f"key {key!r} is not set for asset {name!r}")
    failed = conditions.failure(entry.version, safe=True)
    if failed == 304:
        return Response(status_code=304, headers={"ETag": etag(entry.version)})
    if failed is not None:
        raise _precondition_failed(entry.version)
    return JSONResponse(entry_json(entry), headers={"ETag": etag(entry.version)})


def _precondition_failed(version: int) -> ApiError:
    detail = "the key is not set" if version == 0 else f"the key is at version {version}"
    return ApiError(
        412,
        "version_conflict",
        f"a precondition failed: {detail}",
        headers={"ETag": etag(version)} if version else None,
        extra={"current_version": version},
    )


async def _conditionally(
    request: Request, name: str, key: str, write: Callable[[int], Awaitable[_T]]
) -> _T:
    """Evaluate the request's If-Match/If-None-Match against the entry, then ``write(version)``
    on condition that the entry is still at that version (0: still not set); evaluated again
    when it changed in between."""
    conditions = Preconditions.of(request)
    backend = ctx_of(request).backend
    for _ in range(_ATTEMPTS):
        entry = await backend.aget_entry(AssetScope(name=name), key)
        version = 0 if entry is None else entry.version
        if conditions.failure(entry.version if entry else None, safe=False) is not None:
            raise _precondition_failed(version)
        try:
            return await write(version)
        except VersionConflictError:
            continue
    raise _precondition_failed(version)


async def put_state(request: Request) -> Response:
    principal = await authenticate(request)
    name, key = path_param(request, "name"), path_param(request, "key")
    require(principal.can_write_asset(name), principal, f"write the state of asset {name!r}")
    backend = ctx_of(request).backend
    conditional = Preconditions.of(request).given
    value = await json_body(request, 4 * backend.max_value_bytes + 1024)
    scope, writer = AssetScope(name=name), Writer("api", principal.name)
    if conditional:  # a value the store refuses is 400 whatever the preconditions say
        encode_value(key, value, max_value_bytes=backend.max_value_bytes)

    async def write(expected: int | None) -> int:
        return await backend.aset(scope, key, value, expected_version=expected, writer=writer)

    version = await (_conditionally(request, name, key, write) if conditional else write(None))
    status = 201 if version == 1 else 200
    return JSONResponse(
        {"asset": name, "key": key, "version": version},
        status_code=status,
        headers={"ETag": etag(version)},
    )


async def delete_state(request: Request) -> Response:
    principal = await authenticate(request)
    name, key = path_param(request, "name"), path_param(request, "key")
    require(principal.can_write_asset(name), principal, f"write the state of asset {name!r}")
    ctx = ctx_of(request)
    writer = Writer("api", principal.name)

    async def delete(expected: int | None) -> None:
        if expected is None:
            await ctx.backend.adelete(AssetScope(name=name), key, writer=writer)
        elif expected:
            await ctx.controls.adelete_if_version(name, key, expected)
        # 0: conditions that hold for a key that is not set; there is nothing to delete

    if Preconditions.of(request).given:
        await _conditionally(request, name, key, delete)
    else:
        await delete(None)
    return Response(status_code=204)


async def state_entry(request: Request) -> Response:
    """``GET``, ``PUT`` or ``DELETE /assets/{name}/state/{key}`` (one route: one ``Allow``)."""
    handler = {"PUT": put_state, "DELETE": delete_state}.get(request.method, get_state)
    return await handler(request)
