"""Errors under ``/openai/v1`` in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

The services raise the same ``ServiceError``s for both faces; ``api_gateway.errors`` asks
:func:`is_openai_path` which envelope a request gets and builds this one with :func:`openai_error_body`.
The statuses are those the ``openai`` SDK maps to its exception classes: an invalid request is a 400
(``BadRequestError``), not our API's 422.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api_gateway.services.errors import InvalidRequest

__all__ = ["OPENAI_PREFIX", "invalid", "is_openai_path", "openai_error_body", "openai_status", "param_of"]

OPENAI_PREFIX = "/openai/v1"
"""Where the OpenAI face lives on the gateway."""

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
_OUR_CODES = {"quota_exceeded": ("insufficient_quota", "insufficient_quota")}
"""Our codes OpenAI has a (type, code) of its own for: a spent daily token budget is its out-of-quota 429."""


def is_openai_path(path: str) -> bool:
    """Whether a request to ``path`` is answered in OpenAI's error shape."""
    return path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/")


def openai_status(status_code: int, code: str) -> int:
    """The status the OpenAI face answers for one our API would answer ``status_code`` with.

    A body the gateway refuses is 400 there (``invalid_request``, ``webhook_url_not_allowed``, ...),
    as OpenAI answers; every other status stays.
    """
    return 400 if status_code == 422 else status_code


def openai_error_body(status_code: int, code: str, message: str, details: Any = None) -> dict[str, Any]:
    """The error body of the OpenAI face.

    Args:
        status_code: the status it goes out with.
        code: our error code (kept as ``code``, except where OpenAI's SDK knows a better one).
        message: the message.
        details: our ``details`` (pydantic-style ``loc`` entries): the first one's ``loc`` becomes ``param``.

    Returns:
        ``{"error": {"message", "type", "param", "code"}}``.
    """
    kind = _TYPES.get(status_code, "server_error" if status_code >= 500 else "invalid_request_error")
    theirs = _CODES.get(status_code, code)
    if code in _OUR_CODES:
        kind, theirs = _OUR_CODES[code]
    return {"error": {"message": message, "type": kind, "param": _first_param(details), "code": theirs}}


def invalid(message: str, param: Sequence[str | int], *, code: str = "invalid_request") -> InvalidRequest:
    """A refused request field: 400 under ``/openai/v1`` with ``param`` naming it (``input[2].content[0].type``).

    Args:
        message: what is wrong.
        param: the field's path in the body, such as ``("input", 2, "content", 0, "type")``.
        code: the error code.
    """
    return InvalidRequest(message, [{"loc": ["body", *param], "msg": message, "type": "value_error"}], code=code)


def param_of(loc: Sequence[Any]) -> str | None:
    """OpenAI's ``param`` for a pydantic ``loc``: ``["body", "input", 2, "type"]`` is ``input[2].type``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text or None


def _first_param(details: Any) -> str | None:
    if isinstance(details, list) and details and isinstance(details[0], dict):
        loc = details[0].get("loc")
        if isinstance(loc, list | tuple):
            return param_of(loc)
    return None
