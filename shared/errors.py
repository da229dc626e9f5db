"""The few real exceptions of Aptix. Expected domain failures are InvokeResult failures, not these.

    AptixError
    ├── ConfigurationError      bad settings or mode catalog, refused at start-up
    ├── LlmError                the Responses API answered with an error or an unusable body
    ├── StateConflict           a concurrent writer changed turn state first
    └── TurnNotRecorded         a message arrived before the gateway's commit of its turn was visible
"""

from __future__ import annotations

__all__ = ["AptixError", "ConfigurationError", "LlmError", "StateConflict", "TurnNotRecorded"]


class AptixError(Exception):
    """Base of every Aptix exception."""


class ConfigurationError(AptixError):
    """Settings or the mode catalog are unusable; the process refuses to start."""


class StateConflict(AptixError):
    """Turn state changed under us (a duplicate delivery raced this one)."""


class TurnNotRecorded(AptixError):
    """The turn's row (or its latest change) is not visible yet: the gateway enqueues before it commits."""


class LlmError(AptixError):
    """The LLM server answered with an error, or with a body we cannot use.

    Attributes:
        status_code: the HTTP status (0 when the request never got an answer).
        code: the provider's error code, when it gave one.
        retryable: whether trying again later may succeed (429 rate limits, 5xx, transport errors).
        retry_after: seconds the server asked us to wait, when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 0,
        code: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after
