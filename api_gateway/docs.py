"""The interactive API docs: Swagger UI at ``/docs``, its files served from the installed package.

FastAPI's own ``/docs`` page loads Swagger UI's JavaScript and CSS from a CDN, so it is blank on a
host that cannot reach the internet (and it makes every reader's browser fetch code from a third
party). Here the page is FastAPI's, but its assets come from the ``swagger-ui-bundle`` package under
:data:`ASSETS_PATH` ("Self-hosting JavaScript and CSS for docs" in FastAPI's documentation). ReDoc
has no such package and is off.

That package's newest release carries Swagger UI 4.15, which reads OpenAPI 3.0 only ("Unable to
render this definition") while FastAPI writes 3.1. So the page reads :data:`OPENAPI_30_PATH`, the
same document told as 3.0 (:func:`openapi_30`); ``/openapi.json`` itself stays 3.1, as FastAPI
makes it. A Swagger UI 5 bundle would read ``/openapi.json`` directly.

The page, its assets and ``/openapi.json`` need no API key (they hold nothing private) and get the
gateway's protective headers like every response, without ``Cache-Control: no-store``
(``api_gateway.security_headers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from swagger_ui_bundle import swagger_ui_path

from api_gateway.errors import ApiError

__all__ = ["ASSETS_PATH", "DOCS_PATH", "OPENAPI_30_PATH", "install_docs", "openapi_30"]

DOCS_PATH = "/docs"
"""The Swagger UI page."""
ASSETS_PATH = "/docs-assets"
"""Where the page's JavaScript, CSS and icon are served from."""
OPENAPI_30_PATH = "/docs/openapi-3.0.json"
"""The API's OpenAPI document as 3.0, which the page's Swagger UI reads."""

_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}
"""The package's files the page uses; nothing else in its folder is served."""


def install_docs(app: FastAPI) -> None:
    """Serve the Swagger UI page for ``app``'s OpenAPI document, with its assets from the package.

    ``app`` must be built with ``docs_url=None`` (and ``redoc_url=None``), so FastAPI's CDN page
    does not take the path first.
    """
    assets = Path(swagger_ui_path)
    title = f"{app.title} - API docs"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_30_PATH,
            title=title,
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
        )

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def swagger_asset(name: str) -> FileResponse:
        media_type = _ASSETS.get(name)
        if media_type is None:
            raise ApiError(404, "not_found", f"no docs asset {name!r}")
        return FileResponse(assets / name, media_type=media_type)

    @app.get(OPENAPI_30_PATH, include_in_schema=False)
    async def openapi_document_30() -> JSONResponse:
        return JSONResponse(openapi_30(app.openapi()))


def openapi_30(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (OpenAPI 3.1, as FastAPI writes it) told as OpenAPI 3.0, for Swagger UI 4.

    Only what FastAPI's documents use changes: the version field, ``{"type": "null"}`` among the
    options of an ``anyOf``/``oneOf`` (3.0 says ``nullable: true``) and ``const`` (3.0: a one-value
    ``enum``).
    """
    converted = _to_30(document)
    assert isinstance(converted, dict)
    converted["openapi"] = "3.0.3"
    return converted


_NULL = {"type": "null"}


def _to_30(node: Any) -> Any:
    if isinstance(node, list):
        return [_to_30(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _to_30(value) for key, value in node.items()}
    for key in ("anyOf", "oneOf"):
        options = converted.get(key)
        if isinstance(options, list) and _NULL in options:
            converted[key] = [option for option in options if option != _NULL]
            converted["nullable"] = True
    if "const" in converted:
        converted["enum"] = [converted.pop("const")]
    return converted
