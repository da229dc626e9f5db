"""The error body of the HTTP API: ``{"error": {"code", "message", "details"}}``.

``api_gateway.errors`` builds it; these models describe it (the OpenAPI document's ``ErrorBody``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ErrorBody", "ErrorDetail", "ProblemDetail"]


class ProblemDetail(BaseModel):
    """One problem with a request, pydantic-style: where, what, and its kind."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    loc: list[str | int]
    """Where the problem is: `body`, `query` or `path`, then keys and indexes (`["body", "tools", 0, "name"]`)."""
    msg: str
    """What is wrong there."""
    type: str
    """The kind of problem (`missing`, `string_too_long`, `json_invalid`, `value_error`, ...)."""


class ErrorDetail(BaseModel):
    """The `error` member of an error body."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    code: str
    """The stable error code (`unauthorized`, `not_found`, `session_not_found`, `session_busy`,
    `idempotency_key_reused`, `turn_not_awaiting_tool_results`, `turn_finished`, `request_too_large`,
    `invalid_request`, `unavailable`, ...)."""
    message: str
    """What went wrong, for a person."""
    details: list[ProblemDetail] | dict[str, str] | None = None
    """For `invalid_request`: one entry per problem. For `GET /readyz`'s 503: each check's state (`ok` or
    `down`). Otherwise null."""


class ErrorBody(BaseModel):
    """The one error body of the HTTP API: `{"error": {"code", "message", "details"}}`."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    error: ErrorDetail
    """The error."""
