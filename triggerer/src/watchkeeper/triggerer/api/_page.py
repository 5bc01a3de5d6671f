"""``GET /``: the operator's page, server-rendered HTML; its script and style ship beside it."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

__all__ = ["page"]


async def page(request: Request) -> Response:
    html = files("watchkeeper.triggerer.api").joinpath("static/index.html").read_text("utf-8")
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})
