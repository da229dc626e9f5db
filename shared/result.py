"""InvokeResult and ErrorCode: the failure model of AGN-027 §5.

Every pipeline step returns an :class:`InvokeResult`. A failure carries a code and a message and
never a value; a success carries a value and never an error.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["ErrorCode", "ErrorInfo", "InvokeResult", "failure", "success"]

T = TypeVar("T")


class ErrorCode(StrEnum):
    """Exactly the documented error codes (ARCHITECTURE.md, Errors). A new code is a contract change."""

    INVALID_REQUEST = "invalid_request"
    SESSION_NOT_FOUND = "session_not_found"
    SESSION_BUSY = "session_busy"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_FAILED = "tool_failed"
    LLM_ERROR = "llm_error"
    LLM_RATE_LIMITED = "llm_rate_limited"
    ITERATION_LIMIT = "iteration_limit"
    CONTINUATION_MISMATCH = "continuation_mismatch"
    CLIENT_TOOL_TIMEOUT = "client_tool_timeout"
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal_error"
    WORKER_LOST = "worker_lost"


class ErrorInfo(BaseModel):
    """What went wrong: a code and a human-readable message."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    code: ErrorCode
    """The failure's stable code."""
    message: str
    """What went wrong, for a person."""


class InvokeResult(BaseModel, Generic[T]):
    """The outcome of a step: ``ok`` with a value, or not ``ok`` with an error."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    ok: bool
    value: T | None = None
    error: ErrorInfo | None = None

    @model_validator(mode="after")
    def _exclusive(self) -> InvokeResult[T]:
        if self.ok and self.error is not None:
            raise ValueError("a successful result carries no error")
        if not self.ok and (self.error is None or self.value is not None):
            raise ValueError("a failed result carries an error and no value")
        return self

    def unwrap(self) -> T:
        """The value of a success (for tests). Raises ValueError on a failure."""
        if not self.ok:
            assert self.error is not None
            raise ValueError(f"{self.error.code}: {self.error.message}")
        assert self.value is not None
        return self.value


def success(value: T) -> InvokeResult[T]:
    """A successful result holding ``value``."""
    return InvokeResult[T](ok=True, value=value)


def failure(code: ErrorCode, message: str) -> InvokeResult[T]:
    """A failed result with ``code`` and ``message``."""
    return InvokeResult[T](ok=False, error=ErrorInfo(code=code, message=message))
