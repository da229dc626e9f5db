"""docs/ is the public contract inside the repository: it names every route, code and model the gateway has."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from api_gateway.app import create_app
from api_gateway.openai.errors import OPENAI_PREFIX
from shared.result import ErrorCode
from shared.settings import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"
_SERVICE_CODES = re.compile(r'(?:NotFound|Conflict)\("([a-z_]+)"|\bcode="([a-z_]+)"')


def _api_text() -> str:
    return (DOCS / "api.md").read_text()


def test_every_route_of_the_gateway_is_documented() -> None:
    # The OpenAI face (/openai/v1) has guides of its own (docs/openai*.md); every other route is in docs/api.md.
    app = create_app(Settings(database_url="sqlite://", api_keys="k:o:u"))
    paths = {(method, route.path) for route in _api_routes(app.routes) for method in route.methods}
    assert ("POST", "/v1/turns") in paths
    text = _api_text()
    openai_text = "".join(path.read_text() for path in sorted(DOCS.glob("openai*.md")))
    undocumented = sorted(
        f"{method} {path}"
        for method, path in paths
        if f"`{method} {path}`" not in (openai_text if path.startswith(OPENAI_PREFIX + "/") else text)
    )
    assert not undocumented, f"routes missing from docs/api.md (docs/openai*.md for /openai/v1): {undocumented}"


def _api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute of ``routes``, inside included routers too (FastAPI keeps an included router whole)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes)
        elif isinstance(route, APIRoute):
            yield route


def test_every_turn_error_code_is_documented() -> None:
    text = _api_text()
    assert not [code.value for code in ErrorCode if f"`{code.value}`" not in text]


def test_every_http_error_code_the_services_raise_is_documented() -> None:
    services = Path(__file__).resolve().parents[2] / "api_gateway" / "services"
    raised = {
        code for path in services.glob("*.py") for codes in _SERVICE_CODES.findall(path.read_text()) for code in codes
    } - {""}
    text = _api_text()
    assert raised and not sorted(code for code in raised if f"`{code}`" not in text)


def test_every_setting_is_documented_in_docs_and_the_readme() -> None:
    from shared.settings import known_variables

    configuration = (DOCS / "configuration.md").read_text()
    readme = (DOCS.parent / "README.md").read_text()
    missing_docs = sorted(name for name in known_variables() if f"`{name}`" not in configuration)
    missing_readme = sorted(name for name in Settings.model_fields if f"APTIX_{name.upper()}" not in readme)
    assert not missing_docs, f"not in docs/configuration.md: {missing_docs}"
    assert not missing_readme, f"not in README.md: {missing_readme}"
