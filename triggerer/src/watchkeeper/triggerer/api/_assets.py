"""Assets and their state: list, detail, and the compare-and-set state routes."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from watchkeeper.store import AssetScope, VersionConflictError
from watchkeeper.store.backend import Writer, require_asset_registry

from .._records import iso
from .._watcher_controls import watcher_rows
from ._base import (
    ApiError,
    authenticate,
    ctx_of,
    entry_json,
    etag,
    forbid,
    parse_etag,
    require,
)
from ._tokens import Principal

__all__ = ["asset_detail", "delete_state", "get_state", "list_assets", "list_state", "put_state"]


async def list_assets(request: Request) -> Response:
    principal = await authenticate(request)
    assets = await require_asset_registry(ctx_of(request).backend).alist_assets()
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
    name = request.path_params["name"]
    require(principal.can_read_asset(name), principal, f"read asset {name!r}")
    return principal, name


async def asset_detail(request: Request) -> Response:
    principal, name = await _asset_principal(request)
    ctx = ctx_of(request)
    found = [a for a in await require_asset_registry(ctx.backend).alist_assets() if a.name == name]
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
    key = request.path_params["key"]
    entry = await ctx_of(request).backend.aget_entry(AssetScope(name=name), key)
    if entry is None:
        raise ApiError(404, "not_found", f"key {key!r} is not set for asset {name!r}")
    return JSONResponse(entry_json(entry), headers={"ETag": etag(entry.version)})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _body_value(request: Request, limit: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > 4 * limit + 1024:
        raise ApiError(
            413, "too_large", f"the body is {declared} bytes; a value is at most {limit}"
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > 4 * limit + 1024:
            raise ApiError(413, "too_large", f"the body is over {4 * limit + 1024} bytes")
    try:
        return json.loads(bytes(body), parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"the body is not a JSON value: {exc}") from None


async def put_state(request: Request) -> Response:
    principal = await authenticate(request)
    name, key = request.path_params["name"], request.path_params["key"]
    require(principal.can_write_asset(name), principal, f"write the state of asset {name!r}")
    backend = ctx_of(request).backend
    expected: int | None = None
    if_match = request.headers.get("if-match")
    if if_match is not None:
        expected = parse_etag(if_match, "If-Match")
    elif request.headers.get("if-none-match", "").strip() == "*":
        expected = 0  # create only
    value = await _body_value(request, backend.max_value_bytes)
    try:
        version = await backend.aset(
            AssetScope(name=name),
            key,
            value,
            expected_version=expected,
            writer=Writer("api", principal.name),
        )
    except VersionConflictError as exc:
        raise _conflict(exc) from None
    status = 201 if version == 1 else 200
    return JSONResponse(
        {"asset": name, "key": key, "version": version},
        status_code=status,
        headers={"ETag": etag(version)},
    )


def _conflict(exc: VersionConflictError) -> ApiError:
    return ApiError(
        412,
        "version_conflict",
        str(exc),
        headers={"ETag": etag(exc.actual)} if exc.actual else None,
        extra={"current_version": exc.actual},
    )


async def delete_state(request: Request) -> Response:
    principal = await authenticate(request)
    name, key = request.path_params["name"], request.path_params["key"]
    require(principal.can_write_asset(name), principal, f"write the state of asset {name!r}")
    backend = ctx_of(request).backend
    scope = AssetScope(name=name)
    if_match = request.headers.get("if-match")
    if if_match is not None:
        expected = parse_etag(if_match, "If-Match")
        try:
            await ctx_of(request).controls.adelete_if_version(name, key, expected)
        except VersionConflictError as exc:
            raise _conflict(exc) from None
    else:
        await backend.adelete(scope, key, writer=Writer("api", principal.name))
    return Response(status_code=204)
