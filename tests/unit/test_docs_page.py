"""The API docs page works offline: Swagger UI and its assets come from the installed package, and the
document it reads is the API's own, told as OpenAPI 3.0 (the bundled Swagger UI 4 reads no 3.1)."""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api_gateway.docs import ASSETS_PATH, DOCS_PATH, OPENAPI_30_PATH, install_docs, openapi_30
from api_gateway.errors import install_error_handlers


def _client() -> TestClient:
    app = FastAPI(title="Docs test", docs_url=None, redoc_url=None)
    install_error_handlers(app)

    @app.get("/v1/things/{thing_id}")
    def get_thing(thing_id: str, label: str | None = None) -> dict[str, str | None]:
        return {"thing_id": thing_id, "label": label}

    install_docs(app)
    return TestClient(app)


def test_docs_page_loads_every_script_and_style_from_the_gateway_itself() -> None:
    page = _client().get(DOCS_PATH)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*["']([^"']+)["']""", page.text)
    assert f"{ASSETS_PATH}/swagger-ui-bundle.js" in urls and f"{ASSETS_PATH}/swagger-ui.css" in urls
    assert OPENAPI_30_PATH in urls
    assert [url for url in urls if "//" in url] == [], "the page must not load anything from another host"


def test_docs_assets_come_from_the_package_with_their_types() -> None:
    client = _client()
    script = client.get(f"{ASSETS_PATH}/swagger-ui-bundle.js")
    style = client.get(f"{ASSETS_PATH}/swagger-ui.css")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert b"SwaggerUIBundle" in script.content
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")


def test_docs_assets_serve_only_the_files_the_page_uses() -> None:
    client = _client()
    for name in ("index.html", "swagger-initializer.js", "..%2F..%2Fswagger_ui_bundle%2F__init__.py"):
        response = client.get(f"{ASSETS_PATH}/{name}")
        assert response.status_code == 404, name
        assert response.json()["error"]["code"] == "not_found"


def test_openapi_document_the_page_reads_is_the_apis_own_told_as_3_0() -> None:
    client = _client()
    original = client.get("/openapi.json").json()
    shown = client.get(OPENAPI_30_PATH).json()
    assert original["openapi"].startswith("3.1") and shown["openapi"] == "3.0.3"
    assert shown["paths"].keys() == original["paths"].keys()
    label = next(p for p in shown["paths"]["/v1/things/{thing_id}"]["get"]["parameters"] if p["name"] == "label")
    assert label["schema"]["anyOf"] == [{"type": "string"}] and label["schema"]["nullable"] is True


def test_openapi_30_rewrites_null_options_and_const_and_nothing_else() -> None:
    document = {
        "openapi": "3.1.0",
        "components": {
            "schemas": {
                "A": {"oneOf": [{"$ref": "#/components/schemas/B"}, {"type": "null"}], "title": "A"},
                "K": {"const": "fixed", "type": "string"},
                "L": {"items": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}]},
            }
        },
    }
    shown = openapi_30(document)
    schemas = shown["components"]["schemas"]
    assert shown["openapi"] == "3.0.3"
    assert schemas["A"] == {"oneOf": [{"$ref": "#/components/schemas/B"}], "nullable": True, "title": "A"}
    assert schemas["K"] == {"enum": ["fixed"], "type": "string"}
    assert schemas["L"] == document["components"]["schemas"]["L"]
    assert document["openapi"] == "3.1.0", "the app's own document is not changed"
