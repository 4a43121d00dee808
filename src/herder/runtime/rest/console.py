"""``/ui``: the web console, static files the worker serves (no build step).

``ui/index.html``, ``ui/console.js`` and ``ui/console.css`` ship inside the package; the
page reads the worker's REST API (``/admin/cluster``, ``/connectors?expand=…``,
``/connector-plugins``) every second and acts through Connect's own endpoints (pause,
resume, stop, restart, delete, create after ``…/config/validate``).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from herder.errors import ErrorCode, HerderError

__all__ = ["console_routes"]


class NoSuchFile(HerderError):
    code = ErrorCode.NOT_FOUND
    http_status = 404
    advice = "the console is at /ui"


_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}
_FILES = ("index.html", "console.js", "console.css")


def _file(name: str) -> Response:
    if name not in _FILES:
        raise NoSuchFile(f"the console has no file {name!r}")
    data = resources.files("herder.runtime.rest").joinpath("ui", name).read_bytes()
    suffix = name[name.rfind(".") :]
    return Response(data, media_type=_TYPES[suffix], headers={"cache-control": "no-cache"})


def console_routes() -> APIRouter:
    api = APIRouter(tags=["console"], include_in_schema=False)

    @api.get("/ui")
    async def console() -> Response:
        return _file("index.html")

    @api.get("/ui/")
    async def console_slash() -> Response:
        return RedirectResponse("/ui")

    @api.get("/ui/{name}")
    async def console_file(name: str) -> Response:
        return _file(name)

    return api
