"""A batch input file's lines, checked one by one as OpenAI checks them.

Each non-blank line must be ``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body"}``,
its ``custom_id`` a string no other line of the file has, and its body a Responses create request
``parse_create`` takes (without what only makes sense for one response alone: ``stream``,
``background``, ``previous_response_id``, ``conversation``, ``webhook_url``). A bad line is a
:class:`LineError` (``line`` 1-based, blank lines counted), as OpenAI's ``errors.data`` lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api_gateway.openai.errors import param_of
from api_gateway.openai.requests import ResponseCreate, parse_create
from api_gateway.services.errors import ServiceError
from shared import strict_json

__all__ = ["MAX_CUSTOM_ID", "BatchLine", "LineError", "check_line"]

MAX_CUSTOM_ID = 512
"""The longest ``custom_id``."""
_ALONE_ONLY = ("stream", "background", "previous_response_id", "conversation", "webhook_url")
"""Body fields refused in a batch line: they describe one response served alone."""


@dataclass(frozen=True, slots=True)
class BatchLine:
    """A valid line."""

    number: int
    custom_id: str
    request: ResponseCreate


@dataclass(frozen=True, slots=True)
class LineError:
    """A bad line: what ``errors.data`` of the failed batch says about it."""

    line: int
    code: str
    message: str
    param: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The ``BatchError`` JSON."""
        return {"line": self.line, "code": self.code, "message": self.message, "param": self.param}


def check_line(
    raw: bytes,
    number: int,
    *,
    endpoint: str,
    seen: set[str],
    check_request: Callable[[ResponseCreate], None],
) -> BatchLine | LineError:
    """Check one non-blank line of a batch input file.

    Args:
        raw: the line's bytes.
        number: its line number (1-based).
        endpoint: the batch's ``endpoint``: every line's ``url``.
        seen: the ``custom_id``s of the lines before (this one's is added when it is new).
        check_request: refuses a checked body the deployment cannot serve (an unknown ``model``) by raising
            a ``ServiceError``.

    Returns:
        The line, or what is wrong with it.
    """
    try:
        data = strict_json.loads(raw)
    except ValueError as exc:
        return LineError(number, "invalid_json_line", f"This line is not valid JSON: {exc}")
    if not isinstance(data, dict):
        return LineError(number, "invalid_json_line", "This line is not a JSON object.")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        message = f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters."
        return LineError(number, "missing_custom_id", message, "custom_id")
    if custom_id in seen:
        return LineError(number, "duplicate_custom_id", f"The custom_id {custom_id!r} is used by an earlier line.",
                         "custom_id")  # fmt: skip
    seen.add(custom_id)
    if data.get("method") != "POST":
        return LineError(number, "invalid_method", f"method must be 'POST', not {data.get('method')!r}.", "method")
    if data.get("url") != endpoint:
        message = f"url {data.get('url')!r} does not match the batch's endpoint {endpoint!r}."
        return LineError(number, "invalid_url", message, "url")
    body = data.get("body")
    if not isinstance(body, dict):
        return LineError(number, "invalid_request", "body must be a JSON object (a create request).", "body")
    for name in _ALONE_ONLY:
        if body.get(name) not in (None, False):
            message = f"{name} is not supported in a batch request (each line is one response run alone)."
            return LineError(number, "unsupported_parameter", message, f"body.{name}")
    try:
        request = parse_create(body)
        check_request(request)
    except ServiceError as exc:
        return LineError(number, exc.code, exc.message, _body_param(exc.details))
    return BatchLine(number, custom_id, request)


def _body_param(details: Any) -> str:
    """``body.<param>`` of a refused body, from its first detail's ``loc``."""
    if isinstance(details, list) and details and isinstance(details[0], dict):
        loc = details[0].get("loc")
        if isinstance(loc, list | tuple):
            inner = param_of(loc)
            return "body" if inner is None else f"body.{inner}"
    return "body"
