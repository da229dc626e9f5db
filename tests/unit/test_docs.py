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


def test_every_setting_is_documented_in_the_configuration_guide() -> None:
    from shared.settings import known_variables

    configuration = (DOCS / "configuration.md").read_text()
    missing = sorted(name for name in known_variables() if f"`{name}`" not in configuration)
    assert not missing, f"not in docs/configuration.md: {missing}"


# The README is a door (STYLE.md §10): what Aptix is, the two commands, the quick start and a map of
# docs/; each fact lives in one guide, and the tests above read the guide that owns it.

README = DOCS.parent / "README.md"
README_MAX_LINES = 250
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_TABLE = re.compile(r"(?:^\|.*\n?)+", re.MULTILINE)
_SETTING_CELL = re.compile(r"\s*`APTIX_[A-Z0-9_]+`(?:\s*,\s*`APTIX_[A-Z0-9_]+`)*\s*")
_ENDPOINT_CELL = re.compile(r"\s*(?:endpoint\s+)?`(?:GET|POST|PUT|PATCH|DELETE) /[^`]*`.*")


def _guides() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_readme_is_at_most_250_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move what is not the door into a guide"


def test_every_guide_is_on_the_readme_map() -> None:
    linked = {target.split("#", 1)[0] for target in _LINK.findall(README.read_text())}
    missing = sorted(f"docs/{guide.name}" for guide in _guides() if f"docs/{guide.name}" not in linked)
    assert not missing, f"README.md does not link these guides: {missing}"


def test_every_link_between_the_readme_and_the_guides_resolves() -> None:
    # Every relative link of README.md, docs/*.md and deploy/README.md names a file that exists and,
    # when it has one, a heading of that file (GitHub's anchors).
    broken = []
    for source in [README, DOCS.parent / "deploy" / "README.md", *_guides()]:
        for target in _LINK.findall(source.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = (source.parent / path).resolve() if path else source
            if not resolved.exists():
                broken.append(f"{source.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{source.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_only_the_configuration_guide_has_a_settings_table() -> None:
    # A table of settings: one headed "variable" or "setting", or whose rows are mostly setting names.
    found = [
        f"{path.name}: {header}"
        for path in [README, *_guides()]
        if path.name != "configuration.md"
        for header, cells in _tables(path)
        if header.strip().lower() in {"variable", "setting", "settings"} or _mostly(cells, _SETTING_CELL)
    ]
    assert not found, f"settings belong in docs/configuration.md: {found}"


_SETTING_WITH_VALUE = re.compile(r"`(APTIX_[A-Z0-9_]+)`\s*\((?:default\s+)?[0-9]")


def test_only_the_configuration_guide_gives_a_settings_default() -> None:
    # "`APTIX_X` (30)" or "(default 30)" outside docs/configuration.md states its default a second time:
    # name the setting, and link to the guide when the value matters there.
    found = [
        f"{path.relative_to(DOCS.parent)}: {name}"
        for path in [README, DOCS.parent / "deploy" / "README.md", *_guides()]
        if path.name != "configuration.md"
        for name in _SETTING_WITH_VALUE.findall(path.read_text())
    ]
    assert not found, f"a setting's default belongs in docs/configuration.md only: {found}"


def test_only_the_api_guides_have_an_endpoint_table() -> None:
    found = [
        f"{path.name}: {header}"
        for path in [README, *_guides()]
        if path.name not in {"api.md", "openai.md"}
        for header, cells in _tables(path)
        if header.strip().lower() in {"endpoint", "method and path"} or _mostly(cells, _ENDPOINT_CELL)
    ]
    assert not found, f"endpoints belong in docs/api.md (or docs/openai.md): {found}"


def _tables(path: Path) -> list[tuple[str, list[str]]]:
    """Each Markdown table of a file (outside code blocks): its first header cell and its rows' first cells."""
    tables = []
    for table in _TABLE.findall(_FENCE.sub("", path.read_text())):
        first_cells = [line.split("|")[1] for line in table.splitlines()]
        tables.append((first_cells[0], first_cells[2:]))
    return tables


def _mostly(cells: list[str], pattern: re.Pattern[str]) -> bool:
    return len(cells) >= 2 and sum(1 for cell in cells if pattern.fullmatch(cell)) * 2 > len(cells)


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", _FENCE.sub("", path.read_text()), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
